"""Gang jobs waiting for workers, and placing one on several workers at once (gang.lua)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import cast

from redis import Redis

from ..models import JobSpec
from .execution import gpu_list
from .jobs import parse_spec
from .keys import Keys
from .rq_jobs import timestamp
from .scripts import Scripts

log = logging.getLogger("gpulayer.worker")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A worker that could hold one node of a gang job, as gang.lua needs it: what it offers, and the
    GPUs a node may use there (uuid, index), best first."""

    worker: str
    slots: int
    memory: int
    eligible: tuple[tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Waiting:
    """A gang job waiting for workers."""

    job_id: str
    spec: JobSpec


@dataclasses.dataclass(frozen=True)
class Hold:
    """How long a gang job waits before it holds workers, and how long a hold lasts unless renewed."""

    after_ms: int
    ttl_ms: int


class GangStore:
    def __init__(self, redis: Redis, keys: Keys, scripts: Scripts) -> None:
        self._redis = redis
        self._keys = keys
        self._scripts = scripts

    def take_turn(self, worker: str, ttl_ms: int) -> bool:
        """Whether ``worker`` may place gang jobs now: no other worker did in the last ``ttl_ms``."""
        return bool(self._redis.set(self._keys.gangs_placing, worker, nx=True, px=ttl_ms))

    def waiting(self, limit: int = 50) -> list[Waiting]:
        """The oldest ``limit`` gang jobs waiting for workers, oldest first."""
        ids = [raw.decode() for raw in cast(list[bytes], self._redis.zrange(self._keys.gangs, 0, limit - 1))]
        if not ids:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(self._keys.job(job_id), "gl_spec")
        found = []
        for job_id, raw in zip(ids, pipe.execute(), strict=True):
            try:
                found.append(Waiting(job_id, parse_spec(raw)))
            except (TypeError, ValueError):
                # Written by something other than a client: it fails, saying so, rather than wait for ever.
                log.warning("gang job %s: its record is missing or garbled; it fails", job_id)
                self.spoil(job_id, "gl_spec is not a job's spec")
        return found

    def spoil(self, job_id: str, why: str) -> bool:
        """Fail a waiting job whose record cannot be read (``spoil.lua``); False if it no longer waits."""
        return bool(self._scripts.run("spoil", [self._keys.job(job_id)], [job_id, why, timestamp()]))

    def place(
        self, job: Waiting, candidates: Sequence[Candidate], *, may_hold: bool, hold: Hold, lease_ms: int
    ) -> tuple[str, list[str]]:
        """Place ``job`` on the first workers among ``candidates`` that fit one node each now, all or
        none: ('placed', the workers of nodes 0, 1, ...), ('held', the workers now held for it),
        ('waiting', []) or ('gone', []) when it no longer waits."""
        needs = job.spec.requirements
        args: list[object] = [
            job.job_id,
            timestamp(),
            lease_ms,
            int(may_hold),
            hold.after_ms,
            hold.ttl_ms,
            needs.gpus,
            needs.cpus,
            needs.memory,
        ]
        for candidate in candidates:
            name = self._keys.rq_worker_name(candidate.worker)
            args.extend((name, candidate.slots, candidate.memory, gpu_list(candidate.eligible)))
        outcome, *workers = self._scripts.run(
            "gang", [self._keys.job(job.job_id), self._keys.rq_suspended], args
        )
        return outcome.decode(), [worker.decode() for worker in workers]
