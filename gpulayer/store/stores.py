"""Every store of one installation over one Redis connection, built once: what a client and a worker
share, so neither wires them by hand."""

from __future__ import annotations

import dataclasses

from redis import Redis

from ..settings import Settings
from ..signing import Identities, Keyring
from .artifacts import RedisArtifactStore
from .capacity import CapacityStore
from .execution import ExecutionStore
from .gangs import GangStore
from .jobs import JobStore
from .keys import Keys
from .logs import LogStore
from .queues import QueueStore
from .registry import IdentityRegistry
from .scripts import Scripts
from .telemetry import TelemetryStore
from .tokens import TokenStore
from .transfers import TransferStore
from .workers import WorkerStore


@dataclasses.dataclass(frozen=True)
class Stores:
    redis: Redis
    keys: Keys
    scripts: Scripts
    jobs: JobStore
    logs: LogStore
    artifacts: RedisArtifactStore
    workers: WorkerStore
    queues: QueueStore
    tokens: TokenStore
    telemetry: TelemetryStore
    gangs: GangStore
    registry: IdentityRegistry
    transfers: TransferStore
    capacity: CapacityStore

    @classmethod
    def open(cls, redis: Redis, settings: Settings, keyring: Keyring | None = None) -> Stores:
        """The stores of ``settings.prefix``'s installation; ``keyring`` signs what is submitted and
        checks the identities of workers."""
        keys = Keys(settings.prefix)
        checker = keyring.identity_verify if keyring else None
        scripts = Scripts(redis, keys, settings)
        return cls(
            redis=redis,
            keys=keys,
            scripts=scripts,
            jobs=JobStore(redis, keys, scripts, settings, keyring),
            logs=LogStore(redis, keys),
            artifacts=RedisArtifactStore(redis, keys),
            workers=WorkerStore(redis, keys),
            queues=QueueStore(redis, keys),
            tokens=TokenStore(redis, keys),
            telemetry=TelemetryStore(redis, keys, settings.telemetry_interval),
            gangs=GangStore(redis, keys, scripts),
            registry=IdentityRegistry(redis, keys, Identities(checker) if checker else None),
            transfers=TransferStore(redis, keys),
            capacity=CapacityStore(redis, keys),
        )

    def execution(self, worker: str, identity: str = "") -> ExecutionStore:
        """What worker ``worker`` claims (as its ``identity``), runs and ends jobs through."""
        return ExecutionStore(self.redis, self.keys, self.scripts, worker, identity)
