"""Capacity on demand: the autoscaler starts machines of the simulated provider (real worker processes
with simulated GPUs, each under an identity of its own) for jobs no connected worker could ever run,
and stops them once idle; a real redis-server, the autoscaler in its own Redis role."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from redis.exceptions import NoPermissionError

from gpulayer import Client, JobState
from gpulayer.capacity import Autoscaler, CapacityConfig, load
from gpulayer.capacity.demand import unmet
from gpulayer.capacity.provider import MachineKind
from gpulayer.installation import Installation
from gpulayer.requirements import Requirements
from gpulayer.store import acl
from gpulayer.store.keys import Keys
from tests.conftest import Hub, enrol, wait_for

A100 = {"accelerator": "cuda", "gpu_model": "NVIDIA A100-SXM4-80GB", "gpu_memory": "80GiB", "cpus": 2}
KINDS = [
    {"name": "a100x1", "gpus": 1, "price_per_hour": 1.5, "boot_seconds": 0, **A100},
    {"name": "a100x2", "gpus": 2, "price_per_hour": 3.0, "boot_seconds": 0, **A100},
    {"name": "a100x4", "gpus": 4, "price_per_hour": 6.0, "boot_seconds": 0, **A100},
]


class Enroller:
    """Worker identities made and revoked on the test's Redis, as `access add` and `revoke` do."""

    def __init__(self, installation: Installation) -> None:
        self.installation = installation
        self.made: list[str] = []

    def add(self, name: str) -> str:
        self.made.append(name)
        return enrol(self.installation, "worker", name).token()

    def revoke(self, name: str) -> None:
        keys = Keys(self.installation.prefix)
        admin = redis.Redis.from_url(self.installation.url("admin"))
        acl.remove(admin, [acl.identity_user(keys, name)])
        admin.hdel(keys.identities, name)
        admin.close()


class Running:
    """Autoscalers in threads of this test, each as the autoscaler's own identity."""

    def __init__(self, installation: Installation, folder: Path) -> None:
        self.installation = installation
        self.folder = folder
        self.enroller = Enroller(installation)
        self.threads: list[tuple[threading.Event, threading.Thread]] = []
        self.access = enrol(installation, "capacity", "autoscaler")

    def start(self, provider: dict[str, Any] | None = None, **settings: Any) -> Autoscaler:
        """An autoscaler of one provider, ``sim``: simulated, or of the ``type`` ``provider`` names."""
        provider = provider or {}
        options: dict[str, Any] = {"kinds": KINDS, **provider}
        if provider.get("type", "simulated") == "simulated":
            options = {"type": "simulated", "folder": str(self.folder), **options}
            options.setdefault("env", {"GPULAYER_KILL_GRACE_SECONDS": "2"})
        config = CapacityConfig.model_validate(
            {"idle_timeout": 1, "join_timeout": 30, "interval": 0.1, "lead_ttl": 2, **settings}
            | {"providers": {"sim": options}}
        )
        providers = {name: load(name, config.provider_options(name)) for name in config.providers}
        scaler = Autoscaler.connect(self.access, "gpulayer", providers, self.enroller, config)
        stop = threading.Event()
        thread = threading.Thread(target=scaler.run, args=(stop,), daemon=True)
        thread.start()
        self.threads.append((stop, thread))
        return scaler

    def stop(self) -> None:
        for stop, thread in self.threads:
            stop.set()
            thread.join(10)
            assert not thread.is_alive(), "the autoscaler did not stop"
        self.threads.clear()


@pytest.fixture
def autoscalers(session_hub: Hub, redis_url: str, tmp_path: Path) -> Iterator[Running]:
    running = Running(session_hub.installation, tmp_path / "machines")
    yield running
    running.stop()
    for process in psutil.process_iter(["cmdline"]):  # any machine a failed test left running
        with contextlib.suppress(psutil.Error):
            if str(tmp_path) in " ".join(process.info["cmdline"] or []) or _home_in(process, tmp_path):
                process.kill()


def _home_in(process: psutil.Process, folder: Path) -> bool:
    return str(folder) in process.environ().get("GPULAYER_HOME", "")


def _ended(client: Client) -> bool:
    machines = client.machines()
    return bool(machines) and all(not machine.live for machine in machines)


def test_jobs_no_worker_fits_start_exactly_the_machines_needed_which_stop_once_idle(
    client: Client, autoscalers: Running, raw_redis: redis.Redis, cli: Any
) -> None:
    autoscalers.start(limits={"machines": 4})
    jobs = [client.submit(["python3", "-c", "import time; time.sleep(1)"], gpus=1) for _ in range(2)]
    for job in jobs:
        assert job.wait(60).state is JobState.SUCCEEDED
    machines = client.machines()
    # Two one-GPU jobs: two of the cheapest kind that fits, no more.
    assert sorted(machine.kind for machine in machines) == ["a100x1", "a100x1"]
    assert {job.status().worker for job in jobs} <= {machine.name for machine in machines}
    # A started machine holds its own worker token, and nothing of the autoscaler's.
    for machine in machines:
        home = autoscalers.folder / machine.name / "home"
        assert sorted(path.name for path in (home / "access").iterdir()) == ["worker.json"]
    wait_for(lambda: _ended(client), timeout=30, what="the idle machines to stop")
    for machine in client.machines():
        assert machine.state == "stopped"
        assert machine.reason == "idle for 1 s"
        assert machine.cost(machine.ended) is not None  # type: ignore[arg-type]
    listing = cli("capacity").output
    assert listing.count("  stopped  a100x1 on sim  ") == 2
    assert listing.count("  idle for 1 s") == 2
    assert not raw_redis.hgetall(Keys("gpulayer").identities).keys() & {
        name.encode() for name in autoscalers.enroller.made
    }, "a stopped machine's identity is revoked"
    wait_for(lambda: not client.workers(), what="the machines' workers to leave")


