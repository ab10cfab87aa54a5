"""Workers as registered in RQ's worker hashes, read back for listing."""

from __future__ import annotations

from typing import cast

from redis import Redis

from ..models import WorkerInfo
from .keys import Keys
from .rq_jobs import parse_timestamp


class WorkerStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    def list(self) -> list[WorkerInfo]:
        """This installation's live workers (RQ's registry holds every installation's), by name."""
        prefix = self._keys.rq_worker("")
        worker_keys = sorted(
            k.decode() for k in cast(set[bytes], self._redis.smembers(self._keys.rq_workers))
        )
        names = [key.removeprefix(prefix) for key in worker_keys if key.startswith(prefix)]
        pipe = self._redis.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self._keys.rq_worker(name))
            pipe.scard(self._keys.worker_jobs(name))
        replies = pipe.execute()
        workers = []
        for name, raw, running in zip(names, replies[::2], replies[1::2], strict=True):
            if not raw or b"death" in raw or b"gl_name" not in raw:
                continue
            workers.append(
                WorkerInfo(
                    name=name,
                    host=raw.get(b"hostname", b"").decode(),
                    pid=int(raw.get(b"pid", 0)),
                    state=raw.get(b"state", b"?").decode(),
                    slots=int(raw.get(b"gl_slots", 0)),
                    running=int(running),
                    birth=parse_timestamp(raw.get(b"birth")),
                    last_heartbeat=parse_timestamp(raw.get(b"last_heartbeat")),
                )
            )
        return workers
