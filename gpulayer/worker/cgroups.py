"""Containment: every job's processes in a cgroup of the job's own, held to what the job asked for,
and all of them killed as it ends, whatever they did to their session, parents or environment.

**cgroup v1** (a controller per hierarchy, as here): a job's cgroup is its slot's. Each slot thread
of the worker moves itself once into cgroups of its own, one per controller, and every process it
starts lands there as it is created (a new process inherits the cgroups of the thread that made it):
no window in which a process runs outside, and no per-job ``mkdir``/``rmdir`` in five hierarchies,
which would cost the worker a sixth of its throughput. A slot runs one job at a time, so between two
jobs its cgroups hold no process but the slot thread: the job's limits are written as it starts,
its counters reset, and its processes killed as it ends. (The CPU quota's cgroup is the exception:
see :class:`SlotBoxV1`.) A warm executor, which outlives the job that
started it, gets cgroups of its own, which the starting thread steps into for the ``fork``.

**cgroup v2** (one hierarchy, where the worker's cgroup is delegated to it): a cgroup per job, made
before its first process and removed after its last; a process enters it before its ``exec`` (the
child writes itself into ``cgroup.procs``), and ``cgroup.kill`` ends them all.

Killing is race-free on both: v2's ``cgroup.kill``; on v1 (whose freezer would freeze the slot
thread too) each process is pinned with a pidfd and checked to be in the cgroup before its SIGKILL,
round after round until none is left (the pids limit bounds a fork bomb).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Literal

log = logging.getLogger("gpulayer.worker")

Mode = Literal["auto", "cgroup2", "cgroup1", "none"]

#: NVIDIA's character device major: ``/dev/nvidia<minor>`` is GPU ``minor``; 255 is ``nvidiactl``.
NVIDIA_MAJOR = 195
#: The v1 controllers a slot needs, and the one (optional) that fences GPU devices.
_V1_NEEDED = ("memory", "pids", "cpu", "cpuacct")
_V1_DEVICES = "devices"
#: The v2 controllers a job's cgroup is limited with, where the worker's cgroup delegates them.
_V2_CONTROLLERS = ("memory", "pids", "cpu")
_CPU_PERIOD_US = 100_000
#: How long (s) a sweep keeps killing before it gives up on a process that will not die (one in
#: uninterruptible sleep on a dead disk).
_SWEEP_FOR = 10.0


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
def _leftovers(root: Path) -> Iterator[list[Path]]:
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


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


def _pids(path: Path) -> set[int]:
    """The processes listed in a ``cgroup.procs``."""
    return {int(pid) for pid in _read(path).split()}


def _counter(text: str, name: str) -> int:
    """A ``name value`` line of a flat-keyed cgroup file (``memory.events``, ``memory.oom_control``)."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return 0


def _remove_tree(folder: Path, sweep: Callable[[Path], object]) -> None:
    """Remove a cgroup folder and those under it, deepest first, killing what runs in each."""
    if not folder.is_dir():
        return
    for child in sorted((p for p in folder.iterdir() if p.is_dir()), reverse=True):
        _remove_tree(child, sweep)
    sweep(folder)
    _rmdir(folder)


