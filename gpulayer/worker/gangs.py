"""Placing gang jobs: any worker may place any waiting gang job on the workers that fit it now.

Placement itself is one script (gang.lua), all or nothing; what happens here is choosing, for each
waiting gang job, the live workers that could ever hold one of its nodes, least busy first. Several
workers may try the same job at once: the script places it once, and the others find it gone.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from ..inventory import SILENT_BEATS, WorkerInfo
from ..placement import candidates
from ..settings import Settings
from ..store.gangs import Candidate, GangStore, Hold, Waiting
from ..store.workers import WorkerStore

log = logging.getLogger("gpulayer.worker")

#: A worker held for a gang job stays held this long (ms) unless the hold is renewed.
HOLD_TTL_MS = 10_000
#: After one worker tried to place gang jobs, others wait this long (ms) before they try.
TURN_MS = 100


class GangPlacer:
    def __init__(
        self, gangs: GangStore, workers: WorkerStore, *, name: str, hold: Hold, lease_ms: int
    ) -> None:
        self._name = name
        self._gangs = gangs
        self._workers = workers
        self._hold = hold
        self._lease_ms = lease_ms

    def place(self) -> int | None:
        """Try every waiting gang job, oldest first; returns how many still wait, or None when another
        worker has just tried (one at a time)."""
        waiting = self._gangs.waiting()
        if not waiting:
            return 0  # nothing written: an idle installation stays untouched
        if not self._gangs.take_turn(self._name, TURN_MS):
            return None
        live = self._live(self._workers.list())
        holder = True  # only the oldest gang job that some set of workers could hold may hold them
        left = 0
        for job in waiting:
            offered = self._candidates(job, live)
            nodes = job.spec.distributed.nodes if job.spec.distributed else 1
            if len(offered) < nodes:
                # No set of connected workers could ever hold it: it holds nothing, blocks nobody.
                left += 1
                continue
            outcome, workers = self._gangs.place(
                job, offered, may_hold=holder, hold=self._hold, lease_ms=self._lease_ms
            )
            holder = False
            if outcome == "placed":
                log.info("gang job %s: placed on %s", job.job_id, ", ".join(workers))
            elif outcome != "gone":
                left += 1
        return left

    @staticmethod
    def _live(workers: list[WorkerInfo]) -> list[WorkerInfo]:
        """The workers heard from lately: a node given to one that died would only hold the job up."""
        now = datetime.now(timezone.utc)
        return [
            worker
            for worker in workers
            if worker.last_heartbeat is not None
            and (now - worker.last_heartbeat).total_seconds() <= worker.heartbeat * SILENT_BEATS
        ]

    @staticmethod
    def _candidates(job: Waiting, workers: list[WorkerInfo]) -> list[Candidate]:
        by_name = {worker.name: worker for worker in workers}
        offered = []
        for fit in candidates(job.spec.requirements, workers):
            if fit.status == "never":
                continue
            worker = by_name[fit.worker]
            # Smallest sufficient GPUs first, so the big ones stay free for the jobs that need them.
            eligible = sorted(fit.eligible, key=lambda gpu: (gpu.memory_total, gpu.index))
            offered.append(
                Candidate(
                    worker.name, worker.slots, worker.memory, tuple((g.uuid, g.index) for g in eligible)
                )
            )
        return offered


def gang_hold(settings: Settings) -> Hold:
    """How long a worker held for a gang job waits for the rest before it is let go (ms)."""
    return Hold(int(settings.gang_hold_after * 1000), HOLD_TTL_MS)
