"""The Python environments a worker builds for jobs that bring one (docs/environments.md), kept in a
cache folder that every worker of the machine using it shares.

Each environment is a virtual environment of the worker's own Python, in a folder named by the
hash of its requirements and that Python (:meth:`~gpulayer.environments.PythonEnvironment.key`),
built by uv from the package index the machine is configured with (uv's own settings and
variables: ``UV_INDEX_URL``, ``UV_FIND_LINKS``, ``uv.toml``, ...). A folder is whole once it holds
:data:`READY`, written last. Locks (``flock``, on a file per environment under ``.locks``) make one
build of each, whatever the number of jobs, threads and worker processes asking for it: the first
builds while the others wait, and then find it. A job holds its environment's lock shared while it
runs, and the marker's modification time says when it was last used: past the cache's size, the
least recently used environments that no job holds are removed.

uv installs wheels only (``UV_NO_BUILD=1``, unless the worker's own environment says otherwise): a
build runs as the worker's user, and a source distribution's build would run the package's code
there. uv runs with the environment the worker's jobs get, without the worker's credentials.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import uv

from ..environments import PythonEnvironment

log = logging.getLogger("gpulayer.worker")

#: Written last in an environment's folder: it is whole. Touched at each use (its mtime: last used).
READY = ".gpulayer-ready"
#: An environment used this recently (s) is never removed to make room: a job may be about to hold it.
_RECENT = 60.0
#: The folder of the locks, in the cache.
_LOCKS = ".locks"
#: What the worker's Python is, for an environment's key: the same requirements make another
#: environment under another Python or platform.
INTERPRETER = f"{sys.implementation.cache_tag}-{sys.version.split()[0]}-{sysconfig.get_platform()}"


@dataclasses.dataclass(frozen=True)
class Ready:
    """An environment a job may run in: its folder, and whether this job's turn built it."""

    folder: Path
    built: bool
    seconds: float

    @property
    def python(self) -> str:
        return str(self.folder / "bin" / "python")

    def variables(self, path: str) -> dict[str, str]:
        """What a job's environment variables become in it: its ``bin`` first on ``path``."""
        bin_folder = str(self.folder / "bin")
        return {"VIRTUAL_ENV": str(self.folder), "PATH": os.pathsep.join(filter(None, (bin_folder, path)))}


@dataclasses.dataclass(frozen=True)
class Failed:
    """A build that failed: why, on one line, and uv's whole report."""

    reason: str
    report: str


class EnvironmentCache:
    """The environments under ``root``, at most ``max_bytes`` of them once a build is done; uv runs
    with ``environ`` and stops after ``timeout`` seconds."""

    def __init__(self, root: Path, max_bytes: int, timeout: float, environ: Mapping[str, str]) -> None:
        self.root = root
        self._max_bytes = max_bytes
        self._timeout = timeout
        self._environ = {"UV_NO_BUILD": "1", **environ, "NO_COLOR": "1", "UV_NO_PROGRESS": "1"}
        #: How many environments this worker built (each found one is not counted).
        self.builds = 0

    @contextlib.contextmanager
    def held(self, environment: PythonEnvironment, say: Callable[[str], None]) -> Iterator[Ready | Failed]:
        """``environment``, built if this machine lacks it, held (not removed) until the block ends;
        or how its build failed. ``say`` tells the job's log which."""
        key = environment.key(INTERPRETER)
        folder = self.root / key[:32]
        locks = self.root / _LOCKS
        locks.mkdir(parents=True, exist_ok=True, mode=0o755)
        started = time.monotonic()
        with open(locks / f"{key[:32]}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            built = not (folder / READY).exists()
            if built:
                failed = self._build(environment, folder)
                if failed is not None:
                    say(f"cannot build its Python environment ({environment.describe()}); uv said:")
                    for line in (failed.report or failed.reason).splitlines():
                        say(line)
                    yield failed
                    return
            os.utime(folder / READY)
            # Shared from now on: other jobs of this environment run beside it; none removes it.
            fcntl.flock(lock, fcntl.LOCK_SH)
            ready = Ready(folder, built, time.monotonic() - started)
            verb = "built" if built else "found"
            say(f"Python environment {key[:12]} {verb} in {ready.seconds:.2f} s: {environment.describe()}")
            if built:
                self._make_room(keep=folder)
            yield ready

    def _build(self, environment: PythonEnvironment, folder: Path) -> Failed | None:
        """Build ``environment`` in ``folder`` (under its lock); None once it is whole."""
        shutil.rmtree(folder, ignore_errors=True)  # what a build that did not finish left
        self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
        started = time.monotonic()
        failed = self._uv("venv", "--quiet", "--python", sys.executable, str(folder))
        if failed is None:
            requirements = folder / "requirements.txt"
            requirements.write_text("\n".join(environment.requirements) + "\n")
            python = str(folder / "bin" / "python")
            failed = self._uv(
                "pip", "install", "--quiet", "--python", python, "--requirements", str(requirements)
            )
        if failed is not None:
            shutil.rmtree(folder, ignore_errors=True)
            return failed
        (folder / READY).write_text(" ".join(environment.requirements) + "\n")
        self.builds += 1
        log.info("Python environment %s built in %.2f s", folder.name, time.monotonic() - started)
        return None

    def _uv(self, *args: str) -> Failed | None:
        try:
            done = subprocess.run(
                [uv.find_uv_bin(), *args],
                check=False,
                capture_output=True,
                text=True,
                env=self._environ,
                timeout=self._timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return Failed(f"uv took over {self._timeout:g} s (GPULAYER_ENV_BUILD_TIMEOUT)", "")
        if done.returncode != 0:
            return Failed(_one_line(done.stderr) or f"uv exited {done.returncode}", done.stderr.strip())
        return None

    def _make_room(self, keep: Path) -> None:
        """Remove the environments used least recently, but ``keep`` and those in use, until the cache
        is within its size."""
        found = []
        for marker in self.root.glob(f"*/{READY}"):
            with contextlib.suppress(OSError):
                found.append((marker.stat().st_mtime, marker.parent))
        sizes = {folder: _size(folder) for _, folder in found}
        total = sum(sizes.values())
        now = time.time()
        for used, folder in sorted(found):
            if total <= self._max_bytes:
                return
            if folder == keep or now - used < _RECENT:
                continue
            if self._remove_unless_held(folder):
                total -= sizes[folder]

    def _remove_unless_held(self, folder: Path) -> bool:
        with open(self.root / _LOCKS / f"{folder.name}.lock", "a+b") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a job runs in it, or a worker is building it
            (folder / READY).unlink(missing_ok=True)  # first: a folder half removed is not whole
            shutil.rmtree(folder, ignore_errors=True)
            log.info("Python environment %s removed: the cache is over its size", folder.name)
            return True


def _size(folder: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _one_line(report: str, limit: int = 500) -> str:
    """uv's error on one line: from its ``error:`` line on (its causes included), without what it
    said before (the environment it used)."""
    lines = [line.strip() for line in report.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith("error:")), 0)
    line = " ".join(lines[start:])
    return line if len(line) <= limit else line[: limit - 1] + "…"
