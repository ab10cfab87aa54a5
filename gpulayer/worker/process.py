"""Starting a job's process in its own session, noticing when it exits, and killing all it left behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from ..models import JOB_ID_VARIABLE
from . import spawning, usage
from .boxes import NO_BOX, Box
from .identity import RunAs
from .spawning import Started
from .usage import Meter

#: What a job's processes never inherit from the worker's environment: GPUlayer's own variables (the
#: Redis URL and its password, an access token, the home with the worker's keys) and Redis's.
_KEPT_FROM_JOBS = ("GPULAYER_", "REDISCLI_AUTH")


def job_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment as its jobs get it: without any credential of the worker's."""
    return {name: value for name, value in environ.items() if not name.startswith(_KEPT_FROM_JOBS)}


_PR_SET_CHILD_SUBREAPER = 36


_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def spawn(
    command: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    pass_fds: Sequence[int] = (),
    die_with_worker: bool = False,
    options: Mapping[str, Any] | None = None,
    executable: str | None = None,
    enter: Callable[[], None] | None = None,
) -> Started:
    """Start ``command`` (no shell) as the leader of a new session, so its whole tree can be signalled.
    ``die_with_worker``: SIGKILL it if the worker dies (Linux), as a gang job's ranks must not run on
    unsupervised. ``options``: more of Popen's (the user to run as). ``executable``: where its program
    is, if known (see :class:`Programs`). ``enter``: what the child calls first, to enter its cgroup
    (see :mod:`.cgroups`). A plain start (none of those but ``executable``) goes through
    ``posix_spawn`` where it can (see :mod:`.spawning`)."""
    plain = not (pass_fds or die_with_worker or options or enter)
    program = executable or (command[0] if os.sep in command[0] else None)
    if plain and program is not None and spawning.AVAILABLE:
        started = spawning.spawn(program, command, cwd, env)
        if started is not None:
            return started
    options = dict(options or {})
    if enter is not None and "user" in options:
        # Popen changes user before a preexec_fn runs, and the job's user may not move itself into a
        # cgroup: the child enters it first, then becomes that user.
        enter = _then_become(enter, options.pop("user"), options.pop("group"), options.pop("extra_groups"))
    hooks = [
        hook for hook in (enter, _die_with_parent if die_with_worker and _libc is not None else None) if hook
    ]
    return subprocess.Popen(
        list(command),
        executable=executable,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        pass_fds=pass_fds,
        # Safe with threads here: the child makes a few system calls and takes no lock before exec.
        preexec_fn=_calling(hooks) if hooks else None,  # noqa: PLW1509
        **options,
    )


def _calling(hooks: list[Callable[[], None]]) -> Callable[[], None]:
    def call() -> None:
        for hook in hooks:
            hook()

    return call


def _then_become(enter: Callable[[], None], uid: int, gid: int, groups: list[int]) -> Callable[[], None]:
    """``enter``, then what Popen's ``user``, ``group`` and ``extra_groups`` do, in that order."""

    def hook() -> None:
        enter()
        os.setgroups(groups)
        os.setgid(gid)
        os.setuid(uid)

    return hook


class Programs:
    """Where a program named without a folder is on a PATH, looked up at most once every
    :data:`FOUND_FOR` seconds: the child would otherwise try every folder of the PATH before the
    right one, an ``execve`` each (eight for ``true`` on a usual PATH)."""

    #: How long (s) a program found is taken to stay where it was.
    FOUND_FOR = 5.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found: dict[tuple[str, str], tuple[str | None, float]] = {}

    def find(self, program: str, path: str) -> str | None:
        """Where ``program`` is on ``path``; None if it is not there, is named with a folder, or the
        PATH has a relative folder (the child reads that from the job's folder, not the worker's)."""
        now = time.monotonic()
        with self._lock:
            where, at = self._found.get((program, path), (None, -self.FOUND_FOR))
        if now - at < self.FOUND_FOR:
            return where
        searchable = os.sep not in program and all(os.path.isabs(folder) for folder in path.split(os.pathsep))
        where = shutil.which(program, path=path) if searchable else None
        with self._lock:
            if len(self._found) >= 256:
                self._found.clear()
            self._found[(program, path)] = (where, now)
        return where

    def forget(self) -> None:
        with self._lock:
            self._found.clear()


def _die_with_parent() -> None:
    assert _libc is not None
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def exit_notifier(pid: int) -> int | None:
    """A file descriptor readable once ``pid`` exits (a Linux pidfd), or None where there is none."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def has_exited(pid: int) -> bool:
    """Whether ``pid`` has exited, without reaping it: while it is a zombie its id cannot be reused,
    so its process group can still be signalled safely."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def exit_status(pid: int) -> int | None:
    """How ``pid`` exited, as a return code (negative: the signal that killed it), without reaping
    it; None while it runs."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def signal_tree(leader: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the job's process group and to every descendant of its leader, including
    those that left the group (a daemonising child, a data loader that called setsid)."""
    descendants: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        descendants = psutil.Process(leader).children(recursive=True)
    signal_group(leader, sig)
    for process in descendants:
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)