def _rmdir(folder: Path) -> None:
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
    deadline = time.monotonic() + _SWEEP_FOR
    pause = 0.0005
    while True:
        try:
            left = _pids(procs) - spared
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


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup in each hierarchy: v1 controllers by name, v2 under ``""``."""
    text = _read(Path("/proc/self/cgroup"))
    return {
        controller: path for controller in _mounts() if (path := _cgroup_of(text, controller)) is not None
    }


@functools.cache
def _mounts() -> dict[str, Path]:
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


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def open_containment(mode: Mode, worker: str, memory: int) -> Containment:
    """The worker's containment for ``mode``: ``auto`` takes cgroup v2 where its cgroup delegates
    memory and pids, else v1's controllers, else v2 alone (kills, no limits), else none. ``memory``:
    what all the worker's jobs together may use. :class:`OSError` (with why) if a mode asked for by
    name cannot be had."""
    if mode == "none":
        return Containment("turned off")
    try:
        mounts, own = _mounts(), _own_cgroups()
    except OSError:  # no /proc: not Linux
        mounts, own = {}, {}
    # Two processes may briefly hold one worker name (one is refused, or replaced): their own pid keeps
    # them apart. What a dead worker left goes at the next start's :meth:`Containment.clear_leftovers`.
    name = f"gpulayer-{_safe(worker)}-{os.getpid()}"
    tried: list[str] = []
    #: v2 without the controllers to limit jobs: kept in case v1 cannot be had either.
    kills_only: CgroupV2 | None = None
    order: list[Mode] = ["cgroup2", "cgroup1"] if mode == "auto" else [mode]
    for kind in order:
        try:
            if kind == "cgroup2":
                v2 = CgroupV2(_v2_root(mounts, own, name), memory)
                if mode == "auto" and not {"memory", "pids"} <= v2.controllers:
                    kills_only = v2
                    tried.append("cgroup v2 delegates no memory and pids controllers here")
                    continue
                return v2
            v1 = CgroupV1(_v1_roots(mounts, own, name), memory)
        except OSError as exc:
            tried.append(f"{'cgroup v2' if kind == 'cgroup2' else 'cgroup v1'}: {exc.strerror or exc}")
        else:
            if kills_only is not None:
                kills_only.close()
            return v1
    if kills_only is not None:
        return kills_only
    if mode == "auto":
        return Containment("; ".join(tried) or "no cgroups here")
    raise OSError(errno.ENOTSUP, "; ".join(tried))


# --- cgroup v1 ---------------------------------------------------------------------------------------


def _v1_roots(mounts: dict[str, Path], own: dict[str, str], name: str) -> dict[str, Path]:
    missing = [controller for controller in _V1_NEEDED if controller not in mounts or controller not in own]
    if missing:
        raise OSError(errno.ENOENT, f"no {', '.join(missing)} controller mounted")
    wanted = [*_V1_NEEDED, *([_V1_DEVICES] if _V1_DEVICES in mounts and _V1_DEVICES in own else [])]
    return {c: mounts[c] / own[c].lstrip("/") / name for c in wanted}


class CgroupV1(Containment):
    """The v1 controllers: a root per controller for the worker (``roots``), its memory limit all its
    jobs' ``memory`` together, and under it each slot's cgroups and each executor's."""

    def __init__(self, roots: dict[str, Path], memory: int) -> None:
        super().__init__()
        self._roots = roots
        self._lock = threading.Lock()
        self._slots: dict[int, SlotBoxV1] = {}
        self._numbers = itertools.count()
        made: list[Path] = []
        try:
            for root in roots.values():
                root.mkdir()
                made.append(root)
        except OSError:
            for root in made:
                root.rmdir()
            raise
        # All the worker's jobs together: its own memory stays out of their reach.
        _write(roots["memory"] / "memory.limit_in_bytes", str(memory))

    def describe(self) -> str:
        fence = "GPU devices fenced" if _V1_DEVICES in self._roots else "no devices controller"
        return f"cgroup v1 (memory, pids and CPU limits; {fence})"

    def box(self) -> Box:
        """The calling slot thread's cgroups, made and entered the first time it asks."""
        thread = threading.get_native_id()
        with self._lock:
            box = self._slots.get(thread)
        if box is None:
            box = SlotBoxV1(self._folders(f"slot-{thread}"))
            box.enter(thread)
            with self._lock:
                self._slots[thread] = box
        return box

    def executor_box(self) -> Box:
        return OwnBoxV1(self._folders(f"executor-{next(self._numbers)}"))

    def _folders(self, name: str) -> dict[str, Path]:
        folders = {controller: root / name for controller, root in self._roots.items()}
        for folder in folders.values():
            folder.mkdir(exist_ok=True)
        return folders

    def close(self) -> None:
        with self._lock:
            slots, self._slots = list(self._slots.values()), {}
        for box in slots:
            box.close_files()
        for controller, root in self._roots.items():
            _remove_tree(root, functools.partial(_sweep_v1, controller))

    def clear_leftovers(self) -> None:
        for controller, root in self._roots.items():
            with _leftovers(root) as folders:
                for folder in folders:
                    _remove_tree(folder, functools.partial(_sweep_v1, controller))


