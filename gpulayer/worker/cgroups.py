"""Containment: every job's processes in a cgroup of the job's own, held to what the job asked for,
and all of them killed as it ends, whatever they did to their session, parents or environment.

**cgroup v1** (a controller per hierarchy, as here): a job's cgroup is its slot's. Each slot thread
of the worker moves itself once into cgroups of its own, one per controller, and every process it
starts lands there as it is created (a new process inherits the cgroups of the thread that made it):
no window in which a process runs outside, and no per-job ``mkdir``/``rmdir`` in five hierarchies,
which would cost the worker a sixth of its throughput. A slot runs one job at a time, so between two
jobs its cgroups hold no process but the slot thread: the job's limits are written as it starts,
its counters reset, and its processes killed as it ends. (The CPU quota's cgroup is the exception:
see :class:`.cgroup_v1.SlotBoxV1`.) A warm executor, which outlives the job that
started it, gets cgroups of its own, which the starting thread steps into for the ``fork``.

**cgroup v2** (one hierarchy, where the worker's cgroup is delegated to it): a cgroup per job, made
before its first process and removed after its last; a process enters it before its ``exec`` (the
child writes itself into ``cgroup.procs``), and ``cgroup.kill`` ends them all.

Killing is race-free on both: v2's ``cgroup.kill``; on v1 (whose freezer would freeze the slot
thread too) each process is pinned with a pidfd and checked to be in the cgroup before its SIGKILL,
round after round until none is left (the pids limit bounds a fork bomb).
"""

from __future__ import annotations

import errno
import os
from typing import Literal, cast

from ..errors import ConfigError
from ..inventory import Offer
from ..settings import Settings
from .boxes import Containment, mount_points, own_cgroups
from .cgroup_v1 import CgroupV1, v1_roots
from .cgroup_v2 import CgroupV2, v2_root

Mode = Literal["auto", "cgroup2", "cgroup1", "none"]


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
        mounts, own = mount_points(), own_cgroups()
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
                v2 = CgroupV2(v2_root(mounts, own, name), memory)
                if mode == "auto" and not {"memory", "pids"} <= v2.controllers:
                    kills_only = v2
                    tried.append("cgroup v2 delegates no memory and pids controllers here")
                    continue
                return v2
            v1 = CgroupV1(v1_roots(mounts, own, name), memory)
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


def contain(settings: Settings, name: str, offer: Offer) -> tuple[Containment, Offer]:
    """How this worker contains its jobs (``settings.containment``), and its offer saying so:
    :class:`ConfigError` if a mode asked for by name cannot be had here."""
    try:
        containment = open_containment(cast(Mode, settings.containment), name, offer.memory)
        return containment, offer.model_copy(update={"containment": containment.describe()})
    except OSError as exc:
        raise ConfigError(
            f"GPULAYER_CONTAINMENT={settings.containment}: not available here: {exc.strerror}"
        ) from None
