"""Opening a Redis connection, and naming it without its password."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from redis import Redis

from ..errors import ConfigError

_SCHEMES = ("redis", "rediss", "unix")
#: Longest single block on Redis (ms) while waiting for a job or its logs; waits loop, so a
#: dropped connection is noticed within this time. Stays well under the socket timeout.
BLOCK_MS = 5000


def connect(url: str, *, socket_timeout: float | None = 30.0) -> Redis:
    """A client for ``url``; nothing is sent until the first command."""
    if urlsplit(url).scheme not in _SCHEMES:
        raise ConfigError(f"not a Redis URL: {redact(url)} (expected redis://host:port/db)")
    return Redis.from_url(
        url, socket_connect_timeout=5, socket_timeout=socket_timeout, health_check_interval=30
    )


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
