"""The worker: an RQ worker that runs GPUlayer jobs, several at once."""

from __future__ import annotations

from typing import Any

from ..access import Access
from ..settings import Settings
from ..store.connection import connect
from .worker import Worker

__all__ = ["Worker", "open_worker"]


def open_worker(access: Access, settings: Settings, **options: Any) -> Worker:
    """A worker acting as ``access``, with ``settings`` (its lease and heartbeat among them);
    ``options`` as :class:`Worker` takes them (``name``, ``offer``, ...).

    Its connection is its own: a command gives up within half a lease, and redis-py retries none,
    because the worker retries on its own terms and must see a dead network before its leases end."""
    connection = connect(
        access.redis_url, ca=access.ca, socket_timeout=max(1.0, settings.lease_ttl / 2), retries=0
    )
    return Worker(connection, settings, keyring=access.keyring, identity=access.identity or "", **options)
