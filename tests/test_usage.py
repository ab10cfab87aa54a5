"""What a job used, measured by its worker and kept on its record: a command's CPU time and peak
memory, a call's own share of a warm executor, how a garbled value reads, and the processes each
worker's telemetry counts."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import redis
from click.testing import Result
from flask.testing import FlaskClient

import gpulayer as gl
from gpulayer import Client, JobState
from gpulayer.inventory import GPU
from gpulayer.service import Service
from gpulayer.worker.usage import GpuMemory

from .conftest import Workers, auth, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

MiB = 2**20
#: A command that holds 150 MiB (written, so resident) and burns half a second of CPU.
HUNGRY = (
    "import time\n"
    "data = b'x' * (150 << 20)\n"
    "start = time.process_time()\n"
    "while time.process_time() - start < 0.5:\n"
    "    pass\n"
)


def burn(cpu: float, megabytes: int) -> int:
    """Hold ``megabytes`` for a moment and burn ``cpu`` seconds of CPU; the executor's pid."""
    data = b"x" * (megabytes << 20)
    start = time.process_time()
    while time.process_time() - start < cpu:
        pass
    del data
    return os.getpid()


def test_a_commands_cpu_time_and_peak_memory_are_on_its_record_status_and_api(
    client: Client,
    workers: Workers,
    cli: Callable[..., Result],
    http: FlaskClient,
    tokens: dict[str, str],
) -> None:
    workers.start("w1", 1)
    job = client.submit([sys.executable, "-c", HUNGRY])
    record = job.wait(60)
    assert record.state is JobState.SUCCEEDED
    usage = record.usage
    assert usage is not None
    assert 0.5 <= usage.cpu_seconds < 20
    assert usage.peak_memory is not None
    assert 150 * MiB <= usage.peak_memory < 1024 * MiB
    assert usage.peak_gpu_memory is None  # no GPU
    assert record.attempts[-1].usage == usage

    shown = json.loads(cli("status", job.id, "--json").output)
    assert shown["usage"] == usage.model_dump(mode="json")
    assert re.search(
        r"^usage: +\d+\.\d\d s CPU, peak memory 1\d\d\.\d MiB$", cli("status", job.id).output, re.M
    )
    api = http.get(f"/api/v1/jobs/{job.id}", headers=auth(tokens["viewer"])).json
    assert api is not None
    assert api["usage"] == shown["usage"]
    assert api["attempts"][-1]["usage"] == shown["usage"]


def test_a_call_on_a_warm_executor_records_its_own_cpu_not_the_executors(
    client: Client, workers: Workers, tmp_path: Path
) -> None:
    workers.start("w1", 1)
    (tmp_path / "README").write_text("a code bundle\n")
    remote = gl.remote(burn, client=client, source=tmp_path)
    first = remote.remote(1.0, 200)
    second = remote.remote(0.2, 0)
    assert first.result(timeout=60) == second.result(timeout=60), "both calls ran in one warm executor"
    big, small = first.status().usage, second.status().usage
    assert big is not None
    assert small is not None
    assert big.cpu_seconds >= 1.0
    # The second call's CPU is its own: the first call's second (and the executor's start) are not in it.
    assert 0.2 <= small.cpu_seconds < big.cpu_seconds - 0.5
    # Its peak is its own too (the executor's peak is reset as each call begins), on Linux.
    assert big.peak_memory is not None
    assert big.peak_memory >= 200 * MiB
    assert small.peak_memory is not None
    assert small.peak_memory < big.peak_memory - 100 * MiB


def test_a_garbled_usage_reads_as_unknown_and_the_rest_of_the_record_still_reads(
    client: Client, workers: Workers, raw_redis: redis.Redis
) -> None:
    workers.start("w1", 1)
    job = client.submit(["true"])
    assert job.wait(30).state is JobState.SUCCEEDED
    key = client.keys.job(job.id)
    attempts: list[dict[str, Any]] = json.loads(raw_redis.hget(key, "gl_attempts") or b"[]")
    assert attempts[-1]["usage"]["cpu_seconds"] >= 0
    attempts[-1]["usage"] = {"cpu_seconds": "lots"}
    raw_redis.hset(key, mapping={"gl_usage": '{"cpu_seconds": -1}', "gl_attempts": json.dumps(attempts)})
    record = job.status()
    assert record.usage is None
    assert record.corrupt == "unreadable gl_usage"
    assert record.state is JobState.SUCCEEDED
    assert [(a.attempt, a.outcome, a.usage) for a in record.attempts] == [(1, "succeeded", None)]


