"""Which waiting jobs need a machine started, and which kinds of machine fit them: pure functions
over placement's own matching (:func:`gpulayer.placement.check`, :func:`~gpulayer.placement.plan`), so a
kind is matched against a job exactly as a connected worker is."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from .. import placement
from ..inventory import WorkerInfo
from ..models import QueueInfo
from ..provisioned import GANG
from ..requirements import Requirements
from ..store.gangs import Waiting
from .provider import MachineKind


@dataclasses.dataclass(frozen=True)
class Demand:
    """Jobs that no connected worker could ever run: those of one queue, or one gang job."""

    #: The queue's name, or :data:`GANG` and the job's id.
    key: str
    requirements: Requirements
    #: Queued jobs (a gang job: 1).
    jobs: int
    #: Machines each job needs together (a gang job's nodes, one per machine).
    nodes: int
    priority: int


def demands(queues: Sequence[QueueInfo], gangs: Sequence[Waiting], workers: list[WorkerInfo]) -> list[Demand]:
    """The demands ``workers`` (the connected ones the autoscaler did not start) could never meet,
    the highest priority first, then the oldest gang jobs and queues by name."""
    found = [
        Demand(queue.name, queue.requirements, queue.depth, 1, queue.priority)
        for queue in queues
        if queue.depth and not placement.plan(queue.requirements, workers).schedulable
    ]
    for gang in gangs:
        nodes = gang.spec.distributed.nodes if gang.spec.distributed else 1
        requirements = gang.spec.requirements
        if not placement.plan(requirements, workers, nodes).schedulable:
            found.append(Demand(GANG + gang.job_id, requirements, 1, nodes, gang.spec.priority))
    return sorted(found, key=lambda demand: -demand.priority)


def fits(requirements: Requirements, kind: MachineKind) -> bool:
    """Whether a machine of ``kind`` could ever run such a job."""
    return placement.check(requirements, kind.offer()).status != "never"


def per_machine(requirements: Requirements, kind: MachineKind) -> int:
    """How many such jobs one machine of ``kind`` runs at once (at least 1, for a kind that fits)."""
    offer = kind.offer()
    room = []
    if requirements.gpus:
        room.append(len(placement.eligible_gpus(requirements, offer.gpus)) // requirements.gpus)
    if requirements.cpus:
        room.append(offer.slots // requirements.cpus)
    if requirements.memory:
        room.append(offer.memory // requirements.memory)
    return max(min(room, default=1), 1)


def cheapest_first(offers: Sequence[tuple[str, MachineKind]]) -> list[tuple[str, MachineKind]]:
    """(provider, kind) pairs by price (unknown prices last), then the smallest first."""
    return sorted(
        offers,
        key=lambda offer: (
            offer[1].price_per_hour is None,
            offer[1].price_per_hour or 0.0,
            offer[1].gpus,
            offer[1].cpus,
            offer[1].memory,
            offer[0],
            offer[1].name,
        ),
    )


def unmet(requirements: Requirements, offers: Sequence[tuple[str, MachineKind]]) -> str:
    """Why no kind fits, in words: ``no provider offers 8 H100s (largest: 4)``."""
    if not offers:
        return "no provider offers any machine (docs/capacity.md says how to configure one)"
    if requirements.gpus:
        largest = max(len(placement.eligible_gpus(requirements, kind.offer().gpus)) for _, kind in offers)
        if largest < requirements.gpus:
            return f"no provider offers {_gpus_text(requirements)} (largest: {largest})"
    reasons = [
        f"{kind.name} on {provider}: " + "; ".join(placement.check(requirements, kind.offer()).reasons)
        for provider, kind in offers
    ]
    return "no provider offers a machine that fits: " + ", ".join(reasons)


def _gpus_text(requirements: Requirements) -> str:
    """``8 H100s``, ``2 GPUs named like 'A100|H100'``, ``4 GPUs of 80 GB each``."""
    wanted, name = requirements.gpus, requirements.gpu_name
    if name and re.fullmatch(r"[A-Za-z0-9-]+", name):
        text = f"{wanted} {name}" + ("s" if wanted > 1 else "")
    else:
        text = f"{wanted} GPU" + ("s" if wanted > 1 else "") + (f" named like {name!r}" if name else "")
    if requirements.gpu_memory is not None:
        text += f" of {placement.memory_text(requirements.gpu_memory)}" + (" each" if wanted > 1 else "")
    return text
