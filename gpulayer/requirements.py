"""What a job needs from the machine that runs it, and whether that machine is its submitter's:
:class:`Requirements`, never a machine by name.

Defaults are resolved on validation, so two ways of asking for the same thing give the same model,
the same canonical form, and the same queue. A job's target is placement too: a worker serves the
queues of the jobs it could ever run (:mod:`gpulayer.worker.queues`), so a job for this machine
only is in a queue that only this machine's workers serve.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from typing_extensions import TypedDict

from .machines import this_machine
from .units import parse_size

Accelerator = Literal["cpu", "cuda", "rocm", "mps", "any"]
#: Where a job may run: on a worker of its submitter's machine, on one of another machine, or either.
Target = Literal["local", "remote", "any"]
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}$")


class Requirements(BaseModel):
    """What a job needs. ``gpus`` defaults to 1 for ``cuda`` and ``mps`` (and when a GPU memory or
    name is given), else 0; a job with no GPUs is a ``cpu`` job. ``cpus`` (CPU slots) defaults to 1
    for a CPU job and 0 for a GPU job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    accelerator: Accelerator = "cpu"
    gpus: int = Field(default=0, ge=0, le=64)
    #: Bytes each GPU must have, at least.
    gpu_memory: int | None = Field(default=None, gt=0)
    #: A regular expression searched (case-insensitively) in each GPU's name, e.g. ``A100|H100``.
    gpu_name: str | None = Field(default=None, min_length=1, max_length=200)
    #: PEP 508 requirements on installed packages, e.g. ``torch>=2.1``; normalised and sorted.
    frameworks: tuple[str, ...] = Field(default=(), max_length=32)
    #: CPU slots the job holds while it runs.
    cpus: int = Field(default=1, ge=0, le=4096)
    #: Bytes of the worker's memory the job holds while it runs.
    memory: int = Field(default=0, ge=0)
    #: Worker labels the job needs, each exactly.
    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    #: ``local``: a worker on the submitter's machine; ``remote``: a worker on another; ``any``.
    target: Target = "any"
    #: The machine ``target`` is relative to (:func:`gpulayer.machines.this_machine`): set at submit
    #: to the submitter's, for ``local`` and ``remote``.
    machine: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")

    @model_validator(mode="before")
    @classmethod
    def _resolve_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {key: value for key, value in data.items() if value is not None}
        asks_for_gpu = bool(data.get("gpus")) or "gpu_memory" in data or "gpu_name" in data
        accelerator = data.get("accelerator", "any" if asks_for_gpu else "cpu")
        gpus = data.get("gpus", 1 if asks_for_gpu or accelerator in ("cuda", "rocm", "mps") else 0)
        if accelerator == "cpu" and (gpus or "gpu_memory" in data or "gpu_name" in data):
            raise ValueError("a cpu job cannot ask for GPUs; use --accelerator cuda, rocm, mps or any")
        if not gpus and ("gpu_memory" in data or "gpu_name" in data):
            raise ValueError("a GPU memory or name needs at least one GPU (--gpus)")
        if gpus == 0 and accelerator == "any":
            accelerator = "cpu"
        data.update(accelerator=accelerator, gpus=gpus)
        data.setdefault("cpus", 0 if gpus else 1)
        if data.get("target", "any") == "any":
            if "machine" in data:
                raise ValueError("a machine goes with target local or remote only")
        else:
            data.setdefault("machine", this_machine())
        return data

    @model_validator(mode="after")
    def _one_mps_device(self) -> Requirements:
        if self.accelerator == "mps" and self.gpus > 1:
            raise ValueError("an Apple Silicon machine has one mps device; ask for --gpus 1")
        return self

    @field_validator("gpu_memory", "memory", mode="before")
    @classmethod
    def _sizes(cls, size: Any) -> Any:
        return parse_size(size) if isinstance(size, str) else size

    @field_validator("gpu_name")
    @classmethod
    def _pattern_compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"GPU name pattern {pattern!r} is not a regular expression: {exc}") from None
        return pattern

    @field_validator("frameworks", mode="before")
    @classmethod
    def _normalise_frameworks(cls, frameworks: Any) -> Any:
        if isinstance(frameworks, str):
            frameworks = (frameworks,)
        elif isinstance(frameworks, Mapping):  # {"torch": ">=2.1"}, as @gl.remote takes them
            frameworks = tuple(f"{name}{spec}" for name, spec in frameworks.items())
        if not isinstance(frameworks, list | tuple) or not all(isinstance(text, str) for text in frameworks):
            return frameworks  # not a list of strings: the field's own type check says what is wrong
        return tuple(sorted(str(parse_framework(text)) for text in frameworks))

    @field_validator("labels")
    @classmethod
    def _label_syntax(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not _LABEL_KEY.match(key):
                raise ValueError(f"label name {key!r} must be letters, digits, '_', '.', '-' or '/'")
            if not value or "\n" in value or len(value) > 200:
                raise ValueError(f"label {key} needs a one-line value")
        return dict(sorted(labels.items()))

    @property
    def is_default(self) -> bool:
        return self == DEFAULT

    def describe(self) -> str:
        """One line, e.g. ``2 cuda GPUs, each 24 GB+ named like 'A100', torch>=2.1, label zone=eu``."""
        parts = []
        if self.gpus:
            device = "GPU" if self.accelerator == "any" else f"{self.accelerator} GPU"
            parts.append(f"{self.gpus} {device}{'s' if self.gpus > 1 else ''}")
            each = [
                f"{self.gpu_memory / 1e9:g} GB+" if self.gpu_memory else "",
                f"named like {self.gpu_name!r}" if self.gpu_name else "",
            ]
            if any(each):
                parts[-1] += ", each " + " ".join(part for part in each if part)
        else:
            parts.append("CPU only")
        if self.cpus:
            parts.append(f"{self.cpus} CPU slot{'s' if self.cpus > 1 else ''}")
        if self.memory:
            parts.append(f"{self.memory / 1e9:g} GB memory")
        parts.extend(self.frameworks)
        parts.extend(f"label {key}={value}" for key, value in self.labels.items())
        if self.machine:
            parts.append(f"target {self.target} (of machine {self.machine[:8]})")
        return ", ".join(parts)

    @property
    def capability(self) -> str:
        """A stable, readable name for this requirement set: ``default``, or like ``cuda-2gpu-3f2a91bc``."""
        if self.is_default:
            return "default"
        digest = hashlib.sha1(self.model_dump_json().encode()).hexdigest()[:8]
        parts = [self.accelerator, f"{self.gpus}gpu" if self.gpus else "", digest]
        return "-".join(part for part in parts if part)


class RequirementKeywords(TypedDict, total=False):
    """:class:`Requirements`'s fields as keywords (``Client.submit(gpus=2)``, ``@gl.remote(gpus=2)``):
    sizes may be strings like ``"24GB"``, frameworks ``{"torch": ">=2.1"}``."""

    accelerator: Accelerator
    gpus: int
    gpu_memory: int | str | None
    gpu_name: str | None
    frameworks: Sequence[str] | Mapping[str, str]
    cpus: int
    memory: int | str
    labels: Mapping[str, str]
    target: Target
    machine: str | None


def parse_framework(text: str) -> Requirement:
    """``torch>=2.1`` as a requirement on an installed package: a name and a version specifier."""
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise ValueError(f"framework {text!r} is not a requirement like 'torch>=2.1': {exc}") from None
    if requirement.url or requirement.marker or requirement.extras:
        raise ValueError(f"framework {text!r}: only a name and a version range, like 'torch>=2.1'")
    requirement.name = canonicalize_name(requirement.name)
    return requirement


DEFAULT = Requirements()
