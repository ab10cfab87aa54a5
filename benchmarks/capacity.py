"""Capacity on demand: from the submit of a job no connected worker could ever run until it runs on
a machine the simulated provider started (boot delay 0), split into the autoscaler's own latency
(submit until it asked the provider for a machine) and the machine's (a worker process starting,
registering, and claiming the job).

Each trial: an empty installation, an autoscaler in this process (woken by the submit), one 1-GPU
job; the machine is stopped after the trial. Target: the autoscaler's own latency at most 1 s.

    python benchmarks/capacity.py [--trials 10]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import redis
from _common import flush, median, percentile, private_redis, save

from gpulayer import Client, JobState, Settings
from gpulayer.access import Access
from gpulayer.capacity import Autoscaler, CapacityConfig, load
from gpulayer.installation import Installation
from gpulayer.store.keys import Keys

KIND = {"name": "a100", "accelerator": "cuda", "gpus": 1, "gpu_memory": "80GiB", "boot_seconds": 0}


class Enroller:
    """Worker identities in the private Redis's registry (its default user: no ACL users here)."""

    def __init__(self, installation: Installation, url: str) -> None:
        self.installation, self.url = installation, url

    def add(self, name: str) -> str:
        self.installation, access = self.installation.enrol("worker", name)
        connection = redis.Redis.from_url(self.url)
        connection.hset(Keys("gpulayer").identities, name, self.installation.identities[name].signed)
        connection.close()
        return access.with_url(self.url).token()

    def revoke(self, name: str) -> None:
        connection = redis.Redis.from_url(self.url)
        connection.hdel(Keys("gpulayer").identities, name)
        connection.close()


def trial(client: Client, scaler: Autoscaler) -> tuple[float, float]:
    """Seconds from submit until the autoscaler asked for a machine, and until the job ran."""
    begun = time.time()
    job = client.submit(["true"], gpus=1)
    while not client.machines():
        time.sleep(0.002)
    asked = client.machines()[0].created.timestamp() - begun
    record = job.wait(60)
    assert record.state is JobState.SUCCEEDED, record
    assert record.started_at is not None
    return asked, record.started_at.timestamp() - begun


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10)
    trials = parser.parse_args().trials
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp)) as url:
        installation = Installation.generate("gpulayer", url)
        admin = Access(role="admin", redis_url=url, keys=installation.keys)
        client = Client(settings=Settings(home=Path(tmp) / "home"), access=admin)
        options = {"type": "simulated", "kinds": [KIND], "folder": str(Path(tmp) / "machines")}
        config = CapacityConfig.model_validate(
            {"idle_timeout": 0.2, "interval": 1.0, "providers": {"sim": options}}
        )
        asked, running = [], []
        for _ in range(trials):
            flush(url)
            scaler = Autoscaler.connect(
                Access(role="capacity", redis_url=url),
                "gpulayer",
                {"sim": load("sim", config.provider_options("sim"))},
                Enroller(installation, url),
                config,
            )
            stop = threading.Event()
            thread = threading.Thread(target=scaler.run, args=(stop,))
            thread.start()
            time.sleep(0.3)  # subscribed, and its first turn over: the submit is what wakes it
            try:
                first, whole = trial(client, scaler)
                asked.append(first)
                running.append(whole)
                while any(machine.live for machine in client.machines()):
                    time.sleep(0.05)  # stopped once idle
            finally:
                stop.set()
                thread.join()
        client.close()
    result = {
        "trials": trials,
        "autoscaler_latency_s": {"median": median(asked), "p90": percentile(asked, 0.9)},
        "submit_to_running_s": {"median": median(running), "p90": percentile(running, 0.9)},
        "target_autoscaler_latency_s": 1.0,
    }
    print(result)
    print(save("capacity", result))


if __name__ == "__main__":
    main()
