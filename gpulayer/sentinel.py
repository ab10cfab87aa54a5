"""Redis Sentinel URLs: ``redis+sentinel://[USER:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER[/DB]``
(``rediss+sentinel://`` for TLS to the sentinels and the master alike).

redis-py reads no such URL (its ``Sentinel`` takes the sentinels' addresses and a master's name), and
the one package that does knows neither ACL users nor TLS: this reads them. The user and password are
the master's (and its replicas'), a role's as in any URL of an installation's; the sentinels are
asked without a password, so they belong on a network only the installation's machines reach
(docs/deploy.md). A port left out is Sentinel's own, 26379.
"""

from __future__ import annotations

import dataclasses
from urllib.parse import unquote

from .network import address_text, parse_address

#: The schemes of a Sentinel URL, and whether each speaks TLS.
SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
SENTINEL_PORT = 26379


@dataclasses.dataclass(frozen=True)
class SentinelURL:
    """A Sentinel URL, read."""

    #: The sentinels' addresses, in the URL's order (redis-py asks them in turn).
    sentinels: tuple[tuple[str, int], ...]
    #: The name the sentinels know the master by (``sentinel monitor NAME ...``).
    master: str
    db: int
    username: str | None
    password: str | None
    tls: bool

    @property
    def scheme(self) -> str:
        return "rediss" if self.tls else "redis"

    def describe(self) -> str:
        """Where it leads, without the password: ``master NAME via sentinels HOST:PORT,...``."""
        return f"master {self.master} via sentinels {hosts_text(self.sentinels)}"


def is_sentinel(url: str) -> bool:
    return url.partition("://")[0] in SCHEMES


def parse(url: str) -> SentinelURL:
    """``url`` read; ValueError with a reason (no password in it) if it is not a Sentinel URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"expected {' or '.join(f'{name}://' for name in SCHEMES)}")
    if "?" in rest or "#" in rest:
        raise ValueError("a Sentinel URL takes no options (?...)")
    netloc, _, path = rest.partition("/")
    userinfo, at, hostlist = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
    sentinels = tuple(_address(part) for part in hostlist.split(","))
    master, _, db = path.partition("/")
    if not master:
        raise ValueError("it names no master: .../MASTER_NAME after the sentinels")
    if db and not (db.isascii() and db.isdigit()):
        raise ValueError(f"its database {db!r} is not a number")
    return SentinelURL(sentinels, unquote(master), int(db or 0), username, password, SCHEMES[scheme])


def _address(text: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; Sentinel's port where none is given."""
    if not text:
        raise ValueError("a sentinel's address is empty")
    host, port = parse_address(text)
    return host, port or SENTINEL_PORT


def hosts_text(addresses: tuple[tuple[str, int], ...]) -> str:
    """Addresses as a URL lists them: ``host:port,[v6]:port``."""
    return ",".join(address_text(host, port) for host, port in addresses)
