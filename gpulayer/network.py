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


def parse_address(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or a bare IPv6 address, read into the host and
    its port (None where none is given); ValueError with a reason if it is none of those."""
    if text.startswith("["):
        host, bracket, tail = text[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise ValueError(f"{text!r} is not an address (an IPv6 address with a port: [v6]:PORT)")
        port = tail[1:]
    elif text.count(":") > 1:  # IPv6 with no brackets: no port can be told from it
        host, port = text, ""
    else:
        host, _, port = text.partition(":")
    if not host:
        raise ValueError(f"{text!r} names no host")
    if port and not (port.isascii() and port.isdigit() and 0 < int(port) <= 65535):
        raise ValueError(f"the port of {text!r} is not a port (1 to 65535)")
    return host, int(port) if port else None


def address_text(host: str, port: int | None) -> str:
    """``host:port`` as a URL writes it: an IPv6 address in brackets, no port where None."""
    where = f"[{host}]" if ":" in host else host
    return where if port is None else f"{where}:{port}"


def redact(url: str) -> str:
    """The URL with its password replaced by ``***``, for messages and logs; also a URL that does not
    parse as a Redis URL (a bad port), which is when a message most needs to show it."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))