def signal_group(leader: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the job's process group only: one system call, for the end of every job."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, sig)


def become_subreaper() -> bool:
    """Make processes a job leaves behind — a daemon that double-forked out of its session — this
    worker's children when their parent exits, instead of init's, so :func:`kill_strays` can find
    them. Linux only; elsewhere they escape."""
    if _libc is None:
        return False
    return bool(_libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


class JobProcesses:
    """A worker's job processes: the leaders it started and has not reaped yet, and the strays jobs
    leave behind. One lock orders spawning, reaping and stray hunting, so a leader is never
    mistaken for a stray. With ``run_as``, every one of them runs as that user (its HOME is its
    job's own: the runner sets it)."""

    def __init__(self, run_as: RunAs | None = None) -> None:
        self._lock = threading.Lock()
        #: Notified as each start in progress is over (its process, if any, is then a leader).
        self._started = threading.Condition(self._lock)
        self._starting = 0
        self._leaders: set[int] = set()
        self.run_as = run_as
        self._options = run_as.popen_options() if run_as else {}
        self._identity = run_as.environment() if run_as else {}
        self._programs = Programs()

    def spawn(
        self,
        command: Sequence[str],
        cwd: Path,
        env: Mapping[str, str],
        pass_fds: Sequence[int] = (),
        die_with_worker: bool = False,
        box: Box = NO_BOX,
    ) -> Started:
        """Start a job's process (see :func:`spawn`) in ``box``, the cgroup of its job or executor."""
        env = {**env, **self._identity}
        # A job run as another user finds its program with that user's rights: by its own search.
        where = None if self.run_as else self._programs.find(command[0], env.get("PATH", ""))
        # Not under the lock: a start waits for the child's exec (a millisecond), and the worker's
        # other jobs start, end and are cleaned up meanwhile. Only the hunt for strays waits for it.
        with self._lock:
            self._starting += 1
        process = None
        try:
            with box.placing() as enter:
                try:
                    process = spawn(command, cwd, env, pass_fds, die_with_worker, self._options, where, enter)
                except FileNotFoundError:
                    if where is None:
                        raise
                    self._programs.forget()  # it moved since it was found: look the usual way
                    process = spawn(command, cwd, env, pass_fds, die_with_worker, self._options, None, enter)
        finally:
            if process is not None:
                box.placed(process.pid)
            with self._lock:
                if process is not None:
                    self._leaders.add(process.pid)
                self._starting -= 1
                self._started.notify_all()
        return process

    def reading(self) -> contextlib.AbstractContextManager[None]:
        """Reading (and writing) a job's own files with its user's permissions, in this thread."""
        return self.run_as.reading() if self.run_as else contextlib.nullcontext()

    def hand_over(self, path: Path) -> None:
        """Make what the worker put in a job's folder the job's user's."""
        if self.run_as:
            self.run_as.own(path)

    def reap(self, process: Started, meter: Meter | None = None) -> int:
        """Wait for a leader to exit and reap it; ``meter`` learns what it used."""
        returncode, used = usage.wait(process)
        if meter is not None:
            meter.reaped(used)
        with self._lock:
            self._leaders.discard(process.pid)
        return returncode

    def kill_strays(self, job_id: str) -> int:
        """SIGKILL and reap this worker's children that belong to ``job_id`` and lead no job: what the
        job left running, re-parented here (see :func:`become_subreaper`); reap any that already died.
        Returns how many were killed."""
        killed = 0
        with self._lock:
            # A process just started, not yet a leader, would pass for a stray.
            self._started.wait_for(lambda: not self._starting)
            # An orphan is handed to the subreaper's main thread: only its children need a look.
            for pid in _children(os.getpid(), main_thread_only=True) - self._leaders:
                signalled = False
                try:
                    process = psutil.Process(pid)
                    if process.status() != psutil.STATUS_ZOMBIE:
                        if process.environ().get(JOB_ID_VARIABLE) != job_id:
                            continue
                        process.send_signal(signal.SIGKILL)
                        signalled = True
                except psutil.Error:
                    pass
                # A zombie is only reaped: what killed it (its job's cgroup) counted it.
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                    killed += signalled
        return killed


def _children(pid: int, main_thread_only: bool = False) -> set[int]:
    """A process's children (those of its main thread only, if asked), from /proc: cheap, no scan
    of every process."""
    pids: set[int] = set()
    with contextlib.suppress(OSError):
        for task in [str(pid)] if main_thread_only else os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                pids.update(int(child) for child in _read(f"/proc/{pid}/task/{task}/children").split())
    return pids


def _read(path: str) -> bytes:
    """A small file of /proc, whole (three system calls: a file object makes eight)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 65536)]
        while chunks[-1]:
            chunks.append(os.read(fd, 65536))
    finally:
        os.close(fd)
    return b"".join(chunks)


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, parents before their children (Linux: read from /proc)."""
    if not Path("/proc/self/task").is_dir():
        with contextlib.suppress(psutil.Error):
            return [child.pid for child in psutil.Process(pid).children(recursive=True)]
        return []
    found: list[int] = []
    level = [pid]
    while level:
        level = [child for parent in level for child in _children(parent)]
        found.extend(level)
    return found