def _sweep_v1(controller: str, folder: Path) -> int:
    return kill_listed(folder / "cgroup.procs", (), _member(controller, folder))


def _member(controller: str, folder: Path) -> Callable[[int], bool]:
    """Whether a process is in ``folder`` (or under it) of ``controller``'s hierarchy (``""``: v2's)."""
    inside = "/" + str(folder.relative_to(_mounts()[controller]))

    def member(pid: int) -> bool:
        path = _cgroup_of_process(pid, controller)
        return path is not None and (path == inside or path.startswith(inside + "/"))

    return member


def _cgroup_of_process(pid: int, controller: str) -> str | None:
    try:
        return _cgroup_of(_read(Path(f"/proc/{pid}/cgroup")), controller)
    except OSError:
        return None


def _cgroup_of(text: str, controller: str) -> str | None:
    """A process's cgroup in ``controller``'s hierarchy (``""``: v2's), from its /proc cgroup file."""
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in (controllers.split(",") if controllers else [""]):
            return path
    return None


class SlotBoxV1(Box):
    """A slot thread's cgroups (see the module's docstring): they outlive each job, not its processes.
    The files read or written for every job stay open: one system call each, not three.

    But the CPU quota's: the slot thread does not live there, or it would share its job's quota and
    wait out the job's throttling (a third of the throughput of short jobs). Each process the slot
    starts is moved there as it starts instead, before its program can have forked (a move per job,
    none at all for a job with no quota)."""

    #: Whether the starting thread enters the ``cpu`` controller's cgroup too (see above).
    _thread_in_cpu = False

    def __init__(self, folders: dict[str, Path]) -> None:
        self._folders = folders
        self._written: dict[str, str] = {}
        self._denied: frozenset[int] = frozenset()
        self._member = _member("pids", folders["pids"])
        #: The worker's own threads that live here (the slot thread): spared by every sweep.
        self._residents: set[int] = set()
        self._worker_cpu = 0.0
        kept = {
            "count": folders["pids"] / "pids.current",
            "peak": folders["memory"] / "memory.max_usage_in_bytes",
            "ooms": folders["memory"] / "memory.oom_control",
            "cpu": folders["cpuacct"] / "cpuacct.usage",
            "quota": folders["cpu"] / "cgroup.procs",
        }
        self._fds: dict[str, int] = {}
        try:
            for key, path in kept.items():
                self._fds[key] = os.open(
                    path,
                    {"count": os.O_RDONLY, "ooms": os.O_RDONLY, "quota": os.O_WRONLY}.get(key, os.O_RDWR)
                    | os.O_CLOEXEC,
                )
        except OSError:
            self.close_files()
            raise
        self._ooms = self._oom_kills()

    def enter(self, thread: int) -> None:
        for controller, folder in self._folders.items():
            if controller != "cpu" or self._thread_in_cpu:
                _write(folder / "tasks", str(thread))
        self._residents.add(thread)

    def placed(self, pid: int) -> None:
        if self._thread_in_cpu or self._written.get("cpu/cpu.cfs_quota_us", "-1") == "-1":
            return
        with contextlib.suppress(ProcessLookupError):  # it ended already
            os.write(self._fds["quota"], str(pid).encode())

    def limit(self, limits: Limits) -> None:
        self._set("memory", "memory.limit_in_bytes", str(limits.memory) if limits.memory else "-1")
        # The slot thread lives here too: one task more than the job's own.
        self._set("pids", "pids.max", str(limits.pids + 1) if limits.pids else "max")
        self._set("cpu", "cpu.cfs_quota_us", str(limits.cpus * _CPU_PERIOD_US) if limits.cpus else "-1")
        if _V1_DEVICES in self._folders and limits.denied_gpus != self._denied:
            self._fence(limits.denied_gpus)
        os.pwrite(self._fds["peak"], b"0", 0)
        os.pwrite(self._fds["cpu"], b"0", 0)
        self._ooms = self._oom_kills()
        self._worker_cpu = time.thread_time()

    def _set(self, controller: str, name: str, value: str) -> None:
        """Write a limit only when it changes: most jobs of a slot ask for the same."""
        key = f"{controller}/{name}"
        if self._written.get(key) != value:
            _write(self._folders[controller] / name, value)
            self._written[key] = value

    def _fence(self, denied: frozenset[int]) -> None:
        devices = self._folders[_V1_DEVICES]
        for minor in self._denied - denied:
            _write(devices / "devices.allow", f"c {NVIDIA_MAJOR}:{minor} rwm")
        for minor in denied - self._denied:
            _write(devices / "devices.deny", f"c {NVIDIA_MAJOR}:{minor} rwm")
        self._denied = denied

    def sweep(self, keep: Collection[int] = ()) -> int:
        # Nothing but the slot thread here, most often: one read of a counter kept open says so (the
        # lists of tasks are read once per open file, and would have to be opened anew each time).
        if int(os.pread(self._fds["count"], 64, 0)) <= len(self._residents):
            return 0
        return kill_listed(self._folders["pids"] / "cgroup.procs", keep, self._member)

    def usage(self) -> Usage:
        """From the thread that wrote the limits: the slot thread's own time for the job (its Redis
        calls, the job's files) is counted here too, and taken out."""
        cpu = int(os.pread(self._fds["cpu"], 64, 0)) / 1e9
        if self._residents:
            cpu -= time.thread_time() - self._worker_cpu
        return Usage(max(cpu, 0.0), int(os.pread(self._fds["peak"], 64, 0)))

    def out_of_memory(self) -> bool:
        before, self._ooms = self._ooms, self._oom_kills()
        return self._ooms > before

    def _oom_kills(self) -> int:
        return _counter(os.pread(self._fds["ooms"], 4096, 0).decode(), "oom_kill")

    def close_files(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}


