"""Opening a Redis connection."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from redis import Redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError, ResponseError, TimeoutError
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from .. import sentinel
from ..settings import check_redis_url

#: The first wait (s) before a worker or client tries a Redis it lost again, doubling after each
#: failure: short, as a promoted replica answers within moments of the sentinels naming it.
RECONNECT_AFTER = 0.25

#: How long a client of a Redis behind Sentinel keeps sending a command that lost its connection (s):
#: through a failover (Sentinel's defaults take about 30 s to declare a master down and promote a
#: replica), so a command waits for the new master instead of failing.
FAILOVER_WAIT = 40.0

#: Longest single block on Redis (ms) while waiting for a job or its logs; waits loop, so a
#: dropped connection is noticed within this time. Stays well under the socket timeout.
BLOCK_MS = 5000


class NoSentinelAnswered(MasterNotFoundError):
    """No sentinel of a Sentinel URL answered (each refused, timed out, or failed TLS): a wrong URL or
    CA, or every sentinel down. Waiting does not mend that as it mends a failover under way, so a
    client says so at once instead of retrying for :data:`FAILOVER_WAIT`."""


class _Sentinels(Sentinel):
    """redis-py's Sentinel, telling "no sentinel answered" (:class:`NoSentinelAnswered`) from "the
    sentinels name no master now" (a failover under way), each in one line: redis-py says both alike,
    naming each sentinel by its client's whole repr (the CA's PEM among its settings)."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        failures = []
        for index, watcher in enumerate(self.sentinels):
            try:
                masters = watcher.sentinel_masters()
            except (ConnectionError, TimeoutError, ResponseError) as exc:
                where = watcher.connection_pool.connection_kwargs
                failures.append(f"{where.get('host')}:{where.get('port')}: {exc}")
                continue
            state = masters.get(service_name) if isinstance(masters, dict) else None
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                # Asked first from now on, as redis-py does: it answered.
                self.sentinels[0], self.sentinels[index] = watcher, self.sentinels[0]
                return str(state["ip"]), int(state["port"])
        if len(failures) == len(self.sentinels):
            raise NoSentinelAnswered(
                f"no sentinel answered for master {service_name!r}: {'; '.join(failures)}"
            )
        raise MasterNotFoundError(f"the sentinels name no master {service_name!r} now")


def _through_failover(error: Exception) -> bool:
    """Whether a command that failed so may succeed once a failover ends."""
    return not isinstance(error, NoSentinelAnswered)


def connect(
    url: str, *, ca: str | None = None, socket_timeout: float | None = 30.0, retries: int | None = None
) -> Redis:
    """A client for ``url``; nothing is sent until the first command. ``retries``: how often redis-py
    itself retries a command that lost its connection (default: its own setting; through Sentinel,
    for up to :data:`FAILOVER_WAIT`, unless no sentinel answers); a worker sets 0, because it retries
    on its own terms and must notice a dead network within a lease.

    ``ca``: for a ``rediss://`` URL, the PEM of the one CA its certificate must be signed by (the
    installation's own, which signs nothing but its Redis's certificate, so the name in the
    certificate is not checked: a machine behind NAT reaches Redis by an address the certificate
    cannot know). Without it, the system's CAs and the host name are checked, as for any TLS server.

    A Sentinel URL (:mod:`gpulayer.sentinel`) gives a client of the master the sentinels name, which
    asks them again whenever it connects anew: a failover is followed without a restart."""
    check_redis_url(url)  # whoever gave it (an access, the SDK's Client(url)), one line, not redis-py's
    connect_timeout = min(5.0, socket_timeout or 5.0)
    tls: dict[str, Any] = {}
    if urlsplit(url).scheme in ("rediss", "rediss+sentinel"):
        tls["ssl_cert_reqs"] = "required"
        if ca:
            tls.update(ssl_ca_data=ca, ssl_check_hostname=False)
    options: dict[str, Any] = {"socket_connect_timeout": connect_timeout, **tls}
    if retries is not None:
        options["retry"] = Retry(NoBackoff(), retries)
    if not sentinel.is_sentinel(url):
        return Redis.from_url(url, socket_timeout=socket_timeout, health_check_interval=30, **options)
    options.setdefault(
        "retry",
        Retry(
            ExponentialBackoff(cap=RECONNECT_AFTER, base=0.05),
            round(FAILOVER_WAIT / RECONNECT_AFTER),
            is_retryable=_through_failover,
        ),
    )
    found = sentinel.parse(url)
    if found.tls:
        tls["ssl"] = options["ssl"] = True
    # A sentinel that does not answer is passed over for the next: no retries of its own, short waits.
    watchers = _Sentinels(
        found.sentinels,
        sentinel_kwargs={"socket_timeout": connect_timeout, "socket_connect_timeout": connect_timeout, **tls},
    )
    client: Redis = watchers.master_for(
        found.master,
        db=found.db,
        username=found.username,
        password=found.password,
        socket_timeout=socket_timeout,
        health_check_interval=30,
        **options,
    )
    return client