def test_a_retried_job_keeps_each_attempts_usage_and_shows_the_latest(
    client: Client, workers: Workers
) -> None:
    workers.start("w1", 1)
    job = client.submit(
        [sys.executable, "-c", "import os, sys; sys.exit(0 if os.environ['GPULAYER_ATTEMPT'] == '2' else 3)"],
        retries=1,
        retry_on="exit",
        retry_delay=0,
    )
    record = job.wait(60)
    assert record.state is JobState.SUCCEEDED
    assert [a.outcome for a in record.attempts] == ["failed", "succeeded"]
    assert all(a.usage is not None and a.usage.peak_memory for a in record.attempts)
    assert record.usage == record.attempts[-1].usage


def test_each_workers_telemetry_counts_the_processes_its_jobs_run(client: Client, workers: Workers) -> None:
    workers.env["GPULAYER_TELEMETRY_INTERVAL"] = "0.2"
    workers.start("w1", 1)
    job = client.submit(["sh", "-c", "sleep 60 & sleep 60 & wait"])

    def counted() -> int | None:
        samples = Service(client).telemetry(60).get("w1", [])
        return samples[-1].task_processes if samples else None

    wait_for(lambda: counted() == 3, what="a sample counting the shell and its two sleeps")
    job.cancel()
    wait_for(lambda: counted() == 0, what="a sample once the job's processes are gone")


def test_a_gang_jobs_usage_adds_up_its_nodes_cpu_and_keeps_the_largest_nodes_peak(
    client: Client, workers: Workers
) -> None:
    workers.start("ga", 1)
    workers.start("gb", 1)
    # Rank 1 holds 150 MiB, rank 0 80 MiB; each burns 0.3 s of CPU.
    text = (
        "import os, time\n"
        "data = b'x' * ((150 if os.environ['RANK'] == '1' else 80) << 20)\n"
        "start = time.process_time()\n"
        "while time.process_time() - start < 0.3:\n"
        "    pass\n"
    )
    record = client.submit([sys.executable, "-c", text], nodes=2).wait(60)
    assert record.state is JobState.SUCCEEDED
    usage = record.usage
    assert usage is not None
    assert usage.cpu_seconds >= 0.6
    assert usage.peak_memory is not None
    assert 150 * MiB <= usage.peak_memory < 220 * MiB  # the larger node's, not both added up
    assert record.attempts[-1].usage == usage


def test_a_job_on_simulated_gpus_has_no_peak_gpu_memory(client: Client, workers: Workers) -> None:
    workers.start("fake", 1, "--fake-gpus", json.dumps([{"name": "NVIDIA A100", "memory_gb": 80}]))
    record = client.submit(["sleep", "1.2"], gpus=1).wait(30)
    assert record.state is JobState.SUCCEEDED
    assert record.usage is not None
    assert record.usage.peak_gpu_memory is None
    assert record.usage.peak_memory is not None
    fake = GPU(index=0, kind="cuda", name="A100", uuid="GPU-fake", memory_total=80 << 30, simulated=True)
    assert GpuMemory.open([fake]) is None


def test_gpu_memory_counts_only_the_jobs_processes_on_the_jobs_gpus() -> None:
    """NVML's answer per GPU, as pynvml gives it (pure logic: no GPU here)."""

    class NVMLError(Exception):
        pass

    seen = {
        "gpu0": [
            types.SimpleNamespace(pid=10, usedGpuMemory=3 * MiB),
            types.SimpleNamespace(pid=99, usedGpuMemory=MiB),
        ],
        "gpu1": [
            types.SimpleNamespace(pid=11, usedGpuMemory=None),
            types.SimpleNamespace(pid=12, usedGpuMemory=5 * MiB),
        ],
    }

    def processes(handle: str) -> list[types.SimpleNamespace]:
        if handle == "lost":
            raise NVMLError("GPU is lost")
        return seen[handle]

    nvml = types.SimpleNamespace(NVMLError=NVMLError, nvmlDeviceGetComputeRunningProcesses=processes)
    gauge = GpuMemory(nvml, {0: "gpu0", 1: "gpu1", 2: "lost"})
    assert gauge.used([0, 1], {10, 11, 12}) == 8 * MiB  # not pid 99, another job's
    assert gauge.used([0], {12}) == 0  # pid 12 holds memory on GPU 1 only
    assert gauge.used([2], {10}) is None  # nothing could be read
    assert gauge.used([1, 2], {12}) == 5 * MiB
