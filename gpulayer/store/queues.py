"""The queues as clients see them: each requirement set's queue with how many jobs wait in it."""

from __future__ import annotations

from functools import partial
from typing import cast

from redis import Redis

from ..models import QueueInfo, QueueSpec
from .garbled import readable
from .keys import Keys


class QueueStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    def list(self) -> tuple[list[QueueInfo], int]:
        """Every queue that has had a job, by name, with its depth now; and how many gang jobs wait
        for workers (they wait in a set of their own). One round trip after the registry's."""
        registry = cast(dict[bytes, bytes], self._redis.hgetall(self._keys.queues))
        names = sorted(name.decode() for name in registry)
        pipe = self._redis.pipeline(transaction=False)
        for name in names:
            pipe.llen(self._keys.queue(name))
        pipe.zcard(self._keys.gangs)
        *depths, gangs = pipe.execute()
        queues = []
        for name, depth in zip(names, depths, strict=True):
            spec = readable(partial(QueueSpec.model_validate_json, registry[name.encode()]), f"queue {name}")
            if spec is None:
                continue
            queues.append(
                QueueInfo(name=name, requirements=spec.requirements, priority=spec.priority, depth=depth)
            )
        return queues, int(gangs)