def test_a_gang_of_two_nodes_of_two_gpus_starts_two_machines_together(
    client: Client, autoscalers: Running
) -> None:
    autoscalers.start(limits={"machines": 3})
    job = client.submit(["true"], nodes=2, gpus=2)
    assert job.wait(60).state is JobState.SUCCEEDED
    machines = client.machines()
    assert sorted(machine.kind for machine in machines) == ["a100x2", "a100x2"]
    assert {machine.wanted_by for machine in machines} == {f"gang:{job.id}"}
    assert abs((machines[0].created - machines[1].created).total_seconds()) < 1


def test_a_provider_failure_is_a_reason_not_a_crash_and_why_says_it(
    client: Client, autoscalers: Running, cli: Any
) -> None:
    autoscalers.start({"fail_start": True}, retry_after=60)
    job = client.submit(["true"], gpus=1)
    wait_for(lambda: job.capacity() is not None, what="a decision")
    decision = job.capacity()
    assert decision is not None
    assert decision.text == (
        "provider sim failed to start a worker of kind a100x1: simulated failure (fail_start); "
        "trying again in 1 min"
    )
    [machine] = client.machines()
    assert machine.state == "failed"
    assert "capacity: provider sim failed" in cli("why", job.id).output
    big = client.submit(["true"], gpus=8, gpu_name="A100")
    # The provider rests after its failure: its kinds are offered again after retry_after.
    wait_for(lambda: big.capacity() is not None, what="a decision on the big job")
    assert all(thread.is_alive() for _, thread in autoscalers.threads)
    assert len(client.machines()) == 1


def test_no_provider_offers_eight_gpus_says_the_largest() -> None:
    kinds = [("sim", MachineKind.model_validate(kind)) for kind in KINDS]
    assert unmet(Requirements(gpus=8, gpu_name="H100"), kinds) == "no provider offers 8 H100s (largest: 0)"
    assert unmet(Requirements(gpus=8, gpu_name="A100"), kinds) == "no provider offers 8 A100s (largest: 4)"
    assert unmet(Requirements(gpus=1, gpu_memory=100 * 10**9), kinds) == (
        "no provider offers 1 GPU of 100 GB (largest: 0)"
    )


def test_the_unmet_decision_ends_submit_wait_for_capacity(
    client: Client, autoscalers: Running, cli: Any
) -> None:
    autoscalers.start()
    result = cli("submit", "--gpus", "8", "--gpu-name", "A100", "--wait-for-capacity", "--", "true")
    assert result.exit_code == 1
    assert "no provider offers 8 A100s (largest: 4)" in result.output
    assert client.machines() == []


def test_a_machine_that_never_joins_is_stopped_saying_why(client: Client, autoscalers: Running) -> None:
    autoscalers.start({"never_join": True}, join_timeout=1)
    client.submit(["true"], gpus=1)
    wait_for(lambda: _ended(client), what="the machine to be stopped")
    [machine] = client.machines()
    assert machine.state == "failed"
    assert machine.reason == "its worker did not join within 1 s"


def test_a_restarted_autoscaler_finds_its_machines_and_starts_no_duplicate(
    client: Client, autoscalers: Running
) -> None:
    autoscalers.start({"boot_delay": 3})
    job = client.submit(["true"], gpus=1)
    wait_for(lambda: job.capacity() is not None, what="a decision")
    why = job.why().capacity or ""
    assert why.startswith("starting a worker of kind a100x1 on provider sim") or why.startswith("waiting for")
    autoscalers.stop()  # while the machine boots
    autoscalers.start({"boot_delay": 3})  # a new process's provider: the machine is not its child
    assert job.wait(60).state is JobState.SUCCEEDED
    [machine] = client.machines()
    assert job.status().worker == machine.name
    wait_for(lambda: _ended(client), what="the machine to stop once idle")
    assert client.machines()[0].state == "stopped"


def test_the_autoscalers_role_reads_the_installation_and_writes_its_own_keys_only(
    autoscalers: Running, raw_redis: redis.Redis
) -> None:
    if acl.server_major(raw_redis) < 7:
        pytest.skip("Redis 6.2 has no read-only key patterns")
    keys = Keys("gpulayer")
    own = redis.Redis.from_url(autoscalers.access.redis_url)
    own.hset(keys.capacity_machines, "m", "{}")
    own.hgetall(keys.queues)
    for write in (
        lambda: own.hset(keys.job("x"), "gl_state", "queued"),
        lambda: own.rpush(keys.queue("gpulayer:default"), "x"),
        lambda: own.publish(keys.events, "{}"),
        lambda: own.hset(keys.identities, "x", "{}"),
    ):
        with pytest.raises(NoPermissionError):
            write()
    own.close()
