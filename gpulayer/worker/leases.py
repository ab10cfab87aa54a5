"""The worker's heartbeat, in a thread of its own so nothing else the worker does can delay it.

Every beat renews the worker's registration and the lease of each job it runs, stops the jobs that
were cancelled or that it no longer owns, and runs the reaper. A worker that cannot renew its
leases for a whole lease period stops its jobs itself: by then another worker may run them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import redis.exceptions

from ..store.execution import ExecutionStore
from .runner import StopReason

log = logging.getLogger("gpulayer.worker")


class LeaseKeeper(threading.Thread):
    def __init__(
        self,
        store: ExecutionStore,
        incarnation: str,
        *,
        interval: float,
        lease_ttl: float,
        registration_ttl: int,
        running: Callable[[], Iterable[tuple[str, int]]],
        stop_job: Callable[[str, StopReason], None],
        stop_all: Callable[[StopReason], None],
    ) -> None:
        super().__init__(name="gpulayer-leases", daemon=True)
        self._store = store
        self._incarnation = incarnation
        self._interval = interval
        self._lease_ms = int(lease_ttl * 1000)
        self._lease_ttl = lease_ttl
        self._registration_ttl = registration_ttl
        self._running = running
        self._stop_job = stop_job
        self._stop_all = stop_all
        self._stopping = threading.Event()
        self._renewed = time.monotonic()
        #: Set when another process took over the worker's name: the worker must stop.
        self.taken_over = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self._interval):
            self.beat()

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=self._interval + 1)

    def beat(self) -> None:
        try:
            running = list(self._running())
            result = self._store.heartbeat(self._incarnation, self._registration_ttl, self._lease_ms, running)
            self._renewed = time.monotonic()
            if not result.alive:
                log.error("worker %s: another process took over this name; stopping", self._store.worker)
                self._stop_all("stale")
                self.taken_over.set()
                return
            for job_id in result.cancelled:
                self._stop_job(job_id, "cancel")
            for job_id in result.lost:
                log.warning("job %s: its lease went to another worker; stopping it here", job_id)
                self._stop_job(job_id, "stale")
            self._store.reap()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            silent = time.monotonic() - self._renewed
            log.error("worker %s: cannot renew leases (%s) for %.0f s", self._store.worker, exc, silent)
            if silent > self._lease_ttl:
                log.error("worker %s: leases expired; stopping every job (another worker may run them)",
                          self._store.worker)  # fmt: skip
                self._stop_all("stale")
