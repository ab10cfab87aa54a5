"""What `gpulayer up` started on this machine, remembered under ``GPULAYER_HOME``, and how every
other command finds its Redis without flags."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
from pydantic import BaseModel, ValidationError

from .errors import ConfigError

STATE_FILE = "server.json"


class LocalState(BaseModel):
    """The Redis URL `gpulayer up` set up, and the processes it started (None once stopped)."""

    redis_url: str
    #: The embedded redis-server; None when `up` was given an external Redis.
    embedded: bool
    port: int | None = None
    bind: str = "127.0.0.1"
    redis_pid: int | None = None
    worker_pid: int | None = None
    worker_name: str | None = None
    #: The HTTP API and dashboard server, on 127.0.0.1.
    web_pid: int | None = None
    web_port: int | None = None


def load(home: Path) -> LocalState | None:
    path = home / STATE_FILE
    try:
        return LocalState.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValidationError:
        raise ConfigError(f"{path} is damaged; remove it and run `gpulayer up` again") from None


def save(home: Path, state: LocalState) -> None:
    """Written atomically and readable only by its owner: the URL holds the Redis password."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / STATE_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(state.model_dump_json(indent=2))
    tmp.replace(path)


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def resolve_redis_url(explicit: str | None, home: Path) -> str:
    """``--redis-url`` or ``GPULAYER_REDIS_URL`` if given, else the Redis that `gpulayer up` runs here."""
    if explicit:
        return explicit
    state = load(home)
    if state is None:
        raise ConfigError(
            "no Redis to talk to: run `gpulayer up`, or pass --redis-url / set GPULAYER_REDIS_URL"
        )
    if state.embedded and not alive(state.redis_pid):
        raise ConfigError("the Redis that `gpulayer up` started is not running: run `gpulayer up` again")
    return state.redis_url
