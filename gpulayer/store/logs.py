"""A job's log lines: read what is there, or follow until the job ends."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Literal, cast

from redis import Redis

from ..models import LogLine
from .connection import BLOCK_MS
from .keys import Keys

#: Lines fetched per round trip.
_PAGE = 1000
Stream = Literal["stdout", "stderr", "system"]


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

    def page(self, job_id: str, after: str = "0-0", limit: int = _PAGE) -> list[tuple[str, LogLine]]:
        """Up to ``limit`` stored lines after entry ``after``, each with its entry id (the cursor of
        the next page)."""
        raw = cast(
            list[tuple[bytes, dict[bytes, bytes]]],
            self._redis.xrange(
                self._keys.logs(job_id), f"({after}" if after != "0-0" else "-", "+", count=limit
            ),
        )
        return [parse_entry(entry_id, fields) for entry_id, fields in raw]

    def tail(self, job_id: str, count: int) -> list[tuple[str, LogLine]]:
        """The last ``count`` stored lines, oldest first, each with its entry id."""
        raw = cast(
            list[tuple[bytes, dict[bytes, bytes]]],
            self._redis.xrevrange(self._keys.logs(job_id), "+", "-", count=count),
        )
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
