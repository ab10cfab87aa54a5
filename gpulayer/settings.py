"""Settings: one frozen object built from flags and ``GPULAYER_*`` variables, passed down, never global."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .units import parse_duration, parse_size

_PREFIX = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

MiB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a client or a worker needs to know besides the job itself.

    Each field has a ``GPULAYER_<FIELD>`` variable; sizes take units (``512MiB``), durations
    take ``s``/``m``/``h``/``d``.
    """

    redis_url: str | None = None
    #: Every key of ours starts with this; two installations can share one Redis with two prefixes.
    prefix: str = "gpulayer"
    #: Where `gpulayer up` keeps the embedded Redis's data and what it started, and workers their job folders.
    home: Path = dataclasses.field(default_factory=lambda: Path("~/.gpulayer").expanduser())
    #: The log stream of a job keeps its last this many lines.
    log_max_lines: int = 10_000
    #: Longer lines are split into pieces of this many bytes.
    log_line_max_bytes: int = 16 * 1024
    #: Source folders larger than this (after the ignore rules) are refused at submit.
    max_source_bytes: int = 100 * MiB
    #: A job's stored files — source and inputs, and separately its outputs — may not exceed this.
    max_job_bytes: int = 256 * MiB
    #: Ended jobs, with their logs and outputs, are kept this long (seconds).
    retention_seconds: int = 7 * 86400
    #: After SIGTERM, a job's processes have this long (seconds) before SIGKILL.
    kill_grace_seconds: float = 10.0
    #: The oldest waiting gang job holds the workers it needs once it has waited this long (seconds):
    #: they take no new jobs until it starts.
    gang_hold_after: float = 30.0
    #: Workers sample their machine (CPU, memory, GPUs) this often (seconds), for the dashboard and
    #: /metrics; Redis keeps an hour of samples.
    telemetry_interval: float = 5.0
    #: A running job's checkpoint folder (GPULAYER_CHECKPOINT_DIR) is kept in Redis, when it changed,
    #: this often (seconds), so a retry on any worker starts from it.
    checkpoint_interval: float = 30.0

    def __post_init__(self) -> None:
        if not _PREFIX.match(self.prefix):
            raise ConfigError(
                f"GPULAYER_PREFIX {self.prefix!r} must be 1-64 letters, digits, '_', '.' or '-'"
            )
        for field in (
            "log_max_lines",
            "log_line_max_bytes",
            "max_source_bytes",
            "max_job_bytes",
            "retention_seconds",
            "telemetry_interval",
            "checkpoint_interval",
        ):
            if getattr(self, field) <= 0:
                raise ConfigError(f"{field} must be positive")
        if self.kill_grace_seconds < 0 or self.gang_hold_after < 0:
            raise ConfigError("kill_grace_seconds and gang_hold_after must not be negative")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``GPULAYER_*`` variables; ``overrides`` (flags) win over them, except ``None`` ones."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        parsers: dict[str, Callable[[str], Any]] = {
            "redis_url": str,
            "prefix": str,
            "home": lambda v: Path(v).expanduser(),
            "log_max_lines": int,
            "log_line_max_bytes": parse_size,
            "max_source_bytes": parse_size,
            "max_job_bytes": parse_size,
            "retention_seconds": lambda v: int(parse_duration(v)),
            "kill_grace_seconds": parse_duration,
            "gang_hold_after": parse_duration,
            "telemetry_interval": parse_duration,
            "checkpoint_interval": parse_duration,
        }
        for name, parse in parsers.items():
            raw = env.get(f"GPULAYER_{name.upper()}")
            if raw:
                try:
                    values[name] = parse(raw)
                except ValueError as exc:
                    raise ConfigError(f"GPULAYER_{name.upper()}: {exc}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
