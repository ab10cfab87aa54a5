"""What a provider of machines is to the autoscaler: it lists the kinds of machine it can start,
starts one under a name with a worker token of that machine's own, says how the machine stands, and
stops it. Providers are plugins, found by entry point (group ``gpulayer.providers``): the core
imports none of them, and a provider's credentials are its own configuration, in the autoscaler's
process only.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import ConfigError
from ..inventory import GPU, WorkerInfo
from ..models import validation_message
from ..units import parse_size

#: The entry point group providers register under, by the name an operator's configuration gives.
ENTRY_POINTS = "gpulayer.providers"

#: How a provider says a machine stands: still booting; up (its worker may not have joined yet); gone
#: (stopped, or never started); or failed, never to join.
MachineState = Literal["starting", "up", "gone", "failed"]


class ProviderError(Exception):
    """A provider could not do what it was asked (no quota, an API error, a bad image): the autoscaler
    records it as the reason and goes on."""


class MachineKind(BaseModel):
    """One kind of machine a provider can start, as a worker on it would offer itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    accelerator: Literal["cpu", "cuda", "mps"] = "cpu"
    gpus: int = Field(default=0, ge=0, le=64)
    #: Bytes each GPU has (config: a size, ``80GiB``).
    gpu_memory: int = Field(default=0, ge=0)
    #: The GPUs' name as NVML reports it (``NVIDIA H100 80GB HBM3``): what ``--gpu-name`` matches.
    gpu_model: str = ""
    cpus: int = Field(default=1, ge=1)
    #: Bytes of memory (config: a size).
    memory: int = Field(default=0, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    #: Packages its image has installed (name → version), for jobs that ask for frameworks.
    frameworks: dict[str, str] = Field(default_factory=dict)
    #: What one costs per hour, where known: the cheapest kind that fits is started.
    price_per_hour: float | None = Field(default=None, ge=0)
    #: About how long (s) one takes from start to its worker joining: what `gpulayer why` says.
    boot_seconds: float = Field(default=120.0, ge=0)

    @field_validator("gpu_memory", "memory", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value) if isinstance(value, str) else value

    def fake_gpus(self) -> str | None:
        """Its GPUs as a worker simulates them (``GPULAYER_FAKE_GPUS``, ``--fake-gpus``); None for a
        kind without CUDA GPUs."""
        if not self.gpus or self.accelerator != "cuda":
            return None
        return json.dumps([{"name": self.gpu_model or self.name, "memory": self.gpu_memory}] * self.gpus)

    def offer(self, worker: str = "") -> WorkerInfo:
        """What a worker on such a machine would offer: placement's own input, so a job is matched
        against a kind exactly as against a connected worker."""
        kind: Literal["cuda", "mps"] = "mps" if self.accelerator == "mps" else "cuda"
        gpus = [
            GPU(
                index=index,
                kind=kind,
                name=self.gpu_model or f"{self.name} GPU",
                uuid=f"{self.name}-{worker}-{index}",
                memory_total=self.gpu_memory,
            )
            for index in range(self.gpus if self.accelerator != "cpu" else 0)
        ]
        return WorkerInfo(
            name=worker or self.name,
            host="",
            pid=0,
            state="idle",
            slots=self.cpus,
            memory=self.memory,
            gpus=gpus,
            labels=self.labels,
            frameworks=self.frameworks,
        )


@dataclasses.dataclass(frozen=True)
class MachineStatus:
    """A machine as its provider sees it; ``detail``: why it failed or is gone, in words."""

    state: MachineState
    detail: str = ""


class Provider(abc.ABC):
    """A source of machines. Made from the operator's configuration by :func:`load` (the entry
    point's class is called with the provider's name and its section of the configuration).

    Machines are known by the name the autoscaler gives them, which is also the name of their worker
    and of its identity: a provider tags what it starts with it, so that an autoscaler that restarted
    finds its machines again (:meth:`status` of a name it started before)."""

    def __init__(self, name: str, options: Mapping[str, Any]) -> None:
        self.name = name

    @abc.abstractmethod
    def kinds(self) -> list[MachineKind]:
        """The kinds of machine it can start now."""

    @abc.abstractmethod
    def start(self, name: str, kind: MachineKind, token: str) -> None:
        """Start a machine of ``kind`` named ``name`` whose worker joins with ``token`` (an access
        token of its own identity, which is all it may be given); :class:`ProviderError` if it cannot.
        Returns once the start is asked for, not when the machine is up."""

    @abc.abstractmethod
    def status(self, name: str) -> MachineStatus:
        """How the machine ``name`` stands (``gone`` for a name it does not know)."""

    @abc.abstractmethod
    def stop(self, name: str) -> None:
        """Stop the machine ``name`` and free what it holds; nothing if it is gone already."""


Options = TypeVar("Options", bound=BaseModel)


def parse_options(provider: str, model: type[Options], options: Mapping[str, Any]) -> Options:
    """A provider's section of the configuration, checked by its own model; :class:`ProviderError`
    saying what is wrong."""
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        raise ProviderError(f"provider {provider}: {validation_message(exc)}") from None


def load(name: str, options: Mapping[str, Any]) -> Provider:
    """The provider ``name`` configured with ``options``, whose ``type`` names its entry point
    (default: ``name``): :class:`ConfigError` if none is installed under that name."""
    kind = str(options.get("type", name))
    found = {point.name: point for point in entry_points(group=ENTRY_POINTS)}
    if kind not in found:
        have = ", ".join(sorted(found)) or "none"
        raise ConfigError(f"provider {name!r}: no provider of type {kind!r} is installed (installed: {have})")
    factory = found[kind].load()
    provider = factory(name, {key: value for key, value in options.items() if key != "type"})
    if not isinstance(provider, Provider):
        raise ConfigError(f"provider {name!r}: {found[kind].value} is not a gpulayer Provider")
    return provider
