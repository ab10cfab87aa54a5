"""This machine's CPUs, memory, GPUs and installed frameworks, as a worker advertises them.

NVIDIA GPUs come from NVML (``nvidia-ml-py``); else AMD GPUs from AMD's tools (:mod:`gpulayer.amd`);
else Apple Silicon offers one ``mps`` device with the machine's unified memory. Frameworks are read
from package metadata, never imported. A machine without GPUs says why in ``nvml`` (and ``amd``);
nothing here raises for missing hardware.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
import subprocess
from typing import Any

import psutil
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import amd
from .errors import ConfigError
from .inventory import GPU, GpuKind, Resources
from .models import validation_message
from .units import parse_size


def detect(*, fake_gpus: str | None = None, gpus: str | None = None, owner: str | None = None) -> Resources:
    """This machine. ``fake_gpus``: JSON of simulated GPUs offered instead of real ones (see
    :func:`parse_fake_gpus`); ``gpus``: which to offer, ``"0,2"`` or ``"none"`` (default: all)."""
    host = socket.gethostname()
    driver = cuda = amd_found = None
    if fake_gpus:
        devices, nvml = parse_fake_gpus(fake_gpus, owner or host), "simulated GPUs (GPULAYER_FAKE_GPUS)"
    else:
        devices, nvml, driver, cuda = _nvidia()
        if not devices:  # one kind per machine: NVIDIA's, else AMD's, else Apple's
            devices, amd_found = amd.detect()
        devices = devices or _apple_silicon(host)
    return Resources(
        host=host,
        platform=f"{platform.system()} {platform.machine()}",
        cpus=os.cpu_count() or 1,
        memory=psutil.virtual_memory().total,
        gpus=select(devices, gpus),
        nvml=nvml,
        amd=amd_found,
        driver_version=driver,
        cuda_version=cuda,
        frameworks=installed_frameworks(),
    )


def installed_frameworks() -> dict[str, str]:
    """Every installed distribution, by normalised name, as this Python sees it."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist.version)
    return dict(sorted(found.items()))


def select(devices: list[GPU], selection: str | None) -> list[GPU]:
    """The GPUs a worker offers: all, ``"none"``, or indices in nvidia-smi numbering like ``"0,2"``."""
    if selection is None or selection.strip() == "all":
        return devices
    if selection.strip() == "none":
        return []
    by_index = {gpu.index: gpu for gpu in devices}
    chosen = []
    for part in selection.split(","):
        if not part.strip().isdigit():
            raise ConfigError(f"--gpus takes GPU indices like 0,2, or none; not {selection!r}")
        index = int(part)
        if index not in by_index:
            have = ", ".join(str(i) for i in sorted(by_index)) or "none"
            raise ConfigError(f"there is no GPU {index} on this machine (GPUs: {have})")
        chosen.append(by_index[index])
    return chosen


class _FakeGPU(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    #: ``rocm`` simulates an AMD GPU (its jobs get HIP_VISIBLE_DEVICES and ROCR_VISIBLE_DEVICES).
    kind: GpuKind = "cuda"
    memory_gb: float | None = Field(default=None, gt=0)
    memory: str | int | None = None
    uuid: str | None = None
    compute_capability: str | None = None
    pci_bus_id: str | None = None


def parse_fake_gpus(text: str, owner: str) -> list[GPU]:
    """Simulated GPUs from JSON: ``[{"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}, ...]``; an
    entry with ``"kind": "rocm"`` is an AMD GPU (``{"name": "AMD Instinct MI300X", "kind": "rocm",
    "memory_gb": 192}``), one with ``"kind": "mps"`` Apple's.
    ``memory_gb`` is in GiB, as GPU makers count; ``memory`` takes a size (``"24GiB"``). Each gets a
    UUID unique to its worker (``owner``), so two simulated workers never share a device."""
    try:
        entries = _json_list(text)
    except ValueError as exc:
        raise ConfigError(f"GPULAYER_FAKE_GPUS: {exc}") from None
    return [_fake_gpu(index, entry, owner) for index, entry in enumerate(entries)]


def _fake_gpu(index: int, raw: Any, owner: str) -> GPU:
    try:
        entry = _FakeGPU.model_validate(raw)
        memory = parse_size(entry.memory) if entry.memory is not None else int((entry.memory_gb or 0) * 2**30)
        if memory <= 0:
            raise ValueError("needs memory_gb or memory")
    except ValidationError as exc:
        raise ConfigError(f"GPULAYER_FAKE_GPUS: GPU {index}: {validation_message(exc)}") from None
    except ValueError as exc:
        raise ConfigError(f"GPULAYER_FAKE_GPUS: GPU {index}: {exc}") from None
    return GPU(
        index=index,
        kind=entry.kind,
        name=entry.name,
        uuid=entry.uuid or f"GPU-simulated-{owner}-{index}",
        pci_bus_id=entry.pci_bus_id,
        memory_total=memory,
        memory_free=memory,
        compute_capability=entry.compute_capability,
        simulated=True,
        minor=index,
    )


def _json_list(text: str) -> list[Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, list):
        raise ValueError('expected a JSON list like [{"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}]')
    return value


def _minor(pynvml: Any, handle: Any) -> int | None:
    """The GPU's ``/dev/nvidia<minor>``: None where NVML cannot say (not on Linux)."""
    try:
        return int(pynvml.nvmlDeviceGetMinorNumber(handle))
    except pynvml.NVMLError:
        return None


def _nvidia() -> tuple[list[GPU], str, str | None, str | None]:
    """NVIDIA GPUs through NVML, in its index order (nvidia-smi's numbering)."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed", None, None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"NVML not available: {exc}", None, None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda_raw = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        cuda = f"{cuda_raw // 1000}.{cuda_raw % 1000 // 10}"
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(
                GPU(
                    index=index,
                    kind="cuda",
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                    memory_total=int(memory.total),
                    memory_free=int(memory.free),
                    compute_capability=f"{major}.{minor}",
                    minor=_minor(pynvml, handle),
                )
            )
        return gpus, "ok" if gpus else "no NVIDIA GPUs", driver, cuda
    except pynvml.NVMLError as exc:
        return [], f"NVML error: {exc}", None, None
    finally:
        pynvml.nvmlShutdown()


def _apple_silicon(host: str) -> list[GPU]:
    """One ``mps`` device on Apple Silicon, sharing the machine's unified memory."""
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return []
    try:
        chip = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        chip = "Apple Silicon"
    memory = psutil.virtual_memory()
    return [
        GPU(
            index=0,
            kind="mps",
            name=chip,
            uuid=f"mps-{host}",
            memory_total=memory.total,
            memory_free=memory.available,
        )
    ]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
