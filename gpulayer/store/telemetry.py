"""What the dashboard watches: each worker's telemetry samples and the installation's activity samples
(bounded streams, an hour of each), and the events channel job states, workers and samples are
published on."""

from __future__ import annotations

import json
import math
from functools import partial
from typing import Literal, TypeVar, cast

from pydantic import BaseModel
from redis import Redis

from ..inventory import Telemetry
from ..models import ActivitySample
from .garbled import readable
from .keys import Keys

#: How far back the streams reach (s).
HISTORY = 3600

Entries = list[tuple[bytes, dict[bytes, bytes]]]
M = TypeVar("M", bound=BaseModel)


class TelemetryStore:
    def __init__(self, redis: Redis, keys: Keys, interval: float) -> None:
        self._redis = redis
        self._keys = keys
        self.interval = interval
        #: Samples in an hour: each stream's cap.
        self._keep = math.ceil(HISTORY / interval)

    def record(self, worker: str, sample: Telemetry) -> None:
        """Keep a worker's sample and publish it; a worker's stream goes an hour after its last."""
        data = sample.model_dump_json()
        key = self._keys.telemetry(worker)
        pipe = self._redis.pipeline(transaction=False)
        pipe.xadd(key, {"d": data}, maxlen=self._keep, approximate=True)
        pipe.expire(key, HISTORY)
        pipe.publish(
            self._keys.events, f'{{"type":"telemetry","worker":{json.dumps(worker)},"sample":{data}}}'
        )
        pipe.execute()

    def activity_turn(self, worker: str) -> bool:
        """Whether this worker takes this interval's activity sample (the first to ask does)."""
        turn = max(int(self.interval * 1000) - 100, 100)
        return bool(self._redis.set(self._keys.activity_turn, worker, nx=True, px=turn))

    def record_activity(self, sample: ActivitySample) -> None:
        self._redis.xadd(
            self._keys.activity,
            {"d": sample.model_dump_json()},
            maxlen=self._keep,
            approximate=True,
        )

    def announce(self, worker: str, event: Literal["joined", "left"]) -> None:
        """Tell the dashboard a worker came or went."""
        self._redis.publish(self._keys.events, json.dumps({"type": "worker", "name": worker, "event": event}))

    def _since(self, seconds: float) -> int:
        """The first stream id (ms, by Redis's clock, as the ids are) of the last ``seconds``."""
        now, micro = self._redis.time()
        return now * 1000 + micro // 1000 - int(seconds * 1000)

    def history(self, workers: list[str], seconds: float) -> dict[str, list[Telemetry]]:
        """Each worker's samples over the last ``seconds``, oldest first."""
        since = self._since(seconds)
        pipe = self._redis.pipeline(transaction=False)
        for worker in workers:
            pipe.xrange(self._keys.telemetry(worker), since, "+")
        return {
            worker: _samples(Telemetry, cast(Entries, entries), f"a telemetry sample of {worker}")
            for worker, entries in zip(workers, pipe.execute(), strict=True)
        }

    def activity(self, seconds: float) -> list[ActivitySample]:
        """The installation's samples over the last ``seconds``, oldest first."""
        entries = cast(Entries, self._redis.xrange(self._keys.activity, self._since(seconds), "+"))
        return _samples(ActivitySample, entries, "an activity sample")


def _samples(model: type[M], entries: Entries, what: str) -> list[M]:
    """The samples of a stream that can be read (field ``d``), oldest first."""
    found = (
        readable(partial(model.model_validate_json, fields.get(b"d", b"")), what) for _, fields in entries
    )
    return [sample for sample in found if sample is not None]
