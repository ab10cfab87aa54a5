"""cgroup v1 (a controller per hierarchy): each slot thread's cgroups, which every job the slot
runs shares (see :mod:`.cgroups` for why), and each warm executor's own."""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from .boxes import (
    CPU_PERIOD_US,
    Box,
    Containment,
    Limits,
    Usage,
    cgroup_of,
    kill_listed,
    leftovers,
    member_of,
    mount_points,
    read_file,
    remove_cgroup,
    remove_tree,
    stat_counter,
    write_file,
)

#: NVIDIA's character device major: ``/dev/nvidia<minor>`` is GPU ``minor``; 255 is ``nvidiactl``.
NVIDIA_MAJOR = 195
#: The v1 controllers a slot needs, and the one (optional) that fences GPU devices.
_V1_NEEDED = ("memory", "pids", "cpu", "cpuacct")
_V1_DEVICES = "devices"


def v1_roots(mounts: dict[str, Path], own: dict[str, str], name: str) -> dict[str, Path]:
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
        write_file(roots["memory"] / "memory.limit_in_bytes", str(memory))

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
            remove_tree(root, functools.partial(_sweep_v1, controller))

    def clear_leftovers(self) -> None:
        for controller, root in self._roots.items():
            with leftovers(root) as folders:
                for folder in folders:
                    remove_tree(folder, functools.partial(_sweep_v1, controller))


def _sweep_v1(controller: str, folder: Path) -> int:
    return kill_listed(folder / "cgroup.procs", (), member_of(controller, folder))


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
        self._member = member_of("pids", folders["pids"])
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
                write_file(folder / "tasks", str(thread))
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
        self._set("cpu", "cpu.cfs_quota_us", str(limits.cpus * CPU_PERIOD_US) if limits.cpus else "-1")
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
            write_file(self._folders[controller] / name, value)
            self._written[key] = value

    def _fence(self, denied: frozenset[int]) -> None:
        devices = self._folders[_V1_DEVICES]
        for minor in self._denied - denied:
            write_file(devices / "devices.allow", f"c {NVIDIA_MAJOR}:{minor} rwm")
        for minor in denied - self._denied:
            write_file(devices / "devices.deny", f"c {NVIDIA_MAJOR}:{minor} rwm")
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
        return stat_counter(os.pread(self._fds["ooms"], 4096, 0).decode(), "oom_kill")

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
        home = read_file(Path(f"/proc/self/task/{thread}/cgroup"))
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
            remove_cgroup(folder)


def _go_back(thread: int, home: str, folders: dict[str, Path]) -> None:
    """Move ``thread`` back to the cgroups ``home`` (its /proc cgroup file) lists, in those of ``folders``."""
    for controller in folders:
        path = cgroup_of(home, controller)
        if path is not None:
            write_file(mount_points()[controller] / path.lstrip("/") / "tasks", str(thread))


# --- cgroup v2 ---------------------------------------------------------------------------------------
