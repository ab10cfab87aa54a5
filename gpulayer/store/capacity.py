"""The autoscaler's own keys: the machines it started, its decisions, and which autoscaler acts."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import cast

from redis import Redis

from ..provisioned import Decision, Machine
from .garbled import readable
from .keys import Keys


class CapacityStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    def machines(self) -> dict[str, Machine]:
        raw = cast(dict[bytes, bytes], self._redis.hgetall(self._keys.capacity_machines))
        found = {}
        for name, record in raw.items():
            machine = readable(partial(Machine.model_validate_json, record), f"machine {name.decode()}")
            if machine is not None:
                found[machine.name] = machine
        return found

    def put(self, machine: Machine) -> None:
        self._redis.hset(self._keys.capacity_machines, machine.name, machine.model_dump_json())

    def forget(self, names: Iterable[str]) -> None:
        names = list(names)
        if names:
            self._redis.hdel(self._keys.capacity_machines, *names)

    def decision(self, about: str) -> Decision | None:
        raw = cast(bytes | None, self._redis.hget(self._keys.capacity_decisions, about))
        return readable(partial(Decision.model_validate_json, raw), f"decision on {about}") if raw else None

    def decide(self, decisions: dict[str, Decision]) -> None:
        """Keep these decisions, and only these: the others' jobs no longer wait for capacity."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(self._keys.capacity_decisions)
        if decisions:
            mapping = {about: decision.model_dump_json() for about, decision in decisions.items()}
            pipe.hset(self._keys.capacity_decisions, mapping=mapping)  # type: ignore[arg-type]
        pipe.execute()

    def lead(self, me: str, ttl_ms: int) -> bool:
        """Whether autoscaler ``me`` acts now: it took the turn, or renewed its own."""
        key = self._keys.capacity_leader
        if self._redis.set(key, me, nx=True, px=ttl_ms):
            return True
        if self._redis.get(key) == me.encode():
            self._redis.pexpire(key, ttl_ms)
            return True
        return False

    def step_down(self, me: str) -> None:
        if self._redis.get(self._keys.capacity_leader) == me.encode():
            self._redis.delete(self._keys.capacity_leader)
