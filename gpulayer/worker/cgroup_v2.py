"""cgroup v2 (one hierarchy, the worker's cgroup delegated to it): a cgroup per job, entered by
each process before its ``exec`` and ended with ``cgroup.kill``."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from .boxes import (
    CPU_PERIOD_US,
    SWEEP_FOR,
    Box,
    Containment,
    Limits,
    Usage,
    kill_listed,
    leftovers,
    member_of,
    pids_in,
    read_file,
    remove_cgroup,
    remove_tree,
    stat_counter,
    write_file,
)

#: The v2 controllers a job's cgroup is limited with, where the worker's cgroup delegates them.
_V2_CONTROLLERS = ("memory", "pids", "cpu")


def v2_root(mounts: dict[str, Path], own: dict[str, str], name: str) -> Path:
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
        available = set(read_file(root / "cgroup.controllers").split())
        wanted = [c for c in _V2_CONTROLLERS if c in available]
        if wanted:
            write_file(root / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        #: The controllers each job's cgroup has: what it can be limited by.
        self.controllers = set(wanted)
        if "memory" in self.controllers:
            write_file(root / "memory.max", str(memory))

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
        remove_tree(self._root, _kill_all_v2)

    def clear_leftovers(self) -> None:
        with leftovers(self._root) as folders:
            for folder in folders:
                remove_tree(folder, _kill_all_v2)


def _kill_all_v2(folder: Path) -> int:
    """Kill everything in ``folder`` with ``cgroup.kill``, and wait (bounded) for it to be empty."""
    try:
        before = len(pids_in(folder / "cgroup.procs"))
    except FileNotFoundError:
        return 0
    if not before:
        return 0
    write_file(folder / "cgroup.kill", "1")
    deadline = time.monotonic() + SWEEP_FOR
    while pids_in(folder / "cgroup.procs") and time.monotonic() < deadline:
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
            write_file(self._folder / "memory.max", str(limits.memory) if limits.memory else "max")
            with contextlib.suppress(OSError):  # resettable from Linux 6.12
                write_file(self._folder / "memory.peak", "0")
            self._ooms = stat_counter(read_file(self._folder / "memory.events"), "oom_kill")
        if "pids" in self._controllers:
            write_file(self._folder / "pids.max", str(limits.pids) if limits.pids else "max")
        if "cpu" in self._controllers:
            write_file(
                self._folder / "cpu.max",
                f"{limits.cpus * CPU_PERIOD_US if limits.cpus else 'max'} {CPU_PERIOD_US}",
            )
        self._cpu = stat_counter(read_file(self._folder / "cpu.stat"), "usage_usec")

    def sweep(self, keep: Collection[int] = ()) -> int:
        if not keep:
            return _kill_all_v2(self._folder)
        return kill_listed(self._folder / "cgroup.procs", keep, member_of("", self._folder))

    def usage(self) -> Usage:
        cpu = (stat_counter(read_file(self._folder / "cpu.stat"), "usage_usec") - self._cpu) / 1e6
        peak = None
        if "memory" in self._controllers:
            with contextlib.suppress(OSError):
                peak = int(read_file(self._folder / "memory.peak"))
        return Usage(cpu, peak)

    def out_of_memory(self) -> bool:
        if "memory" not in self._controllers:
            return False
        before, self._ooms = self._ooms, stat_counter(read_file(self._folder / "memory.events"), "oom_kill")
        return self._ooms > before

    def release(self) -> None:
        _kill_all_v2(self._folder)
        remove_cgroup(self._folder)
