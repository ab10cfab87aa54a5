"""A worker's slots: the jobs it runs at once, each in a thread of its own, and the jobs claimed for
them and not started yet.

A slot runs its job, then the next claimed one, if any: a busy slot hands nothing to another thread
between two jobs. The claiming loop (:mod:`.claiming`) adds what it claims; a job's end may claim the
slot's next job itself, in the same round trip.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import redis.exceptions

from ..models import JobState
from ..store.execution import Claim, ExecutionStore
from .endings import StopReason
from .runner import JobRunner

log = logging.getLogger("gpulayer.worker")


class Slots:
    """``capacity`` slots. ``prepare`` makes a claimed job's runner (None: the job was refused, and
    failed); ``ended`` is told each time a job ends, ``wake`` set each time a slot frees; ``stopping``
    says to start no more."""

    def __init__(
        self,
        capacity: int,
        store: ExecutionStore,
        *,
        prepare: Callable[[Claim], JobRunner | None],
        ended: Callable[[], None],
        wake: threading.Event,
        stopping: Callable[[], bool],
    ) -> None:
        self.capacity = capacity
        self._store = store
        self._prepare = prepare
        self._ended = ended
        self._wake = wake
        self._stopping = stopping
        self._runners: dict[str, JobRunner] = {}
        self._claimed: deque[Claim] = deque()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=capacity, thread_name_prefix="gpulayer-slot")

    # --- what they hold ---------------------------------------------------------------------------
    def add(self, claims: list[Claim]) -> None:
        """Jobs claimed, to be started in turn."""
        with self._lock:
            self._claimed.extend(claims)

    def claims(self) -> list[Claim]:
        """Every job the slots hold: running, or claimed and about to run."""
        with self._lock:
            return [runner.claim for runner in self._runners.values()] + list(self._claimed)

    def holds(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._runners or any(claim.job_id == job_id for claim in self._claimed)

    def waiting(self) -> bool:
        """Whether jobs were claimed for the slots and are not started yet."""
        with self._lock:
            return bool(self._claimed)

    @property
    def running(self) -> int:
        """How many jobs run now (recording their end included)."""
        return len(self._runners)

    def taken(self) -> int:
        """How many slots are taken: by running jobs, and by jobs claimed for them (a job a runner
        claimed as it ended holds a slot already)."""
        with self._lock:
            return len(self._runners) + len(self._claimed)

    def busy(self) -> int:
        """How many of its jobs are still at work (not only recording their end)."""
        with self._lock:
            return sum(not runner.ending for runner in self._runners.values())

    def memory_held(self, claim: Claim) -> int:
        """The memory the other running jobs asked for."""
        with self._lock:
            return sum(
                runner.spec.requirements.memory
                for runner in self._runners.values()
                if runner.claim is not claim
            )

    # --- running ----------------------------------------------------------------------------------
    def start(self, claim: Claim) -> None:
        """Start the job in a free slot and return at once."""
        runner = self._admit(claim)
        if runner is not None:
            self._pool.submit(self._run_in_slot, runner)

    def next_claimed(self) -> Claim | None:
        """A claimed job, not yet started, for the main loop or a slot that just freed (both take
        from the same queue: checked and taken under one lock); none once the worker stops (the
        claimed jobs then go back to their queues)."""
        with self._lock:
            if self._claimed and not self._stopping():
                return self._claimed.popleft()
        return None

    def _admit(self, claim: Claim) -> JobRunner | None:
        runner = self._prepare(claim)
        if runner is not None:
            with self._lock:
                self._runners[claim.job_id] = runner
        return runner

    def _run_in_slot(self, runner: JobRunner) -> None:
        following: JobRunner | None = runner
        try:
            while following is not None:
                self._run_one(following)
                self._ended()
                following = None
                while following is None and (claim := self.next_claimed()) is not None:
                    following = self._admit(claim)
        except Exception:  # a job it could not refuse (Redis gone) is left to its lease
            log.exception("worker %s: a slot failed between two jobs", self._store.worker)
        finally:
            self._wake.set()  # the slot is free

    def _run_one(self, runner: JobRunner) -> None:
        try:
            runner.run()
        except redis.exceptions.AuthenticationError:
            log.error("job %s: left to its lease: Redis refused this worker's user", runner.job_id)
        except Exception as exc:
            log.exception("job %s: the worker failed running it", runner.job_id)
            try:
                self._store.finish(
                    runner.claim,
                    JobState.FAILED,
                    exit_code=None,
                    reason=f"worker error: {exc}",
                    outputs=None,
                    seconds=0.0,
                )
            except redis.exceptions.RedisError:
                log.error("job %s: could not record the failure", runner.job_id)
        finally:
            with self._lock:
                del self._runners[runner.job_id]

    # --- stopping ---------------------------------------------------------------------------------
    def stop_job(self, job_id: str, reason: StopReason) -> None:
        with self._lock:
            runner = self._runners.get(job_id)
        if runner is not None:
            log.info("job %s: stopping its processes (%s)", job_id, reason)
            runner.stop(reason)

    def stop_all(self, reason: StopReason) -> None:
        with self._lock:
            runners = list(self._runners.values())
        for runner in runners:
            runner.stop(reason)

    def give_back_claimed(self) -> None:
        """Jobs claimed and not started go back to their queues."""
        with self._lock:
            unstarted = [claim.job_id for claim in self._claimed]
            self._claimed.clear()
        if unstarted:
            self._store.requeue(
                "returned",
                f"worker {self._store.worker} stopped before starting the job; it goes back to its queue",
                unstarted,
            )

    def close(self) -> None:
        """Wait for the running jobs; what was claimed and not started goes back to its queue."""
        self.give_back_claimed()
        self._pool.shutdown(wait=True)
        self.give_back_claimed()  # what a job's end claimed before it saw the stop
