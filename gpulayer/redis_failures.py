"""What a Redis failure means to the one who asked, in one line, for each front end (the CLI, MCP)
to say it so. Apart from the pure core's errors, which never import Redis."""

from __future__ import annotations

from redis.exceptions import ConnectionError, RedisError, TimeoutError

from .errors import GpulayerError, RedisUnavailable


def redis_failure(error: RedisError, url: str | None = None) -> GpulayerError:
    """What a Redis failure means to the one who asked, in one line: Redis out of reach (at ``url``,
    where the caller knows it), or a request it refused. Each front end (the CLI, MCP) says it so."""
    if isinstance(error, (ConnectionError, TimeoutError)):
        return RedisUnavailable(f"cannot reach Redis{f' at {url}' if url else ''}: {error}")
    return GpulayerError(f"Redis refused the request: {error}")
