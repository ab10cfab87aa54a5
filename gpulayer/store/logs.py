"""A job's log lines: read what is there, or follow until the job ends; or follow many jobs at once."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import Literal, cast

from redis import Redis

from ..models import JobState, LogLine
from .connection import BLOCK_MS
from .keys import Keys

#: Lines fetched per round trip.
_PAGE = 1000
Stream = Literal["stdout", "stderr", "system"]
#: Stream entries as redis-py answers them: (id, fields).
_Entries = list[tuple[bytes, dict[bytes, bytes]]]


@dataclasses.dataclass(frozen=True)
class LogUpdates:
    """What one read of many jobs' logs found: each job's new lines (with their ids), and how each job
    that has ended ended. A job may have ended with lines still unread: it is over once a read finds
    its end and no lines."""

    lines: dict[str, list[tuple[str, LogLine]]]
    ended: dict[str, JobState]


class LogStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    def lines(self, job_id: str, *, follow: bool = False) -> Iterator[LogLine]:
        """Every stored line; with ``follow``, then each new one as it arrives, until the job has ended."""
        logs, done = self._keys.logs(job_id).encode(), self._keys.done(job_id).encode()
        last: bytes = b"0-0"
        while True:
            streams = {logs: last, done: b"0-0"} if follow else {logs: last}
            reply = cast(
                list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]],
                self._redis.xread(streams, count=_PAGE, block=BLOCK_MS if follow else None),  # type: ignore[arg-type]
            )
            ended, got = False, False
            for stream, entries in reply:
                if stream == done:
                    ended = True
                    continue
                for entry_id, fields in entries:
                    got = True
                    last = entry_id
                    yield _line(entry_id, fields)
            # Once the end is seen, what remains is drained without blocking.
            follow = follow and not ended
            if not follow and not got:
                return

    def page(
        self, job_id: str, after: str = "0-0", limit: int | None = _PAGE, until: str = "+"
    ) -> list[tuple[str, LogLine]]:
        """Up to ``limit`` (None: all) stored lines after entry ``after`` and up to entry ``until``, each
        with its entry id (the cursor of the next page)."""
        raw = cast(
            _Entries,
            self._redis.xrange(
                self._keys.logs(job_id), f"({after}" if after != "0-0" else "-", until, count=limit
            ),
        )
        return [parse_entry(entry_id, fields) for entry_id, fields in raw]

    def read_many(self, cursors: Mapping[str, str], count: int, block_ms: int) -> LogUpdates:
        """In one blocking ``XREAD``: up to ``count`` lines of each job after its cursor (by job id),
        and the end of each that has ended."""
        # Each job's log (from its cursor) and done stream (its one entry), by key.
        streams: dict[str, tuple[str, str]] = {}
        for job_id, cursor in cursors.items():
            streams[self._keys.logs(job_id)] = (job_id, cursor)
            streams[self._keys.done(job_id)] = (job_id, "0-0")
        reply = cast(
            list[tuple[bytes, _Entries]],
            self._redis.xread(
                {key: cursor for key, (_, cursor) in streams.items()}, count=count, block=block_ms
            ),
        )
        updates = LogUpdates({}, {})
        for key, entries in reply:
            name = key.decode()
            job_id = streams[name][0]
            if name == self._keys.done(job_id):
                updates.ended[job_id] = JobState(entries[0][1][b"state"].decode())
            else:
                updates.lines[job_id] = [parse_entry(entry_id, fields) for entry_id, fields in entries]
        return updates

    def tail(self, job_id: str, count: int) -> list[tuple[str, LogLine]]:
        """The last ``count`` stored lines, oldest first, each with its entry id."""
        raw = cast(_Entries, self._redis.xrevrange(self._keys.logs(job_id), "+", "-", count=count))
        return [parse_entry(entry_id, fields) for entry_id, fields in reversed(raw)]


def parse_entry(entry_id: bytes, fields: dict[bytes, bytes]) -> tuple[str, LogLine]:
    """A stream entry as (its id, the line)."""
    return entry_id.decode(), _line(entry_id, fields)


def _line(entry_id: bytes, fields: dict[bytes, bytes]) -> LogLine:
    millis = int(entry_id.split(b"-", 1)[0])
    return LogLine(
        stream=cast(Stream, fields[b"s"].decode()),
        text=fields[b"l"].decode("utf-8", "replace"),
        attempt=int(fields[b"a"]),
        rank=int(fields[b"r"]) if b"r" in fields else None,
        time=datetime.fromtimestamp(millis / 1000, tz=timezone.utc),
    )
