"""How a worker claims: as many jobs as it has free slots, with one Lua script that reserves each
job's GPUs and slots as it pops it (atomic across queues; never more than fits), woken by a submit,
a freed slot or a placed gang part rather than blocking on the queues; and, while gang jobs wait,
its turns at placing them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import redis.exceptions

from ..inventory import Offer
from ..store.execution import Claimed, ClaimRequest, ExecutionStore
from .gangs import GangPlacer
from .queues import ServedQueues
from .slots import Slots

log = logging.getLogger("gpulayer.worker")

#: Set to ``exit-after-claim`` (tests only), a worker dies right after claiming: the dequeue window.
FAULT_VARIABLE = "GPULAYER_TEST_FAULT"
#: Longest sleep (s) without looking at the queues, should a wake-up message be lost.
POLL_INTERVAL = 1.0
#: Woken by a submit while busy, a worker waits this long times how busy it is (0 to 1) before it
#: claims, so a less busy worker that fits takes the job first (spread).
SPREAD_DELAY = 0.05
#: While gang jobs wait for workers, a worker tries to place them at most this often (s), besides
#: when one is submitted and when one of its own jobs ends.
PLACE_INTERVAL = 0.5

Outcome = Literal["took", "nothing", "full", "again"]


class ClaimLoop:
    """Claims for ``slots`` what ``offer`` can run from the ``served`` queues (``refresh`` looks for
    new ones), and places waiting gang jobs with ``placer``; ``wake`` ends its waits."""

    #: The last claim took fewer jobs than it asked for: see :meth:`turn`.
    _drained = False
    _submitted = False

    def __init__(
        self,
        store: ExecutionStore,
        slots: Slots,
        served: ServedQueues,
        placer: GangPlacer,
        offer: Offer,
        *,
        lease_ttl: float,
        wake: threading.Event,
        refresh: Callable[[], None],
        stopping: Callable[[], bool],
    ) -> None:
        self._store, self._slots, self._served, self._placer = store, slots, served, placer
        self._offer, self._lease_ttl = offer, lease_ttl
        self._wake, self._refresh, self._stopping = wake, refresh, stopping
        #: Gang jobs waiting for workers, as last seen; set to place them at the next turn of the loop.
        self._gangs = 0
        self._place_now = False
        self._next_placement = 0.0
        #: Set when a part of a gang job was placed on this worker: claim it even if full.
        self._parts = False

    def turn(self) -> Outcome:
        """One turn of the loop: new queues, gang placement if due, then a claim for the free slots
        (and any gang part placed here): it took jobs; it found nothing to take; the slots are full;
        or a slot freed meanwhile (look again)."""
        self._refresh()
        if self._place_now or (self._gangs and time.monotonic() >= self._next_placement):
            self._place_gangs()
        # Cleared before anything it decides on is read: what sets a flag and then wakes this loop
        # after the read still wakes the wait that follows. (Cleared after, a submit that came
        # between the two slept a poll's interval.)
        self._wake.clear()
        free = self._slots.capacity - self._slots.taken()
        busy = self._slots.busy()
        if free <= 0 and not self._parts:
            # Full: nothing to claim until a runner ends, which wakes this loop again.
            return "again" if self._slots.running < self._slots.capacity else "full"
        if self._drained and not (self._submitted or self._parts):
            # The last claim came back short: nothing more until a submit, a placed part or a quiet
            # poll says so. A freed slot's resources were offered to that slot's own claim already.
            return "nothing"
        if self._submitted and busy and free > 0:
            self._spread(busy)
        self._submitted = self._parts = False
        wanted = max(free, 0)
        if self._took(self._store.claim(self._claim_request(wanted)), wanted):
            self._wake.set()
        if self._slots.waiting():
            return "took"
        return "nothing" if free > 0 else "full"

    def idle(self) -> bool:
        """Sleep until woken (a submit, a freed slot, a placed part) or a poll's interval passes:
        whether it passed."""
        if self._served.due:
            return False  # a new queue was announced since this turn of the loop looked
        woken = self._wake.wait(POLL_INTERVAL)
        if not woken:
            self._drained = False  # a wake-up may have been lost: look again
        return not woken

    def next_claim(self) -> ClaimRequest | None:
        """What a runner claims as its job ends, in the same round trip: one job for its slot; none
        once the worker is stopping."""
        if self._stopping():
            return None
        try:
            self._refresh()
        except redis.exceptions.RedisError as exc:  # the job's end must still be recorded
            log.error("worker %s: could not look for new queues: %s", self._store.worker, exc)
        return self._claim_request(1)

    def took_for_slot(self, claimed: Claimed) -> None:
        """What a runner's claim for its own slot took: started by that slot's thread once its job
        is over."""
        self._took(claimed, 1)

    def job_ended(self) -> None:
        """What a job held is free: a waiting gang job may fit now."""
        if self._gangs:
            self._place_now = True
            self._wake.set()

    # --- wake-ups, from the worker's subscriptions -------------------------------------------------
    def on_wake(self, message: dict[Any, Any]) -> None:
        job_id = message.get("data")
        # Published after this worker already took the job: nothing new is waiting.
        if job_id is None or not self._slots.holds(job_id.decode()):
            self._submitted = True
            self._wake.set()

    def on_gang(self, message: dict[Any, Any]) -> None:
        self._place_now = True
        self._wake.set()

    def on_part(self, message: dict[Any, Any]) -> None:
        self._parts = True
        self._wake.set()

    def on_new_queue(self, message: dict[Any, Any]) -> None:
        self._served.look_soon()
        self._submitted = True
        self._wake.set()

    def on_change(self) -> None:
        # Messages may have been missed while (re)subscribing: act as if each kind had come.
        self._parts = self._place_now = True
        self.on_wake({})

    # --- inside --------------------------------------------------------------------------------------
    def _took(self, claimed: Claimed, wanted: int) -> bool:
        """Hand the jobs a claim for ``wanted`` took to the slots, to be started in turn: whether it
        took any."""
        claims, self._gangs = claimed
        self._drained = len(claims) < wanted
        if claims and os.environ.get(FAULT_VARIABLE) == "exit-after-claim":
            os._exit(9)
        self._slots.add(claims)
        return bool(claims)

    def _spread(self, busy: int) -> None:
        """Let a less busy worker take a job submitted while this one is busy: wait SPREAD_DELAY
        times how busy it is, but no longer than its jobs are at work. (A wake-up that crossed this
        worker's own claim of its job would otherwise hold back the next submit for the whole
        delay: one idle dispatch in ten took 22 ms.)"""
        deadline = time.monotonic() + SPREAD_DELAY * busy / self._slots.capacity
        while (left := deadline - time.monotonic()) > 0 and self._slots.busy():
            self._wake.clear()
            self._wake.wait(left)

    def _place_gangs(self) -> None:
        """Try to place the waiting gang jobs (on any workers, this one or not)."""
        self._place_now = False
        self._next_placement = time.monotonic() + PLACE_INTERVAL
        try:
            waiting = self._placer.place()
            # Not this worker's turn: another just tried; try again at the next interval regardless.
            self._gangs = max(self._gangs, 1) if waiting is None else waiting
        except redis.exceptions.ResponseError as exc:
            # A record the script cannot read must not stop the worker; the next try may do better.
            log.error("worker %s: placing gang jobs failed: %s", self._store.worker, exc)

    def _claim_request(self, limit: int) -> ClaimRequest:
        offer = self._offer
        return ClaimRequest(
            self._served.claim_order(), limit, offer.slots, offer.memory, int(self._lease_ttl * 1000)
        )
