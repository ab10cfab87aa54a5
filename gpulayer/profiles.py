"""Runtime profiles: named presets of what a job needs (an accelerator, frameworks its worker must
have) and the packages of the Python environment it brings. GPUlayer's are in ``profiles.toml``
beside this module; a user's own file (``GPULAYER_PROFILES``) adds to them or replaces them by name.
A profile's fields go under the options given beside it: those win.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .environments import requirement_line
from .errors import ConfigError, InvalidJobSpec
from .models import validation_message
from .projects import read_toml
from .requirements import Accelerator

#: GPUlayer's own profiles.
BUILT_IN = Path(__file__).with_name("profiles.toml")


class Profile(BaseModel):
    """One profile: what it sets, and where it was tested."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str = Field(min_length=1, max_length=500)
    accelerator: Accelerator | None = None
    #: PEP 508 requirements on packages the worker itself must have (``--framework``).
    frameworks: tuple[str, ...] = ()
    #: PEP 508 requirements installed in the job's own environment (``--pip``).
    pip: tuple[str, ...] = ()
    #: Where it was run end to end, said honestly ("tested here: CPU only", "not tested: ...").
    tested: str = Field(default="not tested", max_length=500)

    @field_validator("pip")
    @classmethod
    def _requirements(cls, pip: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(requirement_line(text) for text in pip)

    def requirement_fields(self) -> dict[str, Any]:
        """What it sets of :class:`~gpulayer.Requirements`, by field."""
        fields: dict[str, Any] = {"frameworks": self.frameworks} if self.frameworks else {}
        if self.accelerator is not None:
            fields["accelerator"] = self.accelerator
        return fields

    def sets(self) -> str:
        """What it sets, on one line."""
        parts = [f"accelerator {self.accelerator}"] if self.accelerator else []
        parts += [f"framework {text}" for text in self.frameworks]
        parts += [f"pip {text}" for text in self.pip]
        return ", ".join(parts) or "nothing"


def profiles(user_file: Path | None = None) -> dict[str, Profile]:
    """GPUlayer's profiles, with ``user_file``'s added (or in place of those of the same name)."""
    table = dict(_read(BUILT_IN))
    if user_file is not None:
        table.update(_read(user_file))
    return table


def profile(name: str, user_file: Path | None = None) -> Profile:
    """The profile ``name``, or :class:`InvalidJobSpec` naming those there are."""
    table = profiles(user_file)
    found = table.get(name)
    if found is None:
        raise InvalidJobSpec(
            f"invalid job: profile: no profile {name!r} (there are {', '.join(sorted(table))})"
        )
    return found


@functools.lru_cache(maxsize=8)
def _cached(path: Path, mtime: float) -> Mapping[str, Profile]:
    try:
        data = read_toml(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the profiles in {path}: {exc}") from None
    table = {}
    for name, fields in data.items():
        try:
            table[name] = Profile.model_validate(fields)
        except ValidationError as exc:
            raise ConfigError(f"profile {name!r} in {path}: {validation_message(exc)}") from None
    return table


def _read(path: Path) -> Mapping[str, Profile]:
    """The profiles of ``path``, read again only once it changed."""
    try:
        mtime = path.stat().st_mtime
    except OSError as exc:
        raise ConfigError(f"cannot read the profiles in {path}: {exc.strerror}") from None
    return _cached(path, mtime)
