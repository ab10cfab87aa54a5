"""What contains a job's processes, whatever does it: the limits a job gets, the :class:`Box` its
processes run in, the worker's :class:`Containment` (which contains nothing itself), and the reads
and writes of cgroupfs that cgroup v1's and v2's containments (:mod:`.cgroup_v1`, :mod:`.cgroup_v2`)
share. :func:`.cgroups.open_containment` picks one."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

log = logging.getLogger("gpulayer.worker")

CPU_PERIOD_US = 100_000
#: How long (s) a sweep keeps killing before it gives up on a process that will not die (one in
#: uninterruptible sleep on a dead disk).
SWEEP_FOR = 10.0


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a job may use: its memory in bytes (None: no limit of its own), a CPU quota in cores
    (0: none), a number of processes and threads (0: no limit), and the GPU device minors it may not
    open (the machine's other GPUs)."""

    memory: int | None = None
    cpus: int = 0
    pids: int = 0
    denied_gpus: frozenset[int] = frozenset()


@dataclasses.dataclass(frozen=True)
class Usage:
    """What a job used, as its cgroup counted it since its limits were written."""

    cpu_seconds: float
    peak_memory: int | None


class Box:
    """Where a job's (or an executor's) processes run: no cgroup at all, the base for the real ones."""

    def placing(self) -> contextlib.AbstractContextManager[Callable[[], None] | None]:
        """Around the start of one of its processes: yields what the child must call before its exec
        to enter the cgroup, or None (it enters by being made)."""
        return contextlib.nullcontext()

    def placed(self, pid: int) -> None:
        """Its process ``pid`` has just started (its exec done: it has not forked yet)."""

    def limit(self, limits: Limits) -> None:
        """Hold what runs here from now on to ``limits``, and start counting its usage afresh.
        :class:`OSError` (EBUSY) if what already runs here uses more memory than the new limit."""

    def sweep(self, keep: Collection[int] = ()) -> int:
        """Kill every process in it but ``keep``'s; returns how many were killed."""
        return 0

    def usage(self) -> Usage | None:
        return None

    def out_of_memory(self) -> bool:
        """Whether a process was killed for going over the memory limit since this was last asked."""
        return False

    def release(self) -> None:
        """The job (or executor) it served is over: a cgroup made for it alone is removed."""


class Containment:
    """How a worker contains its jobs: :meth:`box` for the job the calling slot thread runs,
    :meth:`executor_box` for a warm executor. This base contains nothing."""

    def __init__(self, why: str = "") -> None:
        self.why = why

    def describe(self) -> str:
        """One line for the worker's log and `gpulayer workers`."""
        return f"none — processes followed by session and environment{f' ({self.why})' if self.why else ''}"

    def box(self) -> Box:
        return NO_BOX

    def executor_box(self) -> Box:
        return NO_BOX

    def close(self) -> None:
        """Kill what is left in every cgroup of the worker's, and remove them."""

    def clear_leftovers(self) -> None:
        """Kill what workers that died on this machine left in their cgroups, and remove them: once
        this process holds its name (an earlier process under it among them)."""


@contextlib.contextmanager
def leftovers(root: Path) -> Iterator[list[Path]]:
    """The roots beside ``root`` of workers that died (``gpulayer-NAME-PID``, its process gone): under
    any name, as a worker killed outright may never be started again under its own. A live one (the
    worker this one replaces, as it stops) removes its own. Workers starting together take turns (a
    lock on the folder holding the roots), so no two remove the same folders under each other."""
    fd = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield [
            folder
            for folder in root.parent.glob("gpulayer-*-*")
            if folder != root and (pid := folder.name.rpartition("-")[2]).isdigit() and not _alive(int(pid))
        ]
    finally:
        os.close(fd)  # and with it the lock


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


#: Where a job runs without containment.
NO_BOX = Box()


# --- files of cgroupfs ------------------------------------------------------------------------------


