"""Where a job can run, and why not elsewhere: pure functions of requirements and workers, no IO.

A worker can *never* run a job its hardware, packages or labels cannot serve; it is *busy* when it
could, but what the job needs is held by other jobs now; otherwise the job *fits*. Among fitting
workers, the least busy one is chosen (spread).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel

from .inventory import GPU, WorkerInfo
from .requirements import Requirements, parse_framework
from .units import format_size

Status = Literal["fits", "busy", "never"]
NO_WORKERS = "no workers are connected"


@dataclasses.dataclass(frozen=True)
class Fit:
    """How one worker stands with one job's requirements."""

    worker: str
    status: Status
    reasons: tuple[str, ...] = ()
    #: A code per reason, for programs (``no_gpu``, ``gpu_memory``, ``gpus_busy``, ...: see :data:`CODES`).
    codes: tuple[str, ...] = ()
    #: GPUs the job may use on this worker (right kind, memory and name), free or not.
    eligible: tuple[GPU, ...] = ()


#: What a reason's code means. A worker can never run the job: ``no_workers``, ``no_gpu``,
#: ``accelerator``, ``gpu_count``, ``gpu_memory``, ``gpu_name``, ``cpus``, ``memory``, ``framework``,
#: ``label``, ``target``; not now: ``gpus_busy``, ``cpus_busy``, ``memory_busy``; a gang job: ``gang``.
CODES = (
    "no_workers",
    "no_gpu",
    "accelerator",
    "gpu_count",
    "gpu_memory",
    "gpu_name",
    "cpus",
    "memory",
    "framework",
    "label",
    "target",
    "gpus_busy",
    "cpus_busy",
    "memory_busy",
    "gang",
)


class Reason(BaseModel):
    """Why a worker cannot run a job now; ``worker`` is None when no worker is connected."""

    worker: str | None
    reason: str
    #: The reasons as codes (:data:`CODES`), in the same order as the text's.
    codes: list[str] = []


class Plan(BaseModel):
    """Where a job would run now, and why not elsewhere."""

    #: The least busy worker that could start it now, if any (for a gang job: node 0's).
    worker: str | None
    #: Whether some connected worker could ever run it (it may be busy now); for a gang job, whether
    #: enough distinct workers could.
    schedulable: bool
    #: One line per worker that cannot start it now (for a gang job, first a line for the gang).
    reasons: list[Reason]
    #: For a gang job that could start now: the workers of its nodes, node 0 first.
    workers: list[str] = []
    #: The job's nodes: 1, or the distinct workers a gang job needs.
    nodes: int = 1
    #: What the autoscaler last decided for it, where one runs (docs/capacity.md): ``starting a worker
    #: of kind X on provider P (est. 2 min)``, ``no provider offers 8 H100s (largest: 4)``.
    capacity: str | None = None

    def lines(self) -> list[str]:
        """The plan in words: where it would start, or a heading and one line per worker why not."""
        if self.workers:
            heading = f"would start on {', '.join(self.workers)} now (the least busy workers that fit)"
        elif self.worker:
            heading = f"would start on {self.worker} now (the least busy worker that fits)"
        elif self.schedulable:
            heading = "waiting for busy workers:" if self.nodes > 1 else "waiting for a busy worker:"
        elif self.nodes > 1:
            heading = f"no {self.nodes} connected workers could ever run this gang job together:"
        else:
            heading = "no connected worker could ever run this job:"
        lines = [heading] + [
            f"  {reason.worker}: {reason.reason}" if reason.worker else f"  {reason.reason}"
            for reason in self.reasons
        ]
        return lines + ([f"capacity: {self.capacity}"] if self.capacity else [])


def eligible_gpus(requirements: Requirements, gpus: list[GPU]) -> list[GPU]:
    """The GPUs a job may use: the right kind, enough memory, a matching name."""
    if not requirements.gpus:
        return []
    pattern = re.compile(requirements.gpu_name, re.IGNORECASE) if requirements.gpu_name else None
    return [
        gpu
        for gpu in gpus
        if requirements.accelerator in ("any", gpu.kind)
        and (requirements.gpu_memory is None or gpu.memory_total >= requirements.gpu_memory)
        and (pattern is None or pattern.search(gpu.name))
    ]


def check(requirements: Requirements, worker: WorkerInfo) -> Fit:
    never = _never(requirements, worker)
    if never:
        return Fit(worker.name, "never", *_split(never))
    eligible = tuple(eligible_gpus(requirements, worker.gpus))
    busy = _busy(requirements, worker, eligible)
    return Fit(worker.name, "busy" if busy else "fits", *_split(busy), eligible)


