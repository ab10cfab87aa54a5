"""Histograms the scripts keep in Redis as jobs start and end (see ``observe`` in ``lua/_lib.lua``):
one hash per histogram, a count per bucket, so every worker adds to the same numbers and any server
process reads them whole."""

from __future__ import annotations

import dataclasses
from typing import cast

from redis import Redis

#: Upper bounds (s) of the buckets of the time from queued to running (fetching files included).
START_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
#: Upper bounds (s) of the buckets of jobs' run times.
RUN_BUCKETS = (0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 12 * 3600, 86400)


def bounds_ms(bounds: tuple[float, ...]) -> tuple[int, ...]:
    """The bounds as the scripts compare them: whole milliseconds."""
    return tuple(round(bound * 1000) for bound in bounds)


@dataclasses.dataclass(frozen=True)
class Histogram:
    #: (upper bound in s, how many observations are at most that), the last bound infinite.
    buckets: list[tuple[float, int]]
    #: Sum of every observation (s).
    total: float


def read(redis: Redis, key: str, bounds: tuple[float, ...]) -> Histogram:
    raw = cast(dict[bytes, bytes], redis.hgetall(key))
    counts = [int(raw.get(str(i).encode(), 0)) for i in range(len(bounds) + 1)]
    cumulative, running = [], 0
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        running += count
        cumulative.append((float(bound), running))
    return Histogram(cumulative, int(raw.get(b"sum", 0)) / 1000)
