"""What an operator configures: the providers, the limits, and the timeouts (docs/capacity.md). Read
from a TOML file, ``$GPULAYER_HOME/capacity.toml`` or the one ``GPULAYER_CAPACITY`` names; the
providers' credentials are theirs, in that file or in the autoscaler's environment, nowhere else."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ConfigError
from ..models import validation_message
from ..units import parse_duration

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FILE = "capacity.toml"
VARIABLE = "GPULAYER_CAPACITY"


class Limits(BaseModel):
    """At most this many machines, GPUs, and this much an hour, of those started and not stopped;
    None: no limit."""

    model_config = ConfigDict(extra="forbid")

    machines: int | None = Field(default=None, ge=0)
    gpus: int | None = Field(default=None, ge=0)
    price_per_hour: float | None = Field(default=None, ge=0)


class CapacityConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: A machine whose worker has held no job this long (s) is stopped.
    idle_timeout: float = 600.0
    #: A machine whose worker has not joined this long (s) after its start is stopped, saying so.
    join_timeout: float = 900.0
    #: After a provider failed to start a machine, it is not asked again for this long (s).
    retry_after: float = 60.0
    #: The autoscaler looks this often (s), and at once when a job is queued.
    interval: float = 1.0
    #: How long (s) the autoscaler's turn lasts unrenewed: another one takes over after it.
    lead_ttl: float = 10.0
    #: The host machines reach Redis at, written in their tokens (default: the installation's).
    redis_host: str | None = None
    #: For all providers together.
    limits: Limits = Limits()
    #: Each provider's section, by its name: ``type`` (the entry point; default its name),
    #: ``limits`` (as above, for it alone), and its own options.
    providers: dict[str, dict[str, Any]] = {}

    @field_validator("idle_timeout", "join_timeout", "retry_after", "interval", "lead_ttl", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return parse_duration(value) if isinstance(value, str) else value

    def provider_limits(self, name: str) -> Limits:
        return Limits.model_validate(self.providers.get(name, {}).get("limits", {}))

    def provider_options(self, name: str) -> dict[str, Any]:
        return {key: value for key, value in self.providers[name].items() if key != "limits"}


def path(home: Path) -> Path:
    return Path(os.environ.get(VARIABLE) or home / FILE)


def load(home: Path) -> CapacityConfig | None:
    """The configuration, None where there is no file; :class:`ConfigError` for one that is wrong."""
    where = path(home)
    try:
        data = tomllib.loads(where.read_text())
    except FileNotFoundError:
        return None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {where}: {exc}") from None
    try:
        config = CapacityConfig.model_validate(data)
        for name in config.providers:
            config.provider_limits(name)
    except (ValidationError, ValueError) as exc:
        message = validation_message(exc) if isinstance(exc, ValidationError) else str(exc)
        raise ConfigError(f"{where}: {message}") from None
    return config
