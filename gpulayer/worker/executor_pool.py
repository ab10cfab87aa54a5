"""A worker's function executors: started on demand, kept warm for later jobs with the same code
bundle, requirements and GPUs, never more idle ones than the worker has slots, and none that sits
idle on a GPU another job needs."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import site
import sys
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..models import JobSpec
from .boxes import Box, Containment
from .devices import devices_shown
from .env_builds import INTERPRETER
from .executor_process import pack, unpack
from .process import JobProcesses, descendants, signal_tree

#: How an executor starts: a fresh interpreter that imports the executor's module and runs it. In
#: a job's own Python environment, the worker's import folders come after the environment's own
#: (those named after the two pipes): GPUlayer and what it imports are found there.
_MAIN = (
    "import site, sys; [site.addsitedir(folder) for folder in sys.argv[3:]]; "
    "from gpulayer.worker.executor_process import main; main(sys.argv)"
)
#: Where the worker's Python finds GPUlayer and its packages.
_WORKER_FOLDERS = (str(Path(__file__).resolve().parents[2]), *site.getsitepackages())
#: An idle executor is stopped after this long (s) without a job.
IDLE_LIMIT = 600.0


@dataclasses.dataclass(frozen=True)
class Key:
    """What makes a warm executor fit for a job."""

    bundle: str
    capability: str
    #: The GPUs it sees (:func:`devices_shown`, comma-separated); empty for none.
    devices: str
    #: The job's own Python environment's key; empty for the worker's Python.
    environment: str = ""

    @classmethod
    def of(cls, spec: JobSpec, base_env: Mapping[str, str]) -> Key:
        """What a warm executor must match to run this job's call."""
        function = spec.function
        devices = ",".join(devices_shown(base_env))
        environment = spec.environment.key(INTERPRETER) if spec.environment else ""
        return cls(function.bundle if function else "", spec.requirements.capability, devices, environment)


class Executor:
    """One executor process, its two pipes, and its output (read by the job's runner)."""

    def __init__(
        self,
        processes: JobProcesses,
        key: Key,
        env: Mapping[str, str],
        cwd: Path,
        box: Box,
        python: str | None = None,
    ) -> None:
        self.key = key
        self.idle_since = time.monotonic()
        self._processes = processes
        #: Its cgroup of its own (it outlives each job): each call's job holds it to its limits.
        self.box = box
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        command = [python or sys.executable, "-c", _MAIN, str(request_read), str(reply_write)]
        if python is not None:
            command += _WORKER_FOLDERS
        try:
            self.process = processes.spawn(command, cwd, env, pass_fds=(request_read, reply_write), box=box)
        except OSError:
            os.close(request_write)
            os.close(reply_read)
            box.release()
            raise
        finally:
            os.close(request_read)
            os.close(reply_write)
        self.requests = Connection(request_write, readable=False)
        self.replies = Connection(reply_read, writable=False)
        # Read between jobs too: a runner drains what is there without waiting for more.
        for stream in (self.process.stdout, self.process.stderr):
            assert stream is not None
            os.set_blocking(stream.fileno(), False)

    def send(self, header: dict[str, Any], payload: bytes) -> None:
        self.requests.send_bytes(pack(header, payload))

    def receive(self) -> tuple[dict[str, Any], bytes]:
        return unpack(self.replies.recv_bytes())

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill_children(self) -> int:
        """SIGKILL what the last job started under this executor; a job's processes end with it.
        (The executor reaps its own children; what they leave to the worker, the worker's strays hunt
        finds.)"""
        children = descendants(self.process.pid)
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return len(children)

    def close(self) -> None:
        """Stop it and everything it started, and reap it."""
        for connection in (self.requests, self.replies):
            with contextlib.suppress(OSError):
                connection.close()
        if self.alive:
            signal_tree(self.process.pid, signal.SIGKILL)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        self._processes.reap(self.process)
        self.box.release()


class ExecutorPool:
    """Idle executors by key. ``acquire`` takes a warm one or starts one; ``release`` keeps it or not."""

    def __init__(self, processes: JobProcesses, limit: int, containment: Containment) -> None:
        self._processes = processes
        self._limit = limit
        self._containment = containment
        self._lock = threading.Lock()
        self._idle: list[Executor] = []

    def acquire(self, key: Key, env: Mapping[str, str], cwd: Path, python: str | None = None) -> Executor:
        """A warm executor for ``key``, else a new one started in ``cwd`` with ``env`` (and
        ``python``, a job's own environment's, for the worker's)."""
        self.close_stale()
        with self._lock:
            found = next((executor for executor in self._idle if executor.key == key), None)
            if found is not None:
                self._idle.remove(found)
        return found if found is not None else self.start(key, env, cwd, python)

    def close_stale(self) -> None:
        """Stop idle executors that died, or sat idle past :data:`IDLE_LIMIT`."""
        now = time.monotonic()
        with self._lock:
            stale = [e for e in self._idle if not e.alive or now - e.idle_since > IDLE_LIMIT]
            self._idle = [executor for executor in self._idle if executor not in stale]
        self._close(stale)

    def start(self, key: Key, env: Mapping[str, str], cwd: Path, python: str | None = None) -> Executor:
        """A new executor for ``key``, started in ``cwd`` with ``env`` (and ``python``)."""
        env = {**env, "PYTHONUNBUFFERED": "1"}
        return Executor(self._processes, key, env, cwd, self._containment.executor_box(), python)

    def release(self, executor: Executor, *, keep: bool) -> None:
        """Keep ``executor`` warm for the next job of its key, or stop it; the longest idle go when
        more than the limit wait."""
        with self._lock:
            if keep and executor.alive:
                executor.idle_since = time.monotonic()
                self._idle.append(executor)
                evicted, self._idle = self._idle[: -self._limit], self._idle[-self._limit :]
            else:
                evicted = [executor]
        self._close(evicted)

    def evict(self, devices: set[str], keep: Key | None = None) -> None:
        """Stop idle executors that hold any of ``devices`` (they may keep GPU memory), but ``keep``'s."""
        with self._lock:
            evicted = [
                executor
                for executor in self._idle
                if executor.key != keep and devices & set(filter(None, executor.key.devices.split(",")))
            ]
            self._idle = [executor for executor in self._idle if executor not in evicted]
        self._close(evicted)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        self._close(idle)

    @staticmethod
    def _close(executors: list[Executor]) -> None:
        for executor in executors:
            executor.close()
