"""Which queues a worker serves, and in what order it claims from them."""

from __future__ import annotations

from ..inventory import WorkerInfo
from ..models import QueueSpec
from ..placement import check
from ..store.execution import QueueOffer


class ServedQueues:
    """The queues whose jobs this worker could ever run, given what it offers; every other queue it
    ignores (it never takes a job it cannot run). Claims go by priority, higher first, and round
    robin among queues of equal priority, so none of them starves."""

    def __init__(self, me: WorkerInfo) -> None:
        self._me = me
        self._seen: set[str] = set()
        self._served: dict[str, tuple[int, QueueOffer]] = {}
        self._turn = 0

    @property
    def names(self) -> list[str]:
        return sorted(self._served)

    def update(self, registry: dict[str, QueueSpec]) -> bool:
        """Look at queues not seen before; returns whether any is now served."""
        added = False
        for name, spec in registry.items():
            if name in self._seen:
                continue
            self._seen.add(name)
            fit = check(spec.requirements, self._me)
            if fit.status == "never":
                continue
            # Smallest sufficient GPUs first, so the big ones stay free for the jobs that need them.
            eligible = sorted(fit.eligible, key=lambda gpu: (gpu.memory_total, gpu.index))
            needs = spec.requirements
            offer = QueueOffer(
                name, needs.gpus, needs.cpus, needs.memory, tuple((g.uuid, g.index) for g in eligible)
            )
            self._served[name] = (spec.priority, offer)
            added = True
        return added

    def claim_order(self) -> list[QueueOffer]:
        """Every served queue, highest priority first; each call starts each priority's round one
        queue further."""
        order: list[QueueOffer] = []
        for priority in sorted({priority for priority, _ in self._served.values()}, reverse=True):
            group = [offer for name, (p, offer) in sorted(self._served.items()) if p == priority]
            start = self._turn % len(group)
            order.extend(group[start:] + group[:start])
        self._turn += 1
        return order
