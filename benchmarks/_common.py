"""What the benchmarks share: a private redis-server, worker processes, timing and reporting."""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType

import redis

from gpulayer import Client, Settings, access, builds
from gpulayer.installation import Installation
from gpulayer.network import free_port
from gpulayer.server import start_redis, wait_ready
from gpulayer.store.stores import Stores

# The newest Redis here, as the recorded results had (unless GPULAYER_REDIS_SERVER names another):
# a Valkey beside it (the dev extra's) would be the newest.
builds.pin_newest_redis()

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
#: The identity records of each private installation's registry, by its Redis URL: what a flush puts back.
_REGISTRIES: dict[str, dict[str, str]] = {}


@contextmanager
def private_redis(folder: Path) -> Iterator[str]:
    """A redis-server on a free port with no persistence, for this run only."""
    port = free_port()
    process = start_redis(folder / "redis", port, durable=False)
    url = f"redis://127.0.0.1:{port}/0"
    wait_ready(url, process)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(10)


@contextmanager
def private_installation() -> Iterator[tuple[str, Path]]:
    """A private Redis and a GPUlayer home in a temporary folder, holding the keys jobs are signed
    and checked with, and a worker identity (``bench``) in its registry (the client and the workers use
    the URL given, Redis's default user: the roles' users cost nothing per command, and the benchmarks
    measure the queue)."""
    with tempfile.TemporaryDirectory() as tmp, private_redis(Path(tmp)) as url:
        home = Path(tmp) / "home"
        made, worker = Installation.generate("gpulayer", url).enrol("worker", "bench")
        access.save(home, access.Access(role="admin", redis_url=url, keys=made.keys))
        access.save(home, worker.with_url(url))
        _REGISTRIES[url] = {name: kept.signed for name, kept in made.identities.items()}
        flush(url)
        yield url, home


def flush(url: str) -> None:
    """An empty Redis, but for the identity records of the installation on it."""
    connection = redis.Redis.from_url(url)
    connection.flushall()
    if url in _REGISTRIES:
        Stores.open(connection, Settings()).registry.publish(_REGISTRIES[url])
    connection.close()


#: What :func:`spawn` started: a run that fails midway still ends its workers (:func:`_end_spawned`),
#: which would otherwise retry their vanished Redis for ever.
_SPAWNED: list[subprocess.Popen[bytes]] = []


def spawn(command: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        list(command),
        env={**os.environ, "PYTHONPATH": str(HERE), **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _SPAWNED.append(process)
    return process


@atexit.register
def _end_spawned() -> None:
    running = [process for process in _SPAWNED if process.poll() is None]
    for process in running:
        process.kill()
    for process in running:
        process.wait()


def registered(client: Client, count: int, timeout: float = 30) -> None:
    """Return once ``count`` workers have registered; RuntimeError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while len(client.workers()) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not register")
        time.sleep(0.05)


def wait_all(processes: Sequence[subprocess.Popen[bytes]], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        process.wait(max(1.0, deadline - time.monotonic()))


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def machine() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }


def save(name: str, result: dict[str, object]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **result}, indent=2) + "\n")
    return path


def python() -> str:
    return sys.executable


def gpulayer_worker(url: str, name: str, slots: int, *extra: str) -> list[str]:
    """The command of a GPUlayer worker logging at WARNING, as every benchmark runs it."""
    return [python(), "-m", "gpulayer", "worker", "start", "--redis-url", url, "--name", name,
            "--slots", str(slots), "--log-level", "WARNING", *extra]  # fmt: skip


def rq_worker(url: str, worker_class: str, *extra: str, queue: str = "bench") -> list[str]:
    """The command of a plain RQ worker logging at WARNING."""
    return [python(), "-m", "rq.cli", "worker", "--url", url, "-w", worker_class,
            "--logging_level", "WARNING", *extra, queue]  # fmt: skip


def stop(process: subprocess.Popen[bytes], *, peer: bool = False) -> None:
    """SIGTERM a worker and wait for it to exit. A ``peer``'s worker that has not within 10 s is
    killed, saying so; GPUlayer's must exit. RQ 2.12's worker, with redis-py 8.2, may take up to a
    minute: it unsubscribes its pub/sub thread, which then waits up to its 60 s poll for a new
    subscription, and redis-py's ``PubSubWorkerThread.stop()`` now joins it (one exit in eight
    here, 2026-12-04); a peer that hangs on its way out must not throw away the run's figures."""
    grace = 10 if peer else 30
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        if not peer:
            raise
        print(f"(killed the peer's worker {process.pid}: no exit {grace} s after SIGTERM)", file=sys.stderr)
        process.kill()
        process.wait()


def dramatiq_tasks_on(url: str) -> ModuleType | None:
    """benchmarks/dramatiq_tasks.py with its broker on the (flushed) Redis at ``url``; None where
    Dramatiq is not installed (``pip install -r benchmarks/requirements.txt``)."""
    if importlib.util.find_spec("dramatiq") is None:
        return None
    flush(url)
    os.environ["BENCH_REDIS_URL"] = url
    return importlib.import_module("dramatiq_tasks")


def dramatiq_workers(url: str) -> subprocess.Popen[bytes]:
    """Dramatiq's workers for those tasks, 2 processes x 4 threads, once they have had time to start."""
    command = [python(), "-m", "dramatiq", "dramatiq_tasks", "--processes", "2", "--threads", "4"]
    workers = spawn(command, env={"BENCH_REDIS_URL": url})
    time.sleep(5)  # Dramatiq's workers say nothing when ready: give them time to start.
    return workers
