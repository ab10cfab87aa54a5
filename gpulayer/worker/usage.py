"""What a job used — CPU time, peak memory, peak GPU memory — measured by its worker as it runs and
ends, for its record.

A runner asks one :class:`Meter` per job, whatever measures it: today's read what the OS reports of
processes (``wait4`` of a job's leaders, ``/proc`` of a warm executor); a meter that reads a job's
cgroup can take their place. Peak GPU memory is sampled apart (:class:`GpuMemory`), as it is the
same for every kind of job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import psutil

from ..inventory import GPU
from ..models import JobUsage
from .spawning import Started

log = logging.getLogger("gpulayer.worker")

#: ``ru_maxrss`` is in KiB on Linux, in bytes on macOS.
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


class Meter(Protocol):
    """Measures one job's processes, from before they start to after they all ended."""

    def begin(self) -> None:
        """Before the job's first process starts (or a warm executor takes its call)."""

    def reaped(self, used: resource.struct_rusage | None) -> None:
        """One of the job's processes was reaped: what it used, with the children it waited for
        (None where the OS did not say)."""

    def end(self) -> JobUsage:
        """What the job used, once every process of it ended (or its call returned)."""


class LeadersMeter:
    """A command's, or a gang part's ranks: what its leaders used, as ``wait4`` reports each as it is
    reaped — the leader itself and every descendant it waited for. A process that left its parent
    (a daemon) is not counted. Peak memory is the largest resident set of any one of them."""

    def __init__(self) -> None:
        self._cpu = 0.0
        self._peak: int | None = None

    def begin(self) -> None:
        """Nothing to note: a leader's usage starts at zero."""

    def reaped(self, used: resource.struct_rusage | None) -> None:
        if used is None:
            return
        self._cpu += used.ru_utime + used.ru_stime
        self._peak = max(self._peak or 0, used.ru_maxrss * _MAXRSS_UNIT)

    def end(self) -> JobUsage:
        return JobUsage(cpu_seconds=round(self._cpu, 6), peak_memory=self._peak)


class ExecutorMeter:
    """A call in a warm executor: the executor's CPU time over the call (with that of the children it
    reaped meanwhile), not over its life; and its peak resident set during the call, where Linux
    lets the peak be reset as the call begins (``/proc/<pid>/clear_refs``), else unknown. Should the
    executor die in the call, what ``wait4`` said of it."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._start: float | None = None
        self._reset = False
        self._died: resource.struct_rusage | None = None

    def begin(self) -> None:
        self._start = self._cpu()
        self._reset = _reset_peak(self._pid)

    def reaped(self, used: resource.struct_rusage | None) -> None:
        self._died = used

    def end(self) -> JobUsage:
        start = self._start or 0.0
        if self._died is not None:
            cpu = self._died.ru_utime + self._died.ru_stime
            return JobUsage(
                cpu_seconds=round(max(cpu - start, 0.0), 6), peak_memory=self._died.ru_maxrss * _MAXRSS_UNIT
            )
        now = self._cpu()
        peak = _peak(self._pid) if self._reset else None
        return JobUsage(cpu_seconds=round(max((now or start) - start, 0.0), 6), peak_memory=peak)

    def _cpu(self) -> float | None:
        """The executor's CPU time so far, with its reaped children's; None once it is gone."""
        try:
            return _proc_cpu(self._pid) if _PROC else _psutil_cpu(self._pid)
        except (OSError, ValueError, IndexError, psutil.Error):
            return None


#: Linux's /proc: read directly, a call's meter costs a third of what psutil's reads do.
_PROC = sys.platform.startswith("linux")
_TICKS = os.sysconf("SC_CLK_TCK") if _PROC else 100


def _proc_cpu(pid: int) -> float:
    """utime + stime + cutime + cstime of ``/proc/<pid>/stat`` (fields 14 to 17), in seconds."""
    fields = _read(f"/proc/{pid}/stat").rpartition(b")")[2].split()
    return sum(int(field) for field in fields[11:15]) / _TICKS


def _psutil_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system + times.children_user + times.children_system)


def _reset_peak(pid: int) -> bool:
    """Reset ``pid``'s peak resident set to what it holds now (Linux 4.0 and later); whether it was."""
    if not _PROC:
        return False
    try:
        fd = os.open(f"/proc/{pid}/clear_refs", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.write(fd, b"5")
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _peak(pid: int) -> int | None:
    """``pid``'s peak resident set (bytes) since it was last reset; None if it cannot be read."""
    try:
        status = _read(f"/proc/{pid}/status")
        start = status.index(b"VmHWM:") + len(b"VmHWM:")
        return int(status[start : status.index(b"kB", start)]) * 1024
    except (OSError, ValueError):
        return None


def _read(path: str) -> bytes:
    """A small file of /proc, in one read (its files here are under a page or two)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 16384)
    finally:
        os.close(fd)


def wait(process: Started) -> tuple[int, resource.struct_rusage | None]:
    """Reap ``process``: its return code, and what it used (None if it was reaped elsewhere)."""
    if process.returncode is None:
        try:
            _, status, used = os.wait4(process.pid, 0)
        except ChildProcessError:
            return process.wait(), None
        process.returncode = os.waitstatus_to_exitcode(status)
        return process.returncode, used
    return process.wait(), None


class GpuMemory:
    """How much GPU memory given processes hold on given GPUs, through NVML (opened once per worker).
    Only for NVIDIA GPUs NVML can read: a simulated GPU (``GPULAYER_FAKE_GPUS``) has no memory to
    read, and a job on one has no peak GPU memory."""

    def __init__(self, nvml: Any, handles: dict[int, Any]) -> None:
        self._nvml = nvml
        self._handles = handles

    @classmethod
    def open(cls, gpus: Sequence[GPU]) -> GpuMemory | None:
        """For the worker's GPUs that NVML reads; None if there are none, or NVML cannot start."""
        readable = [gpu for gpu in gpus if gpu.kind == "cuda" and not gpu.simulated]
        if not readable:
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = {gpu.index: pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid) for gpu in readable}
        except Exception as exc:  # NVML missing or broken: jobs go without GPU memory, said once
            log.warning("usage: cannot read GPU memory through NVML: %s", exc)
            return None
        return cls(pynvml, handles)

    def used(self, gpus: Iterable[int], pids: set[int]) -> int | None:
        """The GPU memory (bytes) ``pids`` hold on ``gpus`` now; None if none of them can be read."""
        total: int | None = None
        for index in gpus:
            handle = self._handles.get(index)
            if handle is None:
                continue
            with contextlib.suppress(self._nvml.NVMLError):
                found = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
                total = (total or 0) + sum(one.usedGpuMemory or 0 for one in found if one.pid in pids)
        return total

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
