"""A Redis call a worker cannot do without, retried through an outage for as long as a lease could
still hold: past that, what the lease covered is presumed taken over."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis.exceptions

log = logging.getLogger("gpulayer.worker")
T = TypeVar("T")

#: Seconds between tries of a Redis call while Redis cannot be reached.
_REDIS_RETRY = 0.5


def through_outage(call: Callable[..., T], *args: Any, lease_ttl: float, what: str, **kwargs: Any) -> T:
    """``call`` retried while Redis cannot be reached, for at most ``lease_ttl`` seconds."""
    deadline = None
    while True:
        try:
            return call(*args, **kwargs)
        except redis.exceptions.AuthenticationError:
            raise  # its user is gone (revoked): no retry brings it back
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            now = time.monotonic()
            if deadline is None:
                deadline = now + lease_ttl
                log.warning("%s: cannot reach Redis (%s); retrying", what, exc)
            if now >= deadline:
                raise
            time.sleep(_REDIS_RETRY)
