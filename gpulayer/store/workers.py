"""Workers as registered in RQ's worker hashes, with what their running jobs hold now."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from functools import partial
from typing import cast

from redis import Redis

from ..inventory import WorkerInfo
from .garbled import readable
from .keys import Keys
from .rq_jobs import parse_timestamp


class WorkerStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    def holder(self, name: str) -> Holder | None:
        """Who is registered under the worker name ``name`` (its RQ hash), if anyone."""
        raw = cast(
            list[bytes | None],
            self._redis.hmget(
                self._keys.rq_worker(name), "hostname", "pid", "birth", "last_heartbeat", "gl_heartbeat"
            ),
        )
        host, pid, birth, beat, interval = raw
        if host is None:
            return None
        return Holder(
            host.decode(errors="replace"),
            int(pid or 0) if (pid or b"").isdigit() else 0,
            parse_timestamp(birth),
            parse_timestamp(beat),
            float(interval) if interval and interval.replace(b".", b"", 1).isdigit() else 5.0,
        )

    def list(self) -> list[WorkerInfo]:
        """This installation's live workers, by name (a member of RQ's set that is no worker key of
        its own, which anything that writes the set could add, is left out). Two round trips whatever
        the number of workers."""
        prefix = self._keys.rq_worker("")
        worker_keys = sorted(
            k.decode() for k in cast(set[bytes], self._redis.smembers(self._keys.rq_workers))
        )
        names = [key.removeprefix(prefix) for key in worker_keys if key.startswith(prefix)]
        pipe = self._redis.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(self._keys.rq_worker(name))
            pipe.hgetall(self._keys.worker_usage(name))
            pipe.scard(self._keys.worker_jobs(name))
        replies = pipe.execute()
        workers = []
        for name, raw, usage, running in zip(names, replies[::3], replies[1::3], replies[2::3], strict=True):
            if not raw or b"death" in raw or b"gl_offer" not in raw:
                continue
            found = readable(partial(_worker, name, raw, usage, int(running)), f"the record of worker {name}")
            if found is not None:
                workers.append(found)
        uuids = [gpu.uuid for worker in workers for gpu in worker.gpus]
        holders = (
            dict(zip(uuids, self._redis.mget([self._keys.gpu(uuid) for uuid in uuids]), strict=True))
            if uuids
            else {}
        )
        for worker in workers:
            worker.gpus_busy = [gpu.uuid for gpu in worker.gpus if holders.get(gpu.uuid)]
        return workers


@dataclasses.dataclass(frozen=True)
class Holder:
    """The process registered under a worker's name: where it runs, and when it was last heard."""

    host: str
    pid: int
    birth: datetime | None
    last_heartbeat: datetime | None
    heartbeat: float


def _worker(name: str, raw: dict[bytes, bytes], usage: dict[bytes, bytes], running: int) -> WorkerInfo:
    """One validation per worker: the offer as registered, and what is live now."""
    fields = json.loads(raw[b"gl_offer"])
    fields.update(
        name=name,
        host=raw.get(b"hostname", b"").decode(),
        pid=int(raw.get(b"pid", 0)),
        state=raw.get(b"state", b"?").decode(),
        birth=parse_timestamp(raw.get(b"birth")),
        last_heartbeat=parse_timestamp(raw.get(b"last_heartbeat")),
        heartbeat=float(raw.get(b"gl_heartbeat", 5.0)),
        address=raw[b"gl_address"].decode() if b"gl_address" in raw else None,
        identity=raw[b"gl_identity"].decode(errors="replace") if b"gl_identity" in raw else None,
        running=running,
        cpus_used=int(usage.get(b"cpus", 0)),
        memory_used=int(usage.get(b"memory", 0)),
    )
    return WorkerInfo.model_validate(fields)
