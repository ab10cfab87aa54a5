"""Settings: one frozen object built from flags and ``GPULAYER_*`` variables, passed down, never global.

Each field says how its variable is read and what it must hold, so every setting is parsed and checked
in one place, and a bad one is one line naming its variable.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from redis.connection import parse_url

from . import sentinel
from .errors import ConfigError
from .network import redact
from .units import parse_duration, parse_size

_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_REDIS_SCHEMES = ("redis", "rediss", "unix")

MiB = 1024 * 1024
Bound = Literal["positive", "not negative"]
_BOUNDS: dict[Bound, str] = {"positive": "above 0", "not negative": "0 or more"}


def _read(
    parse: Callable[[str], Any], bound: Bound | None = None, check: Callable[[Any], None] | None = None
) -> dict[str, Any]:
    """A field's metadata: its ``GPULAYER_*`` variable is read with ``parse``; ``bound`` and ``check``
    hold for flags and code too, not only for variables."""
    return {"parse": parse, "bound": bound, "check": check}


def _path(text: str) -> Path:
    return Path(text).expanduser()


_FLAGS = {word: True for word in ("1", "true", "yes", "on")} | {
    word: False for word in ("0", "false", "no", "off")
}


def _flag(text: str) -> bool:
    word = text.strip().lower()
    if word not in _FLAGS:
        raise ValueError(f"not 1 or 0: {text!r} (also true/false, yes/no, on/off)")
    return _FLAGS[word]


def _count(text: str) -> int:
    if not (text.strip().isascii() and text.strip().isdigit()):
        raise ValueError(f"not a whole number: {text!r} (examples: 500, 10000)")
    return int(text)


def _whole_seconds(text: str) -> int:
    # Up, so a fraction of a second is still a positive retention.
    return math.ceil(parse_duration(text))


def _check_prefix(prefix: str) -> None:
    if not _PREFIX.match(prefix):
        raise ConfigError(f"GPULAYER_PREFIX {prefix!r} must be 1-64 letters, digits, '_', '.' or '-'")


def check_redis_url(url: str) -> None:
    """:class:`ConfigError`, in one line without the password, unless redis-py can use ``url``."""
    problem = _redis_url_problem(url)
    if problem:
        raise ConfigError(f"not a Redis URL: {redact(url)} ({problem})")


def _redis_url_problem(url: str) -> str | None:
    scheme = url.partition("://")[0] if "://" in url else ""
    if sentinel.is_sentinel(url):
        try:
            sentinel.parse(url)
        except ValueError as exc:
            return str(exc)
        return None
    if scheme not in _REDIS_SCHEMES:
        return "expected redis://host:port/db, rediss://, unix:// or redis+sentinel://host:port,.../master"
    hostport = url.partition("://")[2].split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    port = hostport.rpartition(":")[2] if ":" in hostport and not hostport.endswith("]") else ""
    if port and not (port.isascii() and port.isdigit()):
        return f"its port {port!r} is not a number"
    if port and int(port) > 65535:
        return f"its port {port} is over 65535"
    try:
        urlsplit(url)
        parse_url(url)  # type: ignore[no-untyped-call]  # redis-py's own reading: what it refuses
    except ValueError as exc:
        return str(exc).rstrip(".")
    return None


def _check_containment(mode: str) -> None:
    if mode not in CONTAINMENT_MODES:
        raise ConfigError(f"GPULAYER_CONTAINMENT must be one of {', '.join(CONTAINMENT_MODES)}, not {mode!r}")


#: How a worker may contain its jobs (see :class:`Settings`'s ``containment``).
CONTAINMENT_MODES = ("auto", "cgroup2", "cgroup1", "none")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a client or a worker needs to know besides the job itself.

    Each field has a ``GPULAYER_<FIELD>`` variable; sizes take units (``512MiB``), durations
    take ``s``/``m``/``h``/``d``.
    """

    redis_url: str | None = dataclasses.field(default=None, metadata=_read(str, check=check_redis_url))
    #: Every key of ours starts with this; two installations can share one Redis with two prefixes.
    prefix: str = dataclasses.field(default="gpulayer", metadata=_read(str, check=_check_prefix))
    #: Where `gpulayer up` keeps the embedded Redis's data and what it started, and workers their job folders.
    home: Path = dataclasses.field(default_factory=lambda: _path("~/.gpulayer"), metadata=_read(_path))
    #: The log stream of a job keeps its last this many lines.
    log_max_lines: int = dataclasses.field(default=10_000, metadata=_read(_count, "positive"))
    #: Longer lines are split into pieces of this many bytes.
    log_line_max_bytes: int = dataclasses.field(default=16 * 1024, metadata=_read(parse_size, "positive"))
    #: Source folders larger than this (after the ignore rules) are refused at submit.
    max_source_bytes: int = dataclasses.field(default=100 * MiB, metadata=_read(parse_size, "positive"))
    #: A job's files stored in Redis — source and inputs, a function's result, a checkpoint folder —
    #: may not exceed this (outputs above ``redis_outputs_max_bytes`` stay on their worker instead,
    #: inputs above it with their submitter).
    max_job_bytes: int = dataclasses.field(default=256 * MiB, metadata=_read(parse_size, "positive"))
    #: A job's outputs up to this size (its files, before packing) are kept in Redis; larger ones stay
    #: on the worker that ran it, and a download pulls them through Redis a few chunks at a time. So
    #: do its ``--input`` files the other way: larger ones are served by their submitter until a worker
    #: pulled them.
    redis_outputs_max_bytes: int = dataclasses.field(default=64 * MiB, metadata=_read(parse_size, "positive"))
    #: An S3-compatible bucket (AWS S3, MinIO, R2, ...) that files over ``redis_outputs_max_bytes`` go
    #: to instead (the submitter's setting: it alone holds the store's credentials, boto3's own, and
    #: hands workers presigned URLs). None: no store; they stay with the side that made them.
    s3_bucket: str | None = dataclasses.field(default=None, metadata=_read(str))
    #: The store's endpoint, for one that is not AWS's (None: AWS's, by ``s3_region``).
    s3_endpoint_url: str | None = dataclasses.field(default=None, metadata=_read(str))
    s3_region: str | None = dataclasses.field(default=None, metadata=_read(str))
    #: Ended jobs, with their logs and outputs, are kept this long (seconds).
    retention_seconds: int = dataclasses.field(default=7 * 86400, metadata=_read(_whole_seconds, "positive"))
    #: After SIGTERM, a job's processes have this long (seconds) before SIGKILL.
    kill_grace_seconds: float = dataclasses.field(
        default=10.0, metadata=_read(parse_duration, "not negative")
    )
    #: The oldest waiting gang job holds the workers it needs once it has waited this long (seconds):
    #: they take no new jobs until it starts.
    gang_hold_after: float = dataclasses.field(default=30.0, metadata=_read(parse_duration, "not negative"))
    #: Workers sample their machine (CPU, memory, GPUs) this often (seconds), for the dashboard and
    #: /metrics; Redis keeps an hour of samples.
    telemetry_interval: float = dataclasses.field(default=5.0, metadata=_read(parse_duration, "positive"))
    #: A running job's checkpoint folder (GPULAYER_CHECKPOINT_DIR) is kept in Redis, when it changed,
    #: this often (seconds), so a retry on any worker starts from it.
    checkpoint_interval: float = dataclasses.field(default=30.0, metadata=_read(parse_duration, "positive"))
    #: A worker's lease on each job it holds lasts this long (seconds) unrenewed; then another worker
    #: may take the job.
    lease_ttl: float = dataclasses.field(default=15.0, metadata=_read(parse_duration, "positive"))
    #: A worker renews every lease it holds this often (seconds): well within ``lease_ttl``.
    heartbeat: float = dataclasses.field(default=5.0, metadata=_read(parse_duration, "positive"))
    #: How a worker contains its jobs: ``auto`` (cgroup v2 where delegated, else v1, else none),
    #: ``cgroup2``, ``cgroup1`` or ``none`` (processes followed by session and environment only).
    containment: str = dataclasses.field(default="auto", metadata=_read(str, check=_check_containment))
    #: A job's processes and threads may number at most this many (its cgroup's pids limit); 0: no limit.
    job_pids: int = dataclasses.field(default=4096, metadata=_read(_count, "not negative"))
    #: A submit returns only once this many of Redis's replicas have the job (WAIT), so that one
    #: acknowledged before the master died is on the replica promoted in its place; 0: the master only.
    submit_replicas: int = dataclasses.field(default=0, metadata=_read(_count, "not negative"))
    #: How long a submit waits for ``submit_replicas`` (seconds) before it fails, saying so.
    submit_replicas_timeout: float = dataclasses.field(
        default=5.0, metadata=_read(parse_duration, "positive")
    )

    #: Where no installation is configured, the first :class:`~gpulayer.Client` of a process starts a
    #: private one (a Redis and a local worker), stopped when the process exits; 0 turns it off.
    autostart: bool = dataclasses.field(default=True, metadata=_read(_flag))

    #: A TOML file of runtime profiles of one's own, added to GPUlayer's (docs/environments.md).
    profiles: Path | None = dataclasses.field(default=None, metadata=_read(_path))
    #: Where a worker keeps the Python environments it builds for jobs (default: ``envs`` in its
    #: home; with ``--run-as``, beside its job folders), shared by the workers of a machine that use it.
    env_cache: Path | None = dataclasses.field(default=None, metadata=_read(_path))
    #: Past this size, the environments used least recently are removed (not one a job is using).
    env_cache_max_bytes: int = dataclasses.field(
        default=20 * 1024 * MiB, metadata=_read(parse_size, "positive")
    )
    #: A build of a job's environment taking longer than this (seconds) is stopped: the job fails.
    env_build_timeout: float = dataclasses.field(default=1800.0, metadata=_read(parse_duration, "positive"))

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if isinstance(value, (str, os.PathLike)):
                # Read as its variable would be: Settings(home="~/gl") or lease_ttl="30s" from code.
                try:
                    value = field.metadata["parse"](os.fspath(value))
                except ValueError as exc:
                    raise ConfigError(f"{field.name}: {exc}") from None
                object.__setattr__(self, field.name, value)
            if field.metadata["check"]:
                field.metadata["check"](value)
            bound = field.metadata["bound"]
            if (bound == "positive" and value <= 0) or (bound == "not negative" and value < 0):
                raise ConfigError(f"{variable(field.name)} must be {_BOUNDS[bound]}, not {value}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``GPULAYER_*`` variables; ``overrides`` (flags) win over them, except ``None`` ones."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = env.get(variable(field.name))
            if raw:
                try:
                    values[field.name] = field.metadata["parse"](raw)
                except ValueError as exc:
                    raise ConfigError(f"{variable(field.name)}: {exc}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def variable(field: str) -> str:
    """The environment variable a field of :class:`Settings` is read from."""
    return f"GPULAYER_{field.upper()}"
