"""nvidia-smi's own list of GPUs, and how `gpulayer resources detect` compares with it.

nvidia-smi is the reference here because it is NVIDIA's tool, not ours: detect reads NVML through
``nvidia-ml-py``, and a difference between the two is a bug of ours (or of our reading of NVML).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

QUERY = "name,uuid,memory.total,driver_version,pci.bus_id"
COMMAND = ("nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits")
MIB = 2**20


class NvidiaSmiError(Exception):
    """nvidia-smi could not list the GPUs (it failed, or printed what is not its CSV)."""


@dataclass(frozen=True)
class SmiGpu:
    """One line of :data:`COMMAND`'s output; ``index`` is its line number, nvidia-smi's numbering."""

    index: int
    name: str
    uuid: str
    #: None where nvidia-smi printed ``[N/A]`` or another bracketed word instead of a number.
    memory_mib: int | None
    driver_version: str | None
    pci_bus_id: str


def query(timeout: float = 30.0) -> str:
    """What :data:`COMMAND` prints; :class:`NvidiaSmiError` with its own words when it fails."""
    try:
        done = subprocess.run(COMMAND, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NvidiaSmiError(f"{COMMAND[0]}: {exc}") from None
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip().splitlines()
        raise NvidiaSmiError(f"{COMMAND[0]} exited {done.returncode}: {said[0] if said else 'no output'}")
    return done.stdout


def parse(text: str) -> list[SmiGpu]:
    """The GPUs in :data:`COMMAND`'s output, one a line. A name is split off from the right, so a
    comma in it (none is known, but names are free text) stays in the name."""
    gpus: list[SmiGpu] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.rsplit(",", 4)]
        if len(fields) != 5 or not fields[1].startswith(("GPU-", "MIG-")):
            raise NvidiaSmiError(f"not a line of nvidia-smi --query-gpu={QUERY}: {line!r}")
        name, uuid, memory, driver, bus = fields
        gpus.append(SmiGpu(len(gpus), name, uuid, _number(memory), _word(driver), bus))
    return gpus


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _word(text: str) -> str | None:
    return None if text.startswith("[") else text


def bus_id(text: str) -> str:
    """A PCI bus id in one spelling: NVML and nvidia-smi agree on ``00000000:19:00.0`` today, but
    ``lspci`` and older tools write the domain in 4 digits, or none, and in lower case."""
    parts = text.strip().split(":")
    try:
        domain, bus, slot = (["0", *parts] if len(parts) == 2 else parts)[-3:]
        return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{slot.upper()}"
    except ValueError:
        return text.strip().upper()


def compare(detected: Mapping[str, Any], smi: Sequence[SmiGpu], *, simulated: bool = False) -> list[str]:
    """What differs between `resources detect --json` (``detected``) and nvidia-smi's list: one line
    per difference, none when they agree on every GPU's index, name, UUID, PCI bus id and memory
    and on the driver. Memory may differ by less than 1 MiB: nvidia-smi rounds down to whole MiB.
    ``simulated``: a rehearsal, where detect reports simulated GPUs and that is expected."""
    if detected.get("nvml") != "ok" and not simulated:
        return [f"detect found no NVIDIA GPU: {detected.get('nvml')}"]
    found = {gpu["index"]: gpu for gpu in detected.get("gpus", [])}
    problems = []
    if len(found) != len(smi):
        problems.append(f"detect lists {len(found)} GPUs, nvidia-smi {len(smi)}")
    drivers = sorted({gpu.driver_version for gpu in smi if gpu.driver_version is not None})
    if drivers and detected.get("driver_version") not in drivers:
        problems.append(f"driver: detect {detected.get('driver_version')}, nvidia-smi {', '.join(drivers)}")
    for gpu in smi:
        mine = found.get(gpu.index)
        if mine is None:
            problems.append(f"GPU {gpu.index} ({gpu.uuid}): not in detect's list")
            continue
        problems += [f"GPU {gpu.index}: {problem}" for problem in _differences(mine, gpu, simulated)]
    return problems


def _differences(mine: Mapping[str, Any], gpu: SmiGpu, simulated: bool) -> list[str]:
    differences = []
    for field, theirs in (("name", gpu.name), ("uuid", gpu.uuid)):
        if mine.get(field) != theirs:
            differences.append(f"{field}: detect {mine.get(field)!r}, nvidia-smi {theirs!r}")
    if bus_id(str(mine.get("pci_bus_id") or "0:0:0.0")) != bus_id(gpu.pci_bus_id):
        differences.append(f"pci_bus_id: detect {mine.get('pci_bus_id')!r}, nvidia-smi {gpu.pci_bus_id!r}")
    memory = int(mine.get("memory_total", 0))
    if gpu.memory_mib is not None and not 0 <= memory - gpu.memory_mib * MIB < MIB:
        differences.append(f"memory: detect {memory / MIB:.1f} MiB, nvidia-smi {gpu.memory_mib} MiB")
    if bool(mine.get("simulated")) != simulated:
        differences.append(f"simulated: detect {bool(mine.get('simulated'))}, expected {simulated}")
    return differences
