"""What `gpulayer up` started on this machine, remembered under ``GPULAYER_HOME``, and how files
there are written: the home and its folders readable by their owner only, each file 600."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

import psutil
from pydantic import BaseModel, ValidationError

from .errors import ConfigError

STATE_FILE = "server.json"


class LocalState(BaseModel):
    """What `gpulayer up` set up, and the processes it started (None once stopped). The Redis it uses,
    and each role's way in, are in the installation (:mod:`gpulayer.installation`)."""

    #: The embedded redis-server; None when `up` was given an external Redis.
    embedded: bool
    port: int | None = None
    bind: str = "127.0.0.1"
    redis_pid: int | None = None
    worker_pid: int | None = None
    worker_name: str | None = None
    #: The user the local worker runs its jobs as, if not its own.
    run_as: str | None = None
    #: What the local worker was told to offer (None: what it detects), for an `up` that restarts it.
    slots: int | None = None
    gpus: str | None = None
    #: The HTTP API and dashboard server, on 127.0.0.1.
    web_pid: int | None = None
    web_port: int | None = None


def load(home: Path) -> LocalState | None:
    return read_record(home / STATE_FILE, LocalState, "remove it and run `gpulayer up` again")


Record = TypeVar("Record", bound=BaseModel)


def read_record(path: Path, model: type[Record], damaged: str) -> Record | None:
    """The ``model`` kept in ``path``; None if there is none; :class:`ConfigError` (``path`` is
    damaged: ``damaged`` says what to do) if it cannot be read as one."""
    try:
        return model.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValidationError:
        raise ConfigError(f"{path} is damaged; {damaged}") from None


def save(home: Path, state: LocalState) -> None:
    private_folder(home)
    write_private(home / STATE_FILE, state.model_dump_json(indent=2))


def private_folder(path: Path) -> Path:
    """``path`` (and any folder above it that is missing) made, and made the owner's alone: on a
    shared machine no other user may list or read what GPUlayer keeps there."""
    for folder in reversed([folder for folder in (path, *path.parents) if not folder.exists()]):
        folder.mkdir(mode=0o700, exist_ok=True)  # each one: parents=True would make them 755
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)
    return path


def write_private(path: Path, text: str | bytes) -> None:
    """Write ``path`` atomically, readable by its owner only, from its first byte."""
    data = text.encode() if isinstance(text, str) else text
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    tmp.replace(path)


def open_log(path: Path) -> int:
    """A log file of ours to append to (600): a job's or a server's output can hold secrets."""
    private_folder(path.parent)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