def write_file(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read_file(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


def pids_in(path: Path) -> set[int]:
    """The processes listed in a ``cgroup.procs``."""
    return {int(pid) for pid in read_file(path).split()}


def stat_counter(text: str, name: str) -> int:
    """A ``name value`` line of a flat-keyed cgroup file (``memory.events``, ``memory.oom_control``)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


def remove_tree(folder: Path, sweep: Callable[[Path], object]) -> None:
    """Remove a cgroup folder and those under it, deepest first, killing what runs in each."""
    if not folder.is_dir():
        return
    for child in sorted((p for p in folder.iterdir() if p.is_dir()), reverse=True):
        remove_tree(child, sweep)
    sweep(folder)
    remove_cgroup(folder)


def remove_cgroup(folder: Path) -> None:
    """Remove an empty cgroup folder; processes just killed may hold it a moment longer (EBUSY)."""
    deadline = time.monotonic() + 2.0
    while True:
        try:
            folder.rmdir()
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return
            time.sleep(0.005)


def kill_listed(procs: Path, keep: Collection[int], member: Callable[[int], bool]) -> int:
    """SIGKILL every process ``procs`` lists but ours and ``keep``'s, round after round until none is
    left: each pinned by a pidfd and checked to be still a ``member`` before it is signalled, so a
    reused pid is never hit. Returns how many were killed."""
    spared = {os.getpid(), *keep}
    killed: set[int] = set()
    deadline = time.monotonic() + SWEEP_FOR
    pause = 0.0005
    while True:
        try:
            left = pids_in(procs) - spared
        except FileNotFoundError:
            return len(killed)
        if not left:
            return len(killed)
        if time.monotonic() > deadline:
            log.error("could not kill processes %s of %s", sorted(left), procs.parent)
            return len(killed)
        for pid in left - killed:
            try:
                pinned = os.pidfd_open(pid)
            except OSError:
                continue  # gone already
            try:
                if member(pid):
                    signal.pidfd_send_signal(pinned, signal.SIGKILL)
                    killed.add(pid)
            except OSError:
                pass
            finally:
                os.close(pinned)
        time.sleep(pause)  # for the killed to exit (and their children, forked meanwhile, to show)
        pause = min(pause * 2, 0.02)


def own_cgroups() -> dict[str, str]:
    """This process's cgroup in each hierarchy: v1 controllers by name, v2 under ``""``."""
    text = read_file(Path("/proc/self/cgroup"))
    return {
        controller: path for controller in mount_points() if (path := cgroup_of(text, controller)) is not None
    }


@functools.cache
def mount_points() -> dict[str, Path]:
    """Where each cgroup hierarchy is mounted: v1 controllers by name, v2 under ``""``."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        kind, options = fields[separator + 1], fields[separator + 3].split(",")
        if kind == "cgroup2":
            found.setdefault("", Path(fields[4]))
        elif kind == "cgroup":
            for option in options:
                found.setdefault(option.removeprefix("name="), Path(fields[4]))
    return found


def member_of(controller: str, folder: Path) -> Callable[[int], bool]:
    """Whether a process is in ``folder`` (or under it) of ``controller``'s hierarchy (``""``: v2's)."""
    inside = "/" + str(folder.relative_to(mount_points()[controller]))

    def member(pid: int) -> bool:
        path = cgroup_of_process(pid, controller)
        return path is not None and (path == inside or path.startswith(inside + "/"))

    return member


def cgroup_of_process(pid: int, controller: str) -> str | None:
    try:
        return cgroup_of(read_file(Path(f"/proc/{pid}/cgroup")), controller)
    except OSError:
        return None


def cgroup_of(text: str, controller: str) -> str | None:
    """A process's cgroup in ``controller``'s hierarchy (``""``: v2's), from its /proc cgroup file."""
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in (controllers.split(",") if controllers else [""]):
            return path
    return None
