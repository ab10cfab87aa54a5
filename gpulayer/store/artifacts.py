"""Where a job's files live: its source and input archives, and its output archive.

:class:`ArtifactStore` is the seam. :class:`RedisArtifactStore` keeps each archive in a Redis hash in
1 MiB chunks. Its lifecycle runs in the job scripts: inputs are uploaded with a TTL that ``submit.lua``
lifts, an attempt's outputs are staged and renamed into place by ``finish.lua`` only if that attempt
still owns the job, and everything expires with the job. A store on a shared filesystem or an object
store would implement the same five methods and keep its files alive the same way.
"""

from __future__ import annotations

import hashlib
import json
from typing import IO, Protocol, cast

from redis import Redis

from .keys import Keys

#: The archives of a job, by name.
SOURCE_ARCHIVE = "source.tar.gz"
INPUTS_ARCHIVE = "inputs.tar.gz"
OUTPUTS_ARCHIVE = "outputs.tar.gz"
CHUNK = 1024 * 1024
#: Chunks sent or fetched per round trip.
_BATCH = 8
#: Files uploaded for a job that is not yet submitted, or outputs of an attempt not yet finished,
#: disappear after this long: what a crashed client or worker leaves behind cleans itself up.
PENDING_TTL = 3600


class MissingArtifact(LookupError):
    """No archive of that name is stored for the job."""


class CorruptArtifact(ValueError):
    """A stored archive does not match its recorded size or checksum."""


class ArtifactStore(Protocol):
    def put_inputs(self, job_id: str, name: str, stream: IO[bytes]) -> int: ...

    def get_inputs(self, job_id: str, name: str, dest: IO[bytes]) -> int: ...

    def discard_inputs(self, job_id: str) -> None: ...

    def put_outputs(self, job_id: str, attempt: int, name: str, stream: IO[bytes]) -> int: ...

    def get_outputs(self, job_id: str, name: str, dest: IO[bytes]) -> int: ...


class RedisArtifactStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    def put_inputs(self, job_id: str, name: str, stream: IO[bytes]) -> int:
        return self._put(self._keys.inputs(job_id), name, stream)

    def get_inputs(self, job_id: str, name: str, dest: IO[bytes]) -> int:
        return self._get(self._keys.inputs(job_id), name, dest)

    def discard_inputs(self, job_id: str) -> None:
        self._redis.delete(self._keys.inputs(job_id))

    def put_outputs(self, job_id: str, attempt: int, name: str, stream: IO[bytes]) -> int:
        return self._put(self._keys.staged_outputs(job_id, attempt), name, stream)

    def get_outputs(self, job_id: str, name: str, dest: IO[bytes]) -> int:
        return self._get(self._keys.outputs(job_id), name, dest)

    def _put(self, key: str, name: str, stream: IO[bytes]) -> int:
        digest = hashlib.sha256()
        size = chunks = 0
        pipe = self._redis.pipeline(transaction=False)
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
            pipe.hset(key, f"{name}#{chunks}", chunk)
            size += len(chunk)
            chunks += 1
            if chunks % _BATCH == 0:
                # The TTL goes with every batch, so an upload cut short still expires.
                pipe.expire(key, PENDING_TTL)
                pipe.execute()
        meta = {"size": size, "chunks": chunks, "sha256": digest.hexdigest()}
        pipe.hset(key, name, json.dumps(meta))
        pipe.expire(key, PENDING_TTL)
        pipe.execute()
        return size

    def _get(self, key: str, name: str, dest: IO[bytes]) -> int:
        raw = self._redis.hget(key, name)
        if raw is None:
            raise MissingArtifact(name)
        meta = json.loads(raw)
        digest = hashlib.sha256()
        size = 0
        for start in range(0, meta["chunks"], _BATCH):
            fields = [f"{name}#{i}" for i in range(start, min(start + _BATCH, meta["chunks"]))]
            for chunk in cast(list[bytes | None], self._redis.hmget(key, fields)):
                if chunk is None:
                    raise CorruptArtifact(f"{name}: a chunk is missing")
                digest.update(chunk)
                dest.write(chunk)
                size += len(chunk)
        if size != meta["size"] or digest.hexdigest() != meta["sha256"]:
            raise CorruptArtifact(f"{name}: size or checksum does not match what was stored")
        return size
