"""What a client's waits read ahead: the records of its own jobs that have ended, kept for the waits
that will ask for them.

A script that submits many jobs and then waits on each in turn would make a round trip per job,
although most have ended by the time it gets to them. Each wait on one of this client's jobs that
has to ask Redis also reads which of the jobs it submitted after that one have ended (their done
streams, in the same round trip) and fetches those records (one more); a wait on one of them then
returns without asking.
How far ahead it reads doubles while the waits find their jobs ended and what it read ahead had
mostly ended too, and halves when not: waits on jobs still running cost what they did.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable
from typing import Any

from ..models import JobRecord
from .jobs import JobStore

#: At most this many jobs are read ahead by one wait.
MOST_AHEAD = 256
#: A record read ahead is used for this long (s); a wait after that asks again.
KEPT_FOR = 10.0
#: The ids of at most this many submitted jobs are remembered (the oldest are forgotten first).
MOST_REMEMBERED = 100_000


class ReadAhead:
    """One client's read-ahead of its ended jobs (threads may share the client)."""

    def __init__(self, jobs: JobStore) -> None:
        self._jobs = jobs
        self._lock = threading.Lock()
        #: Jobs this client submitted and has not seen end: each one's place in the submit order.
        self._unended: dict[str, int] = {}
        #: The ids submitted, in order, from place ``_first`` on (those seen ended too).
        self._order: list[str] = []
        self._first = 0
        #: Records read ahead, with when they were read (monotonic), oldest first.
        self._ended: dict[str, tuple[float, JobRecord]] = {}
        self._ahead = 0

    def submitted(self, job_ids: Iterable[str]) -> None:
        with self._lock:
            for job_id in job_ids:
                self._unended[job_id] = self._first + len(self._order)
                self._order.append(job_id)
            if len(self._order) > MOST_REMEMBERED:  # the older half forgotten
                cut = len(self._order) // 2
                for job_id in self._order[:cut]:
                    self._unended.pop(job_id, None)
                del self._order[:cut]
                self._first += cut

    def forget(self, job_ids: Iterable[str]) -> None:
        """Jobs waited on another way (all at once): nothing to read ahead for them."""
        with self._lock:
            for job_id in job_ids:
                self._unended.pop(job_id, None)
                self._ended.pop(job_id, None)

    def peek_end(self, job_id: str, block_ms: int | None = None) -> tuple[bool, JobRecord | None]:
        """Whether the job has ended, and its record (None if there is none): as read ahead, or in
        one round trip that reads ahead (and one more for the records of those that ended).
        ``block_ms``: see :meth:`JobStore.peek_end`."""
        with self._lock:
            kept = self._ended.pop(job_id, None)
            if kept is not None and time.monotonic() - kept[0] < KEPT_FOR:
                return True, kept[1]
            place = self._unended.pop(job_id, None)
            ahead = [] if place is None else self._following(place)
        done, record, ended = self._jobs.peek_end(job_id, ahead, block_ms)
        records = self._jobs.get_many(ended) if ended else []
        read_at = time.monotonic()
        with self._lock:
            for ended_id, found in zip(ended, records, strict=True):
                self._unended.pop(ended_id, None)
                if found is not None:  # not gone since it ended
                    self._ended[ended_id] = (read_at, found)
            _trim(self._ended, 4 * MOST_AHEAD)
            if place is not None:  # a wait on one of this client's jobs: did reading ahead pay?
                paid = done and 2 * len(ended) >= len(ahead)
                self._ahead = min(MOST_AHEAD, 2 * self._ahead + 1) if paid else self._ahead // 2
        return done, record

    def _following(self, place: int) -> list[str]:
        """Up to the window's worth of the jobs submitted after the one at ``place`` and not seen
        ended (looking at no more than four times as many): the next waits of a loop in submit order."""
        start = max(place - self._first + 1, 0)
        following = self._order[start : start + 4 * self._ahead]
        return [job_id for job_id in following if job_id in self._unended][: self._ahead]


def _trim(entries: dict[str, Any], most: int) -> None:
    for oldest in list(itertools.islice(entries, max(len(entries) - most, 0))):
        del entries[oldest]
