"""The installation's identity registry: each machine's identity record, signed by the admin, by name.

Anyone may read it; only the admin writes it (the other roles' users may only read its key on Redis
7: see :mod:`.acl`). A client or a worker trusts a record only once the admin's signature over it
checks (:class:`gpulayer.signing.Identities`), so a record forged or edited in Redis counts as absent,
and an identity removed from it (revoked) is refused by everyone from then on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from redis import Redis
from redis.client import Pipeline

from ..errors import ConfigError
from ..models import Identity, JobRecord
from ..signing import ArchiveSeal, Identities, WorkerKey
from .keys import Keys


class IdentityRegistry:
    def __init__(self, redis: Redis, keys: Keys, identities: Identities | None) -> None:
        self._redis = redis
        self._keys = keys
        self._identities = identities

    @property
    def identities(self) -> Identities:
        """What records are checked with: :class:`ConfigError` for an access without the key."""
        if self._identities is None:
            raise ConfigError(
                "this machine's access holds no key to check the installation's identities with (it "
                "was made before machines had their own): get a new token from the admin (`gpulayer "
                "access add ROLE NAME`)"
            )
        return self._identities

    def record(self, name: str) -> bytes | None:
        return cast(bytes | None, self._redis.hget(self._keys.identities, name))

    def queue_record(self, pipe: Pipeline, name: str) -> None:
        """Queue a read of one stored record, for :meth:`worker_key`."""
        pipe.hget(self._keys.identities, name)

    def queue_records(self, pipe: Pipeline) -> None:
        """Queue a read of every stored record (name → record), for :meth:`worker_key`."""
        pipe.hgetall(self._keys.identities)

    def records(self) -> dict[str, bytes]:
        raw = cast(dict[bytes, bytes], self._redis.hgetall(self._keys.identities))
        return {name.decode(errors="replace"): record for name, record in raw.items()}

    def identity(self, name: str) -> Identity | None:
        """The identity ``name``, if its record checks."""
        return self.identities.check(name, self.record(name))

    def worker_key(self, name: str | None, stored: bytes | None) -> WorkerKey:
        """The result key of worker identity ``name`` from its stored record: see
        :meth:`Identities.worker_key`."""
        return self.identities.worker_key(name, stored)

    def check_archive(self, record: JobRecord, name: str, sha256: str, seal: str | None) -> WorkerKey:
        """The key of the worker identity that claimed the attempt the seal of the job's archive
        ``name`` names, if that identity, valid now, signed it (its SHA-256); else
        :class:`UntrustedPayload`."""
        found = ArchiveSeal.read(seal, name)
        if found.identity != record.claimer(found.attempt):
            raise found.refused(name)
        key = self.worker_key(found.identity, self.record(found.identity))
        found.check(key, record.id, name, sha256)
        return key

    # --- the admin's ----------------------------------------------------------------------------
    def publish(self, signed: Mapping[str, str]) -> None:
        """Make the registry exactly ``signed`` (name → signed record), in one step."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(self._keys.identities)
        if signed:
            pipe.hset(self._keys.identities, items=[part for pair in signed.items() for part in pair])
        pipe.execute()

    def release(self, identity: str) -> int:
        """The jobs whose attempt ``identity`` claimed lose their lease now, so the next reap takes
        them from their worker (as a lost worker's); how many."""
        held = [job.decode() for job in cast(list[bytes], self._redis.zrange(self._keys.leases, 0, -1))]
        pipe = self._redis.pipeline(transaction=False)
        for job_id in held:
            pipe.hget(self._keys.job(job_id), "gl_identity")
        claimed = [job_id for job_id, by in zip(held, pipe.execute(), strict=True) if by == identity.encode()]
        if claimed:
            self._redis.zadd(self._keys.leases, dict.fromkeys(claimed, 0), xx=True)
        return len(claimed)
