"""Where a job's files live: its source and input archives, its output archive, and the code bundles
remote functions run from.

:class:`ArtifactStore` is the seam. :class:`RedisArtifactStore` keeps each archive in a Redis hash in
1 MiB chunks. Its lifecycle runs in the job scripts: inputs are staged with a TTL and renamed into
place by ``submit.lua`` only if the job is created, an attempt's outputs are staged and renamed into
place by ``finish.lua`` only if that attempt still owns the job, and everything expires with the job.
Bundles are shared by content and live a week past their last use. A store on a shared filesystem
or an object store would implement the same methods and keep its files alive the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable
from typing import IO, Any, Protocol, cast

from redis import Redis
from redis.client import Pipeline

from .keys import Keys

#: The archives of a job, by name.
SOURCE_ARCHIVE = "source.tar.gz"
INPUTS_ARCHIVE = "inputs.tar.gz"
OUTPUTS_ARCHIVE = "outputs.tar.gz"
CHECKPOINT_ARCHIVE = "checkpoint.tar.gz"
CHUNK = 1024 * 1024
#: Chunks sent or fetched per round trip.
_BATCH = 8
#: Files uploaded for a job that is not yet submitted, or outputs of an attempt not yet finished,
#: disappear after this long: what a crashed client or worker leaves behind cleans itself up.
PENDING_TTL = 3600
#: A code bundle stays this long after the last submit or worker that used it (seconds).
BUNDLE_TTL = 7 * 24 * 3600


class MissingArtifact(LookupError):
    """No archive of that name is stored for the job."""


class CorruptArtifact(ValueError):
    """A stored archive does not match its recorded size or checksum."""


#: Signs an archive a worker stores, given its SHA-256 (hex): the seal it is kept with.
Sealer = Callable[[str], str]
#: What a read of an archive a worker stored found: its SHA-256 (hex), and its seal (None: unsealed).
Sealed = tuple[str, str | None]


@dataclasses.dataclass(frozen=True)
class HeldArchive:
    """An archive kept out of Redis, as Redis records it: who serves it (the name it serves under:
    outputs' worker, inputs' submitter; "" when in an object store), its size and SHA-256, its seal
    (None: unsealed), how much its files hold unpacked (0: not recorded), and, in an object store,
    the presigned URL it is read from."""

    worker: str
    size: int
    sha256: str
    seal: str | None
    unpacked: int = 0
    url: str | None = None


class ArtifactStore(Protocol):
    def put_inputs(
        self, job_id: str, upload: str, name: str, stream: IO[bytes], pipe: Pipeline | None = None
    ) -> str: ...

    def get_inputs(self, job_id: str, name: str, dest: IO[bytes]) -> str: ...

    def discard_inputs(self, job_id: str, upload: str) -> None: ...

    def put_outputs(
        self,
        job_id: str,
        attempt: int,
        name: str,
        stream: IO[bytes],
        pipe: Pipeline | None = None,
        seal: Sealer | None = None,
    ) -> str: ...

    def hold_outputs(self, job_id: str, attempt: int, name: str, held: HeldArchive) -> None: ...

    def held_outputs(self, job_id: str, name: str) -> HeldArchive | None: ...

    def hold_inputs(self, job_id: str, upload: str, name: str, held: HeldArchive) -> None: ...

    def held_inputs(self, job_id: str, name: str) -> HeldArchive | None: ...

    def plan_outputs(self, job_id: str, upload: str, put: str, get: str) -> None: ...

    def outputs_urls(self, job_id: str) -> tuple[str, str] | None: ...

    def put_checkpoint(self, job_id: str, attempt: int, stream: IO[bytes], seal: Sealer) -> str: ...

    def get_checkpoint(self, job_id: str, dest: IO[bytes]) -> Sealed: ...

    def queue_inputs(self, pipe: Pipeline, job_id: str) -> None: ...

    def queue_outputs(self, pipe: Pipeline, job_id: str) -> None: ...

    def get_outputs(self, job_id: str, name: str, dest: IO[bytes]) -> Sealed: ...

    def has_bundle(self, digest: str) -> bool: ...

    def put_bundle(self, digest: str, stream: IO[bytes]) -> str: ...

    def get_bundle(self, digest: str, dest: IO[bytes]) -> str: ...


class RedisArtifactStore:
    """Each ``put_*`` and ``get_*`` returns the SHA-256 (hex) of what it wrote: what a job's signature
    names, so a reader can tell the file is the one that was signed."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    def put_inputs(
        self, job_id: str, upload: str, name: str, stream: IO[bytes], pipe: Pipeline | None = None
    ) -> str:
        """Stage a file of a job about to be submitted under the submit's ``upload`` token. With ``pipe``,
        the writes are only queued on it, for the caller to send with the submit itself."""
        return self._put(self._keys.staged_inputs(job_id, upload), name, stream, PENDING_TTL, pipe)

    def get_inputs(self, job_id: str, name: str, dest: IO[bytes]) -> str:
        return self._get(self._keys.inputs(job_id), name, dest)

    def discard_inputs(self, job_id: str, upload: str) -> None:
        self._redis.delete(self._keys.staged_inputs(job_id, upload))

    def put_outputs(
        self,
        job_id: str,
        attempt: int,
        name: str,
        stream: IO[bytes],
        pipe: Pipeline | None = None,
        seal: Sealer | None = None,
    ) -> str:
        """Stage one attempt's output; with ``pipe``, only queued on it (to go with the finish).
        ``seal``: the worker's signature over it, kept with it (a function's result is signed inside)."""
        return self._put(self._keys.staged_outputs(job_id, attempt), name, stream, PENDING_TTL, pipe, seal)

    def hold_outputs(self, job_id: str, attempt: int, name: str, held: HeldArchive) -> None:
        """Stage one attempt's record of an output archive its worker keeps (no chunks): it becomes
        the job's, and expires with it, as :meth:`put_outputs`'s files do."""
        self._hold(self._keys.staged_outputs(job_id, attempt), name, held)

    def held_outputs(self, job_id: str, name: str) -> HeldArchive | None:
        """The job's record of output archive ``name`` if its worker keeps it (None: not stored, or
        stored here); :class:`CorruptArtifact` if the record cannot be read."""
        return self._held(self._keys.outputs(job_id), name)

    def hold_inputs(self, job_id: str, upload: str, name: str, held: HeldArchive) -> None:
        """Stage the record of an input archive its submitter serves (no chunks), under the submit's
        ``upload`` token: the submit makes it the job's, as :meth:`put_inputs`'s files."""
        self._hold(self._keys.staged_inputs(job_id, upload), name, held)

    def held_inputs(self, job_id: str, name: str) -> HeldArchive | None:
        """The job's record of input archive ``name`` if its submitter serves it (None: not stored,
        or stored here); :class:`CorruptArtifact` if the record cannot be read."""
        return self._held(self._keys.inputs(job_id), name)

    def plan_outputs(self, job_id: str, upload: str, put: str, get: str) -> None:
        """Stage, with the submit's inputs (``upload``), the presigned URLs the job's outputs archive
        is put to and read from in the object store: its worker reads them before the job ends."""
        pipe = self._redis.pipeline(transaction=False)
        key = self._keys.staged_inputs(job_id, upload)
        pipe.hset(key, OUTPUTS_ARCHIVE, json.dumps({"put": put, "get": get}))
        pipe.expire(key, PENDING_TTL)
        pipe.execute()

    def outputs_urls(self, job_id: str) -> tuple[str, str] | None:
        """Where the job's outputs archive goes in the object store, and is read from (None: no store)."""
        raw = self._redis.hget(self._keys.inputs(job_id), OUTPUTS_ARCHIVE)
        try:
            urls = json.loads(raw) if raw is not None else None
            return (str(urls["put"]), str(urls["get"])) if urls is not None else None
        except (ValueError, TypeError, KeyError):
            raise CorruptArtifact(f"{OUTPUTS_ARCHIVE}: its URLs cannot be read") from None

    def _hold(self, key: str, name: str, held: HeldArchive) -> None:
        meta = {"size": held.size, "chunks": 0, "sha256": held.sha256, "seal": held.seal, "held": held.worker}
        meta["unpacked"] = held.unpacked
        if held.url is not None:
            meta["url"] = held.url
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(key, name, json.dumps(meta))
        pipe.expire(key, PENDING_TTL)
        pipe.execute()

    def _held(self, key: str, name: str) -> HeldArchive | None:
        raw = self._redis.hget(key, name)
        if raw is None:
            return None
        try:
            meta = json.loads(raw)
            if "held" not in meta:
                return None
            seal, url = meta.get("seal"), meta.get("url")
            seal = seal if isinstance(seal, str) else None
            url = url if isinstance(url, str) else None
            unpacked = int(meta.get("unpacked", 0))
            return HeldArchive(str(meta["held"]), int(meta["size"]), str(meta["sha256"]), seal, unpacked, url)
        except (ValueError, TypeError, KeyError, AttributeError):
            raise CorruptArtifact(f"{name}: its record cannot be read") from None

    def put_checkpoint(self, job_id: str, attempt: int, stream: IO[bytes], seal: Sealer) -> str:
        """Stage an attempt's checkpoint archive (``keep_checkpoint.lua`` makes it the job's), sealed."""
        key = self._keys.staged_checkpoint(job_id, attempt)
        return self._put(key, CHECKPOINT_ARCHIVE, stream, PENDING_TTL, seal=seal)

    def get_checkpoint(self, job_id: str, dest: IO[bytes]) -> Sealed:
        """The job's checkpoint archive into ``dest``, and its seal; :class:`MissingArtifact` if none
        was kept."""
        return self._read(self._keys.checkpoint(job_id), CHECKPOINT_ARCHIVE, dest)

    def queue_inputs(self, pipe: Pipeline, job_id: str) -> None:
        """Queue a read of the job's input files whole, for :func:`small_files` (a function's call)."""
        pipe.hgetall(self._keys.inputs(job_id))

    def queue_outputs(self, pipe: Pipeline, job_id: str) -> None:
        """Queue a read of the job's outputs whole, for :func:`small_files` (a function's result)."""
        pipe.hgetall(self._keys.outputs(job_id))

    def get_outputs(self, job_id: str, name: str, dest: IO[bytes]) -> Sealed:
        """The job's output archive ``name`` into ``dest``, and its seal."""
        return self._read(self._keys.outputs(job_id), name, dest)

    def has_bundle(self, digest: str) -> bool:
        """Whether the bundle is stored whole; if so it is kept another :data:`BUNDLE_TTL` from now."""
        key = self._keys.bundle(digest)
        pipe = self._redis.pipeline(transaction=False)
        pipe.hexists(key, _BUNDLE)
        pipe.expire(key, BUNDLE_TTL)
        complete, _ = pipe.execute()
        return bool(complete)

    def put_bundle(self, digest: str, stream: IO[bytes]) -> str:
        return self._put(self._keys.bundle(digest), _BUNDLE, stream, BUNDLE_TTL)

    def get_bundle(self, digest: str, dest: IO[bytes]) -> str:
        key = self._keys.bundle(digest)
        self._redis.expire(key, BUNDLE_TTL)
        return self._get(key, _BUNDLE, dest)

    def _put(
        self,
        key: str,
        name: str,
        stream: IO[bytes],
        ttl: int,
        pipe: Pipeline | None = None,
        seal: Sealer | None = None,
    ) -> str:
        digest = hashlib.sha256()
        size = chunks = 0
        own = pipe is None
        writes = self._redis.pipeline(transaction=False) if pipe is None else pipe
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
            writes.hset(key, f"{name}#{chunks}", chunk)
            size += len(chunk)
            chunks += 1
            if own and chunks % _BATCH == 0:
                # The TTL goes with every batch, so an upload cut short still expires.
                writes.expire(key, ttl)
                writes.execute()
        # Written last: a file whose metadata is there is whole.
        meta: dict[str, Any] = {"size": size, "chunks": chunks, "sha256": digest.hexdigest()}
        if seal is not None:
            meta["seal"] = seal(meta["sha256"])
        writes.hset(key, name, json.dumps(meta))
        writes.expire(key, ttl)
        if own:
            writes.execute()
        return digest.hexdigest()

    def _get(self, key: str, name: str, dest: IO[bytes]) -> str:
        return self._read(key, name, dest)[0]

    def _read(self, key: str, name: str, dest: IO[bytes]) -> Sealed:
        raw = self._redis.hget(key, name)
        if raw is None:
            raise MissingArtifact(name)
        meta = json.loads(raw)
        if "held" in meta:
            raise MissingArtifact(f"{name} is kept out of Redis ({meta['held'] or 'an object store'})")
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
        _check(name, meta, size, digest.hexdigest())
        seal = meta.get("seal")
        return digest.hexdigest(), seal if isinstance(seal, str) else None


#: The name of a bundle's one archive inside its hash.
_BUNDLE = "bundle.tar.gz"


def small_files(reply: dict[bytes, bytes], names: Iterable[str]) -> dict[str, bytes]:
    """Those of ``names`` a queued whole read found, each checked against its metadata."""
    return {name: _assemble(name, reply) for name in names if name.encode() in reply}


def _assemble(name: str, fields: dict[bytes, bytes]) -> bytes:
    """A file read whole from its hash's fields, checked against its metadata."""
    meta = json.loads(fields[name.encode()])
    chunks = [fields.get(f"{name}#{i}".encode()) for i in range(meta["chunks"])]
    if any(chunk is None for chunk in chunks):
        raise CorruptArtifact(f"{name}: a chunk is missing")
    data = b"".join(cast(list[bytes], chunks))
    _check(name, meta, len(data), hashlib.sha256(data).hexdigest())
    return data


def _check(name: str, meta: dict[str, Any], size: int, sha256: str) -> None:
    if size != meta["size"] or sha256 != meta["sha256"]:
        raise CorruptArtifact(f"{name}: size or checksum does not match what was stored")
