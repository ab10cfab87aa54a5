"""The worker's heartbeat, in a thread of its own so nothing else the worker does can delay it.

Every beat renews the worker's registration and the lease of each job it runs, and stops the jobs
that were cancelled or that it no longer owns. Every second it runs the reaper, so an expired lease
or a retry whose back-off is over is acted on within a second. A worker that cannot renew its leases
for a whole lease period stops its jobs itself: by then another worker may run them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

import psutil
import redis.exceptions

from ..errors import ConfigError
from ..inventory import SILENT_BEATS
from ..store.execution import ExecutionStore
from ..store.workers import Holder
from .endings import StopReason

log = logging.getLogger("gpulayer.worker")
#: Seconds between runs of the reaper (at most; never less often than the heartbeat).
REAP_INTERVAL = 1.0


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
        self._reachable = True
        self._fenced = False
        #: Set when another process took over the worker's name, or Redis refused its user (its
        #: identity was revoked): the worker must stop.
        self.taken_over = threading.Event()

    def run(self) -> None:
        tick = min(self._interval, REAP_INTERVAL)
        next_beat = time.monotonic() + self._interval
        while not self._stopping.wait(tick):
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self._interval
                self.beat()
            if self._reachable:
                self.reap()
            self._fence()

    def reap(self) -> None:
        # Redis out of reach is for the beat to report and act on.
        with contextlib.suppress(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            self._store.reap()

    def _fence(self) -> None:
        """Past a whole lease without renewal, every job may already run elsewhere: stop them all."""
        if not self._fenced and time.monotonic() - self._renewed > self._lease_ttl:
            self._fenced = True
            log.error("worker %s: leases expired; stopping every job (another worker may run them)",
                      self._store.worker)  # fmt: skip
            self._stop_all("stale")

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=self._interval + 1)

    def beat(self) -> None:
        try:
            running = list(self._running())
            result = self._store.heartbeat(self._incarnation, self._registration_ttl, self._lease_ms, running)
            self._renewed = time.monotonic()
            self._reachable, self._fenced = True, False
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
        except redis.exceptions.AuthenticationError:
            log.error(
                "worker %s: Redis refused its user: identity %s was revoked; stopping every job",
                self._store.worker,
                self._store.identity,
            )
            self._stop_all("stale")  # its jobs went back to their queues: they run elsewhere now
            self.taken_over.set()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            self._reachable = False
            silent = time.monotonic() - self._renewed
            log.error("worker %s: cannot renew leases (%s) for %.1f s", self._store.worker, exc, silent)


def holder_alive(holder: Holder, host: str) -> bool:
    """Whether the process registered under a name still runs: by its pid on this machine (a
    process started after the registration is another one), else by its heartbeats."""
    if holder.host == host:
        try:
            process = psutil.Process(holder.pid)
            started = process.create_time()
            if process.status() == psutil.STATUS_ZOMBIE:
                return False  # it ended; its parent (init, for a worker `up` started) has not reaped it yet
        except (psutil.Error, ValueError):
            return False
        return holder.pid != os.getpid() and (holder.birth is None or started <= holder.birth.timestamp() + 1)
    if holder.last_heartbeat is None:
        return False
    silent = (datetime.now(timezone.utc) - holder.last_heartbeat).total_seconds()
    return silent <= holder.heartbeat * SILENT_BEATS


def lease_timing(lease_ttl: float, heartbeat: float) -> tuple[float, float]:
    """The lease and the heartbeat that renews it, checked."""
    if not 0 < heartbeat < lease_ttl:
        raise ConfigError(f"the heartbeat ({heartbeat:g} s) must be shorter than the lease ({lease_ttl:g} s)")
    return lease_ttl, heartbeat
