"""This machine on the network: a free port, its address on the route to another, and a URL as
messages may show it. Kept apart from :mod:`gpulayer.server` (which starts Redis) and from the store
(which talks to it), so that workers, the CLI and the Trainer take these without either."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit, urlunsplit


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now ('': on every interface)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def address_towards(host: str, port: int) -> str:
    """This machine's address on its route to ``host`` (a UDP connect sends nothing; it only picks
    the interface); the host name if there is no route."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, port))
            return str(probe.getsockname()[0])
        except OSError:
            return socket.gethostname()


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``, for messages and logs; also a URL that does not
    parse as a Redis URL (a bad port), which is when a message most needs to show it."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))
