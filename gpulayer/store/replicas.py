"""The replicas of a master that Sentinel watches, for what Redis does not replicate: its users (ACL
SETUSER and ACL SAVE act on one node only), which a replica must have before it is promoted, or every
role is refused by the new master."""

from __future__ import annotations

from typing import Any

from redis import Redis
from redis.connection import Connection, ConnectionPool, SSLConnection
from redis.sentinel import SentinelConnectionPool


def replicas(redis: Redis) -> list[Redis]:
    """A connection to each replica the sentinels report up, as the same user and with the same TLS
    as ``redis``'s; none for a Redis not reached through Sentinel (one without replicas to promote).
    A replica down now is not among them: `gpulayer access apply` puts the users on it when it is back."""
    pool = redis.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return []
    # What the master's connections are made with (user, password, timeouts, TLS), less the address
    # and the Sentinel pool that asks for it.
    options: dict[str, Any] = {
        name: value for name, value in pool.connection_kwargs.items() if name != "connection_pool"
    }
    kind = SSLConnection if issubclass(pool.connection_class, SSLConnection) else Connection
    found = pool.sentinel_manager.discover_replicas(pool.service_name)
    return [
        Redis.from_pool(ConnectionPool(connection_class=kind, host=str(host), port=int(port), **options))
        for host, port in found
    ]
