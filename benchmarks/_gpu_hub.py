"""The embedded GPUlayer validate_gpu.py's checks run on, and what they share: the GPU under test
(:class:`Target`), a check's :class:`Outcome`, and reading what a job reported.

:class:`Hub` is `gpulayer up` with a private GPULAYER_HOME, its worker offering the GPU under test
alone, so that a second one-GPU job has to wait for the first. Its jobs run ``_gpu_job.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil
from _gpu_job import MARK
from _nvidia_smi import SmiGpu

from gpulayer import access as accesses
from gpulayer import home as local
from gpulayer.client import Client
from gpulayer.job import Job
from gpulayer.models import JobRecord, JobState
from gpulayer.network import free_port
from gpulayer.settings import Settings

HERE = Path(__file__).resolve().parent
JOB = HERE / "_gpu_job.py"
WORKER = "gpu-validate"
ENDED = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT}

Status = Literal["pass", "fail", "not supported"]


@dataclass
class Outcome:
    status: Status
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def judged(problems: list[str], passed: str, data: dict[str, Any]) -> Outcome:
    """A pass saying ``passed`` when there is no problem, else a fail naming every one."""
    return Outcome("fail", "; ".join(problems), data) if problems else Outcome("pass", passed, data)


@dataclass(frozen=True)
class Target:
    """The GPU under test and how to reach it. A rehearsal runs every check on the CPU against a
    simulated GPU: it tries the checks themselves, and proves nothing about GPUs."""

    gpu: SmiGpu
    smi: list[SmiGpu]
    device: Literal["cuda", "cpu"] = "cuda"
    worker_env: dict[str, str] = field(default_factory=dict)

    @property
    def rehearsal(self) -> bool:
        return self.device != "cuda"

    def visible(self) -> dict[str, str]:
        """The environment that shows a process the GPU under test alone, as the worker numbers it."""
        return {"CUDA_VISIBLE_DEVICES": str(self.gpu.index), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def rehearsal_target() -> Target:
    gpu = SmiGpu(
        0,
        "NVIDIA H200 (simulated)",
        "GPU-5e7a1c0d-0000-4000-8000-rehearsal000",
        143360,
        None,
        "00000000:19:00.0",
    )
    fake = [{"name": gpu.name, "memory_gb": 140, "uuid": gpu.uuid, "pci_bus_id": gpu.pci_bus_id}]
    return Target(gpu, [gpu], "cpu", {"GPULAYER_FAKE_GPUS": json.dumps(fake)})


class HubDown(Exception):
    """The embedded GPUlayer did not come up, so a check that needs it cannot run."""


class Hub:
    """`gpulayer up` in a folder of its own, the admin's client on it, and the jobs checks submit."""

    def __init__(self, target: Target, folder: Path) -> None:
        self.target = target
        self.home = folder / "home"
        self.web_port = free_port()
        self.env = {name: value for name, value in os.environ.items() if not name.startswith("GPULAYER_")}
        # One telemetry sample a second, so that utilisation shows within the check's seconds.
        self.env.update(GPULAYER_HOME=str(self.home), GPULAYER_TELEMETRY_INTERVAL="1")
        self.env.update(GPULAYER_KILL_GRACE_SECONDS="2", **target.worker_env)
        self._client: Client | None = None
        self.jobs: list[Job] = []
        self.pids: list[int] = []

    def gpulayer(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpulayer", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    @property
    def client(self) -> Client:
        if self._client is None:
            raise HubDown("no GPUlayer to run it on: `gpulayer up` did not succeed")
        return self._client

    def submit(self, *args: str, **options: Any) -> Job:
        """A job running ``_gpu_job.py ARGS`` on the worker's Python, never retried."""
        job = self.client.submit([sys.executable, JOB.name, *args], inputs=[JOB], retries=0, **options)
        self.jobs.append(job)
        return job

    @property
    def running(self) -> bool:
        return self._client is not None

    def tidy(self) -> None:
        """Cancel what a check left running, so that the next one finds the GPU free."""
        left = [job for job in self.jobs if job.status().state not in ENDED]
        for job in left:
            job.cancel()
        wait_for(lambda: all(job.status().state in ENDED for job in left), 30)
        self.jobs.clear()

    def up(self, timeout: float) -> Outcome:
        index = str(self.target.gpu.index)
        options = ["--name", WORKER, "--gpus", index, "--slots", "4", "--web-port", str(self.web_port)]
        try:
            done = self.gpulayer("up", *options, timeout=timeout)
        finally:
            # What it started, even when it did not finish starting: `down` stops those.
            state = local.load(self.home)
            self.pids = (
                [pid for pid in (state.redis_pid, state.worker_pid, state.web_pid) if pid] if state else []
            )
        if done.returncode != 0:
            return Outcome(
                "fail",
                f"gpulayer up exited {done.returncode}: {tail(done.stderr + done.stdout)}",
                {"worker_log": self.worker_log()},
            )
        client = Client(settings=Settings.from_env(self.env), access=accesses.load(self.home, "admin"))
        self._client = client
        mine = [worker for worker in client.workers() if worker.name == WORKER]
        if not mine:
            return Outcome("fail", f"gpulayer up succeeded, but no worker {WORKER} is connected")
        worker = mine[0]
        offered = [(gpu.uuid, gpu.simulated) for gpu in worker.gpus]
        data = {"worker": worker.model_dump(mode="json", exclude={"frameworks"}), "web_port": self.web_port}
        problems = (
            []
            if offered == [(self.target.gpu.uuid, self.target.rehearsal)]
            else [f"the worker offers {offered}, not GPU {index} ({self.target.gpu.uuid})"]
        )
        return judged(problems, f"worker {WORKER} offers GPU {index} alone: {self.target.gpu.name}", data)

    def down(self, timeout: float) -> Outcome:
        if not self.pids:
            return Outcome("pass", "nothing to stop: `gpulayer up` started nothing")
        if self._client is not None:
            self._client.close()
            self._client = None
        done = self.gpulayer("down", "--timeout", "5", timeout=timeout)
        alive = [pid for pid in self.pids if not gone(pid, 10)]
        problems = [f"gpulayer down exited {done.returncode}: {tail(done.stderr)}"] if done.returncode else []
        problems += [f"still running: {', '.join(map(str, alive))}"] if alive else []
        self.pids = alive
        return judged(problems, "Redis, the worker and the web server stopped", {})

    def worker_log(self) -> list[str]:
        path = self.home / "logs" / "worker.log"
        return path.read_text(errors="replace").splitlines()[-30:] if path.exists() else []


def tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:]) or "no output"


def wait_for(predicate: Callable[[], object], timeout: float, every: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def gone(pid: int, timeout: float) -> bool:
    def exited() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    return wait_for(exited, timeout)


def said(job: Job) -> list[dict[str, Any]]:
    """What the job's program reported (``_gpu_job.say``), each with the rank that said it."""
    return [
        {**json.loads(line.text[len(MARK) :]), "_rank": line.rank}
        for line in job.logs()
        if line.stream == "stdout" and line.text.startswith(MARK)
    ]


def log_tail(job: Job, lines: int = 20) -> list[str]:
    return [
        f"[{line.stream}{'' if line.rank is None else f' {line.rank}'}] {line.text}" for line in job.logs()
    ][-lines:]


def job_timeout(timeout: float) -> float:
    """A job's own timeout inside its check's: the job is stopped, and says so, before the check
    gives up waiting for it."""
    return max(5.0, timeout - 20)


def ended(record: JobRecord) -> list[str]:
    """Nothing when the job succeeded, else how it ended."""
    if record.state == JobState.SUCCEEDED:
        return []
    return [f"job {record.id} {record.state.value}" + (f": {record.reason}" if record.reason else "")]