def _split(reasons: list[tuple[str, str]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(code, text) pairs as the texts and the codes."""
    return tuple(text for _, text in reasons), tuple(code for code, _ in reasons)


def plan(requirements: Requirements, workers: list[WorkerInfo], nodes: int = 1) -> Plan:
    """Where a job would start now, or why not; ``nodes`` > 1: a gang job, one node per worker."""
    if not workers:
        reasons = [Reason(worker=None, reason=NO_WORKERS, codes=["no_workers"])]
        return Plan(worker=None, schedulable=False, reasons=reasons)
    fits = candidates(requirements, workers)
    fitting = [fit.worker for fit in fits if fit.status == "fits"]
    could = sum(fit.status != "never" for fit in fits)
    reasons = [
        Reason(worker=fit.worker, reason="; ".join(fit.reasons), codes=list(fit.codes))
        for fit in fits
        if fit.reasons
    ]
    if nodes == 1:
        return Plan(worker=fitting[0] if fitting else None, schedulable=could > 0, reasons=reasons)
    chosen = fitting[:nodes] if len(fitting) >= nodes else []
    if not chosen:
        gang = (
            f"needs {nodes} workers that can each hold one node: {could} could ever, {len(fitting)} can now"
        )
        reasons.insert(0, Reason(worker=None, reason=gang, codes=["gang"]))
    first = chosen[0] if chosen else None
    return Plan(worker=first, workers=chosen, schedulable=could >= nodes, reasons=reasons, nodes=nodes)


def candidates(requirements: Requirements, workers: list[WorkerInfo]) -> list[Fit]:
    """How each worker stands with the job, least busy first (ties by name): the order a job's
    workers are chosen in."""
    loads = {worker.name: worker.load for worker in workers}
    fits = [check(requirements, worker) for worker in workers]
    return sorted(fits, key=lambda fit: (loads[fit.worker], fit.worker))


def _never(requirements: Requirements, worker: WorkerInfo) -> list[tuple[str, str]]:
    reasons = [*_target_never(requirements, worker), *_gpu_never(requirements, worker.gpus)]
    if requirements.cpus > worker.slots:
        reasons.append(("cpus", f"needs {requirements.cpus} CPU slots, has {worker.slots}"))
    if requirements.memory > worker.memory:
        needs = f"needs {format_size(requirements.memory)} of memory, has {format_size(worker.memory)}"
        reasons.append(("memory", needs))
    for text in requirements.frameworks:
        wanted = parse_framework(text)
        installed = worker.frameworks.get(wanted.name)
        if installed is None:
            reasons.append(("framework", f"needs {text}, which is not installed"))
        elif not _satisfies(installed, wanted):
            reasons.append(("framework", f"needs {text}, has {wanted.name} {installed}"))
    for key, value in requirements.labels.items():
        if key not in worker.labels:
            reasons.append(("label", f"needs label {key}={value}, has no label {key}"))
        elif worker.labels[key] != value:
            reasons.append(("label", f"needs label {key}={value}, has {key}={worker.labels[key]}"))
    return reasons


def _target_never(requirements: Requirements, worker: WorkerInfo) -> list[tuple[str, str]]:
    """Why the worker is on the wrong machine for the job's target, if it is (or cannot say)."""
    target = requirements.target
    if target == "any":
        return []
    if worker.machine is None:
        return [("target", f"target {target}: it does not say which machine it is on (an older worker)")]
    if (worker.machine == requirements.machine) != (target == "local"):
        where = "another machine than" if target == "local" else "the same machine as"
        return [("target", f"target {target}: it is on {where} the submitter")]
    return []


def _satisfies(version: str, wanted: Requirement) -> bool:
    try:
        return wanted.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _gpu_never(requirements: Requirements, gpus: list[GPU]) -> list[tuple[str, str]]:
    wanted, accelerator = requirements.gpus, requirements.accelerator
    if not wanted:
        return []
    kinds = sorted({gpu.kind for gpu in gpus})
    if not gpus:
        return [("no_gpu", f"needs {_accelerator_text(accelerator)}, has no GPU")]
    if accelerator != "any" and accelerator not in kinds:
        return [("accelerator", f"needs {accelerator}, has {' and '.join(kinds)} only")]
    same_kind = [gpu for gpu in gpus if accelerator in ("any", gpu.kind)]
    if len(same_kind) < wanted:
        return [("gpu_count", f"needs {wanted} GPUs, has {len(same_kind)}")]
    if requirements.gpu_memory is not None:
        big_enough = [gpu for gpu in same_kind if gpu.memory_total >= requirements.gpu_memory]
        if len(big_enough) < wanted:
            largest = max(gpu.memory_total for gpu in same_kind)
            per = "per GPU" if wanted == 1 else f"on each of {wanted} GPUs"
            needs = f"needs {memory_text(requirements.gpu_memory)} {per}, largest is {memory_text(largest)}"
            return [("gpu_memory", needs)]
    matching = eligible_gpus(requirements, gpus)
    if len(matching) < wanted:
        names = ", ".join(sorted({gpu.name for gpu in same_kind}))
        needs = f"needs {wanted} GPU(s) named like {requirements.gpu_name!r}, has {len(matching)} ({names})"
        return [("gpu_name", needs)]
    return []


def _busy(requirements: Requirements, worker: WorkerInfo, eligible: tuple[GPU, ...]) -> list[tuple[str, str]]:
    reasons: list[tuple[str, str]] = []
    if requirements.gpus:
        free = [gpu for gpu in eligible if gpu.uuid not in worker.gpus_busy]
        if len(free) < requirements.gpus:
            if not free:
                busy = f"all {len(eligible)} GPUs busy" if len(eligible) > 1 else "its GPU is busy"
                reasons.append(("gpus_busy", busy))
            else:
                reasons.append(
                    ("gpus_busy", f"needs {requirements.gpus} GPUs, {len(free)} of {len(eligible)} free")
                )
    if requirements.cpus and worker.cpus_used + requirements.cpus > worker.slots:
        reasons.append(
            ("cpus_busy", f"{worker.cpus_used} of {worker.slots} CPU slots busy, needs {requirements.cpus}")
        )
    if requirements.memory and worker.memory_used + requirements.memory > worker.memory:
        free_memory = format_size(max(worker.memory - worker.memory_used, 0))
        reasons.append(
            ("memory_busy", f"needs {format_size(requirements.memory)} of memory, {free_memory} free")
        )
    return reasons


def _accelerator_text(accelerator: str) -> str:
    return "a GPU" if accelerator == "any" else accelerator


def memory_text(size: int) -> str:
    """GPU memory as people say it: ``24 GB`` when given in GB, ``80 GiB`` for a device, else GiB."""
    for unit, name in ((10**9, "GB"), (2**30, "GiB")):
        if size % unit == 0:
            return f"{size // unit} {name}"
    return f"{size / 2**30:.1f} GiB"