class OwnBoxV1(SlotBoxV1):
    """A warm executor's cgroups: entered by the thread that starts it, for the start only."""

    _thread_in_cpu = True

    @contextlib.contextmanager
    def placing(self) -> Iterator[Callable[[], None] | None]:
        thread = threading.get_native_id()
        home = _read(Path(f"/proc/self/task/{thread}/cgroup"))
        self.enter(thread)
        try:
            yield None
        finally:
            _go_back(thread, home, self._folders)
            self._residents.discard(thread)

    def release(self) -> None:
        self.sweep()
        self.close_files()
        for folder in self._folders.values():
            _rmdir(folder)


def _go_back(thread: int, home: str, folders: dict[str, Path]) -> None:
    """Move ``thread`` back to the cgroups ``home`` (its /proc cgroup file) lists, in those of ``folders``."""
    for controller in folders:
        path = _cgroup_of(home, controller)
        if path is not None:
            _write(_mounts()[controller] / path.lstrip("/") / "tasks", str(thread))


# --- cgroup v2 ---------------------------------------------------------------------------------------


def _v2_root(mounts: dict[str, Path], own: dict[str, str], name: str) -> Path:
    if "" not in mounts or "" not in own:
        raise OSError(errno.ENOENT, "no cgroup v2 hierarchy mounted")
    parent = mounts[""] / own[""].lstrip("/")
    if not os.access(parent, os.W_OK):
        raise OSError(errno.EACCES, f"the worker's cgroup {own['']} is not delegated to it")
    return parent / name


