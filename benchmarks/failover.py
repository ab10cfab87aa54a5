"""What a Redis failover costs GPUlayer, beside what it takes Sentinel itself, in the same run.

Each trial: a master, a replica and three sentinels on loopback ports (``_sentinels.py``, a master
declared down after 1 s), an installation made on them through a Sentinel URL (`gpulayer access init
--apply`), two workers under identities of their own (2 slots each, the default 15 s lease), four
jobs running (``sleep 2``) and submits acknowledged by the replica (``GPULAYER_SUBMIT_REPLICAS=1``).
Then the master is killed with SIGKILL and a new job submitted at once (its submit waits through the
failover). Measured from the kill:

* **sentinels**: until a sentinel announces the new master (``+switch-master``): the peer, what no
  client could beat;
* **first new job started**: the new job's attempt started on a worker;
* **interrupted jobs done**: the last of the four running jobs ended (each had about 2 s left);

and whether every job succeeded on its first attempt (nothing lost but the leases renewed late) with
the same worker processes. Before the first trial's kill, what waiting for the replica costs a
submit: ``--submits`` submits one after the other with ``GPULAYER_SUBMIT_REPLICAS`` 0 and 1.

    python benchmarks/failover.py [--trials 3] [--submits 500]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import redis
from _common import median, python, save, spawn
from _sentinels import MASTER, Replicated, start_replicated

from gpulayer import Client, JobState, Settings
from gpulayer import access as accesses


def _gpulayer(home: Path, *args: str) -> str:
    done = subprocess.run(
        [python(), "-m", "gpulayer", *args],
        env={"GPULAYER_HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def _switched(made: Replicated, seen: list[float], ready: threading.Event) -> None:
    """Append the time a sentinel announces the new master."""
    watcher = redis.Redis(port=next(iter(made.sentinels)), socket_timeout=60)
    channel = watcher.pubsub()
    channel.subscribe("+switch-master")
    channel.get_message(timeout=5)  # the subscription's confirmation
    ready.set()
    while not seen:
        message = channel.get_message(timeout=60)
        if message and message["type"] == "message" and message["data"].startswith(MASTER.encode()):
            seen.append(time.time())
    watcher.close()


def submit_ms(admin: Path, replicas: int, submits: int) -> float:
    """Milliseconds per submit, one after the other, waiting for ``replicas`` replicas each."""
    submitter = accesses.load(admin, "submitter")
    assert submitter is not None
    client = Client(access=submitter, settings=Settings(home=admin, submit_replicas=replicas))
    client.submit(["true"])  # connected: not timed
    started = time.perf_counter()
    for _ in range(submits):
        client.submit(["true"])
    spent = (time.perf_counter() - started) / submits * 1000
    client.close()
    return spent


def trial(folder: Path, submits: int = 0) -> dict[str, float | bool]:
    made = start_replicated(folder / "nodes")
    workers = []
    try:
        admin = folder / "admin"
        _gpulayer(admin, "access", "init", "--redis-url", made.url(), "--apply")
        for name in ("w1", "w2"):
            token = _gpulayer(admin, "access", "add", "worker", name)
            command = [python(), "-m", "gpulayer", "worker", "start", "--name", name, "--slots", "2"]
            env = {
                "GPULAYER_HOME": str(folder / name),
                accesses.TOKEN_VARIABLE: token,
                "GPULAYER_LOG_LEVEL": "WARNING",
            }
            workers.append(spawn(command, env=env))
        costs = {f"submit_ms_replicas_{n}": submit_ms(admin, n, submits) for n in (0, 1)} if submits else {}
        submitter = accesses.load(admin, "submitter")
        assert submitter is not None
        client = Client(access=submitter, settings=Settings(home=admin, submit_replicas=1))
        while len(client.workers()) < 2 or client.job_counts()[JobState.QUEUED]:
            time.sleep(0.05)
        running = [client.submit(["sleep", "2"]) for _ in range(4)]
        while not all(job.status().state is JobState.RUNNING for job in running):
            time.sleep(0.01)
        seen: list[float] = []
        ready = threading.Event()
        watching = threading.Thread(target=_switched, args=(made, seen, ready), daemon=True)
        watching.start()
        ready.wait(10)
        killed = time.time()
        made.kill_master()
        # Its one replica is being promoted: a submit waits for no replica now.
        after = Client(access=submitter, settings=Settings(home=admin))
        first = after.submit(["true"])
        records = [job.wait(120) for job in running]
        started = first.wait(120).attempts[0].started_at
        watching.join(60)
        assert started is not None
        assert seen, "no sentinel announced a new master"
        ended = max(_at(record.attempts[-1].ended_at) for record in records)
        outcome = {
            "sentinels_s": seen[0] - killed,
            "first_new_job_started_s": started.timestamp() - killed,
            "interrupted_jobs_done_s": ended - killed,
            "all_first_attempt": all(
                record.state is JobState.SUCCEEDED and len(record.attempts) == 1 for record in records
            ),
            "same_workers": all(worker.poll() is None for worker in workers),
            **costs,
        }
        client.close()
        after.close()
        return outcome
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
        made.stop()


def _at(moment: datetime | None) -> float:
    assert moment is not None
    return moment.timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--submits", type=int, default=500)
    options = parser.parse_args()
    trials = []
    for number in range(options.trials):
        with tempfile.TemporaryDirectory() as tmp:
            trials.append(trial(Path(tmp), options.submits if number == 0 else 0))
        print(f"trial {number + 1}: {trials[-1]}", file=sys.stderr)
    summary = {
        name: median([float(t[name]) for t in trials])
        for name in ("sentinels_s", "first_new_job_started_s", "interrupted_jobs_done_s")
    }
    result = {
        "trials": trials,
        "median": summary,
        "ratio_first_new_job_to_sentinels": summary["first_new_job_started_s"] / summary["sentinels_s"],
        "every_job_first_attempt_same_workers": all(
            t["all_first_attempt"] and t["same_workers"] for t in trials
        ),
    }
    waiting = trials[0].get("submit_ms_replicas_1", 0.0) / trials[0].get("submit_ms_replicas_0", 1.0)
    result["submit_cost_ratio_replicas_1_to_0"] = waiting
    path = save("failover", result)
    print(
        f"sentinels {summary['sentinels_s']:.2f} s; first new job started "
        f"{summary['first_new_job_started_s']:.2f} s ({result['ratio_first_new_job_to_sentinels']:.2f}x); "
        "interrupted jobs done "
        f"{summary['interrupted_jobs_done_s']:.2f} s; every job on its first attempt, same workers: "
        f"{result['every_job_first_attempt_same_workers']}; a submit waiting for the replica costs "
        f"{waiting:.2f}x one that does not -> {path}"
    )


if __name__ == "__main__":
    main()
