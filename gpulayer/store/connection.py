"""Opening a Redis connection."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from redis import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..settings import check_redis_url

#: Longest single block on Redis (ms) while waiting for a job or its logs; waits loop, so a
#: dropped connection is noticed within this time. Stays well under the socket timeout.
BLOCK_MS = 5000


def connect(
    url: str, *, ca: str | None = None, socket_timeout: float | None = 30.0, retries: int | None = None
) -> Redis:
    """A client for ``url``; nothing is sent until the first command. ``retries``: how often redis-py
    itself retries a command that lost its connection (default: its own setting); a worker sets 0,
    because it retries on its own terms and must notice a dead network within a lease.

    ``ca``: for a ``rediss://`` URL, the PEM of the one CA its certificate must be signed by (the
    installation's own, which signs nothing but its Redis's certificate, so the name in the
    certificate is not checked: a machine behind NAT reaches Redis by an address the certificate
    cannot know). Without it, the system's CAs and the host name are checked, as for any TLS server."""
    check_redis_url(url)  # whoever gave it (an access, the SDK's Client(url)), one line, not redis-py's
    scheme = urlsplit(url).scheme
    options: dict[str, Any] = {"socket_connect_timeout": min(5.0, socket_timeout or 5.0)}
    if scheme == "rediss":
        options["ssl_cert_reqs"] = "required"
        if ca:
            options.update(ssl_ca_data=ca, ssl_check_hostname=False)
    if retries is not None:
        options["retry"] = Retry(NoBackoff(), retries)
    return Redis.from_url(url, socket_timeout=socket_timeout, health_check_interval=30, **options)
