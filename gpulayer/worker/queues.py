"""Which queues a worker serves, and in what order it claims from them."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..inventory import WorkerInfo
from ..models import QueueSpec
from ..placement import check
from ..store.execution import QueueOffer


class ServedQueues:
    """The queues whose jobs this worker could ever run, given what it offers; every other queue it
    ignores (it never takes a job it cannot run). Claims go by priority, higher first, and round
    robin among queues of equal priority, so none of them starves.

    The registry is read when a new queue is announced (see ``look_soon``) and every ``interval``
    seconds in case an announcement was missed. One thread updates at a time (the caller's lock);
    others read: an update replaces the served queues whole rather than changing them in place."""

    def __init__(self, me: WorkerInfo, interval: float) -> None:
        self._me = me
        self._interval = interval
        self._due = 0.0
        self._seen: frozenset[str] = frozenset()
        self._served: dict[str, tuple[int, QueueOffer]] = {}
        self._turn = 0

    @property
    def names(self) -> list[str]:
        return sorted(self._served)

    @property
    def due(self) -> bool:
        """Whether the registry should be read now."""
        return time.monotonic() >= self._due

    def look_soon(self) -> None:
        """A new queue was announced: read the registry before the next claim."""
        self._due = 0.0

    def update(self, read: Callable[[], dict[str, QueueSpec]]) -> bool:
        """Read the registry and look at queues not seen before; returns whether any is now served."""
        # Set before the read: an announcement that comes during it makes the next look due.
        self._due = time.monotonic() + self._interval
        registry = read()
        served = dict(self._served)
        for name, spec in registry.items():
            if name in self._seen:
                continue
            fit = check(spec.requirements, self._me)
            if fit.status == "never":
                continue
            # Smallest sufficient GPUs first, so the big ones stay free for the jobs that need them.
            eligible = sorted(fit.eligible, key=lambda gpu: (gpu.memory_total, gpu.index))
            needs = spec.requirements
            offer = QueueOffer(
                name, needs.gpus, needs.cpus, needs.memory, tuple((g.uuid, g.index) for g in eligible)
            )
            served[name] = (spec.priority, offer)
        self._seen = self._seen | registry.keys()
        added = len(served) > len(self._served)
        self._served = served
        return added

    def claim_order(self) -> list[QueueOffer]:
        """Every served queue, highest priority first; each call starts each priority's round one
        queue further."""
        order: list[QueueOffer] = []
        served = self._served
        for priority in sorted({priority for priority, _ in served.values()}, reverse=True):
            group = [offer for name, (p, offer) in sorted(served.items()) if p == priority]
            start = self._turn % len(group)
            order.extend(group[start:] + group[:start])
        self._turn += 1
        return order