class CgroupV2(Containment):
    """The v2 hierarchy: the worker's ``root``, its memory limit all its jobs' ``memory`` together
    (where the memory controller is delegated), and under it a cgroup per job and per executor."""

    def __init__(self, root: Path, memory: int) -> None:
        super().__init__()
        self._root = root
        self._numbers = itertools.count()
        root.mkdir()
        available = set(_read(root / "cgroup.controllers").split())
        wanted = [c for c in _V2_CONTROLLERS if c in available]
        if wanted:
            _write(root / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        #: The controllers each job's cgroup has: what it can be limited by.
        self.controllers = set(wanted)
        if "memory" in self.controllers:
            _write(root / "memory.max", str(memory))

    def describe(self) -> str:
        if not self.controllers:
            return (
                "cgroup v2 (kills only: no memory, pids or cpu controller delegated; GPU devices not fenced)"
            )
        return f"cgroup v2 ({', '.join(sorted(self.controllers))} limits; GPU devices not fenced)"

    def box(self) -> Box:
        return BoxV2(self._root / f"job-{next(self._numbers)}", self.controllers)

    def executor_box(self) -> Box:
        return BoxV2(self._root / f"executor-{next(self._numbers)}", self.controllers)

    def close(self) -> None:
        _remove_tree(self._root, _kill_all_v2)

    def clear_leftovers(self) -> None:
        with _leftovers(self._root) as folders:
            for folder in folders:
                _remove_tree(folder, _kill_all_v2)


def _kill_all_v2(folder: Path) -> int:
    """Kill everything in ``folder`` with ``cgroup.kill``, and wait (bounded) for it to be empty."""
    try:
        before = len(_pids(folder / "cgroup.procs"))
    except FileNotFoundError:
        return 0
    if not before:
        return 0
    _write(folder / "cgroup.kill", "1")
    deadline = time.monotonic() + _SWEEP_FOR
    while _pids(folder / "cgroup.procs") and time.monotonic() < deadline:
        time.sleep(0.001)
    return before


class BoxV2(Box):
    """A cgroup v2 folder of one job's (or one executor's) own, made now and removed at release."""

    def __init__(self, folder: Path, controllers: set[str]) -> None:
        folder.mkdir()
        self._folder = folder
        self._controllers = controllers
        self._procs = os.fsencode(folder / "cgroup.procs")
        self._cpu = 0
        self._ooms = 0

    @contextlib.contextmanager
    def placing(self) -> Iterator[Callable[[], None] | None]:
        procs = self._procs

        def enter() -> None:  # in the child, before its exec: no Python object made here
            fd = os.open(procs, os.O_WRONLY)
            os.write(fd, b"0")
            os.close(fd)

        yield enter

    def limit(self, limits: Limits) -> None:
        if "memory" in self._controllers:
            _write(self._folder / "memory.max", str(limits.memory) if limits.memory else "max")
            with contextlib.suppress(OSError):  # resettable from Linux 6.12
                _write(self._folder / "memory.peak", "0")
            self._ooms = _counter(_read(self._folder / "memory.events"), "oom_kill")
        if "pids" in self._controllers:
            _write(self._folder / "pids.max", str(limits.pids) if limits.pids else "max")
        if "cpu" in self._controllers:
            _write(
                self._folder / "cpu.max",
                f"{limits.cpus * _CPU_PERIOD_US if limits.cpus else 'max'} {_CPU_PERIOD_US}",
            )
        self._cpu = _counter(_read(self._folder / "cpu.stat"), "usage_usec")

    def sweep(self, keep: Collection[int] = ()) -> int:
        if not keep:
            return _kill_all_v2(self._folder)
        return kill_listed(self._folder / "cgroup.procs", keep, _member("", self._folder))

    def usage(self) -> Usage:
        cpu = (_counter(_read(self._folder / "cpu.stat"), "usage_usec") - self._cpu) / 1e6
        peak = None
        if "memory" in self._controllers:
            with contextlib.suppress(OSError):
                peak = int(_read(self._folder / "memory.peak"))
        return Usage(cpu, peak)

    def out_of_memory(self) -> bool:
        if "memory" not in self._controllers:
            return False
        before, self._ooms = self._ooms, _counter(_read(self._folder / "memory.events"), "oom_kill")
        return self._ooms > before

    def release(self) -> None:
        _kill_all_v2(self._folder)
        _rmdir(self._folder)
