"""Capacity on demand: providers of machines (plugins, by entry point) and the autoscaler that starts
them for jobs no connected worker could ever run, and stops them once idle (docs/capacity.md)."""

from .autoscaler import Autoscaler, Enroller
from .config import CapacityConfig, Limits
from .provider import MachineKind, MachineStatus, Provider, ProviderError, load

__all__ = [
    "Autoscaler",
    "CapacityConfig",
    "Enroller",
    "Limits",
    "MachineKind",
    "MachineStatus",
    "Provider",
    "ProviderError",
    "load",
]
