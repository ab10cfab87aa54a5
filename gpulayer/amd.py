"""AMD GPUs (ROCm): found, and read for telemetry, through AMD's ``amdsmi`` Python bindings where they
are installed, else the JSON of the ``amd-smi`` command, else of the older ``rocm-smi``. Not yet
validated on AMD hardware: the parsing follows AMD's documented output and is tested against it.

A device is known to ROCm by its UUID, ``GPU-`` and its ASIC serial in hex, which
``ROCR_VISIBLE_DEVICES`` takes (an index there would count in ROCm's own order, which need not be
amd-smi's); where no serial is reported, its amd-smi index stands in.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .inventory import GPU

#: The JSON each command prints: amd-smi's (static facts, then metrics) and rocm-smi's.
AMD_SMI_STATIC = ["amd-smi", "static", "--asic", "--bus", "--vram", "--json"]
AMD_SMI_METRIC = ["amd-smi", "metric", "--usage", "--mem-usage", "--temperature", "--json"]
ROCM_SMI_STATIC = [
    "rocm-smi",
    "--showproductname",
    "--showuniqueid",
    "--showbus",
    "--showmeminfo",
    "vram",
    "--json",
]
ROCM_SMI_METRIC = ["rocm-smi", "--showuse", "--showtemp", "--showmeminfo", "vram", "--json"]
#: How long a command may take before it counts as not answering (s).
COMMAND_TIMEOUT = 10.0
_UNITS = {"B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


@dataclass(frozen=True)
class Reading:
    """One GPU's use at one moment; None for what was not reported."""

    utilization: float | None = None
    memory_used: int | None = None
    temperature: float | None = None


def rocm_uuid(serial: Any) -> str | None:
    """ROCm's UUID of a device with this ASIC serial (``0x6F1F...`` or a number); None if unknown."""
    text = str(serial).strip().lower() if serial is not None else ""
    text = text.removeprefix("0x")
    if not text or not all(char in "0123456789abcdef" for char in text) or int(text, 16) == 0:
        return None
    return f"GPU-{text}"


def _number(value: Any) -> float | None:
    """A figure as the tools print it: ``12``, ``"12"``, ``{"value": 12, "unit": "%"}``; None for
    ``"N/A"`` and the like."""
    if isinstance(value, dict):
        value = value.get("value")
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _bytes(value: Any, default_unit: str = "B") -> int | None:
    """A size as the tools print it, in bytes: ``{"value": 196592, "unit": "MB"}``, or a number in
    ``default_unit``. AMD's MB are MiB (2**20 bytes), as amd-smi's own conversions count."""
    unit = value.get("unit", default_unit) if isinstance(value, dict) else default_unit
    number = _number(value)
    if number is None:
        return None
    return int(number * _UNITS.get(str(unit).upper(), 1))


def _gpu_list(data: Any) -> list[dict[str, Any]]:
    """amd-smi's per-GPU entries: a list, or (amd-smi 24.7 and later) ``{"gpu_data": [...]}``."""
    if isinstance(data, dict):
        data = data.get("gpu_data", [])
    return [entry for entry in data if isinstance(entry, dict)] if isinstance(data, list) else []


def _make(index: int, name: str, serial: Any, bus: Any, memory: int | None) -> GPU | None:
    if not memory:
        return None  # no VRAM reported: not a device a job can be given
    uuid = rocm_uuid(serial) or f"amd-gpu-{bus or index}"
    return GPU(
        index=index,
        kind="rocm",
        name=name or "AMD GPU",
        uuid=uuid,
        pci_bus_id=str(bus) if bus and bus != "N/A" else None,
        memory_total=memory,
    )


def parse_amd_smi(static: Any) -> list[GPU]:
    """The GPUs in ``amd-smi static --asic --bus --vram --json``'s output (read as JSON)."""
    found: list[GPU] = []
    for entry in _gpu_list(static):
        asic, bus, vram = (entry.get(key) or {} for key in ("asic", "bus", "vram"))
        size = vram.get("size", vram.get("vram_size"))  # 6.1 and later; 6.0
        gpu = _make(
            int(entry.get("gpu", len(found))),
            str(asic.get("market_name") or ""),
            asic.get("asic_serial"),
            bus.get("bdf"),
            _bytes(size, "MB"),
        )
        if gpu is not None:
            found.append(gpu)
    return found


def parse_amd_smi_metrics(metric: Any) -> dict[int, Reading]:
    """Each GPU's use, by index, from ``amd-smi metric --usage --mem-usage --temperature --json``."""
    readings: dict[int, Reading] = {}
    for entry in _gpu_list(metric):
        usage, memory, heat = (entry.get(key) or {} for key in ("usage", "mem_usage", "temperature"))
        readings[int(entry.get("gpu", len(readings)))] = Reading(
            utilization=_number(usage.get("gfx_activity")),
            memory_used=_bytes(memory.get("used_vram"), "MB"),
            temperature=_number(heat.get("hotspot", heat.get("edge"))),
        )
    return readings


def _cards(data: Any) -> list[tuple[int, dict[str, Any]]]:
    """rocm-smi's ``{"card0": {...}, "card1": {...}, "system": {...}}``, as (index, fields)."""
    if not isinstance(data, dict):
        return []
    cards = [
        (int(key[4:]), fields)
        for key, fields in data.items()
        if key.startswith("card") and key[4:].isdigit() and isinstance(fields, dict)
    ]
    return sorted(cards, key=lambda card: card[0])


def _first(fields: dict[str, Any], *names: str) -> Any:
    """The first of ``names`` rocm-smi printed: its keys changed between releases."""
    return next((fields[name] for name in names if fields.get(name) not in (None, "", "N/A")), None)


def parse_rocm_smi(data: Any) -> list[GPU]:
    """The GPUs in ``rocm-smi --showproductname --showuniqueid --showbus --showmeminfo vram --json``."""
    found = []
    for index, fields in _cards(data):
        name = _first(fields, "Card Series", "Card series", "Device Name", "Card SKU", "Card model")
        gpu = _make(
            index,
            str(name or ""),
            _first(fields, "Unique ID"),
            _first(fields, "PCI Bus"),
            _bytes(_first(fields, "VRAM Total Memory (B)")),
        )
        if gpu is not None:
            found.append(gpu)
    return found


def parse_rocm_smi_metrics(data: Any) -> dict[int, Reading]:
    """Each GPU's use, by index, from ``rocm-smi --showuse --showtemp --showmeminfo vram --json``."""
    return {
        index: Reading(
            utilization=_number(_first(fields, "GPU use (%)")),
            memory_used=_bytes(_first(fields, "VRAM Total Used Memory (B)")),
            temperature=_number(
                _first(fields, "Temperature (Sensor junction) (C)", "Temperature (Sensor edge) (C)")
            ),
        )
        for index, fields in _cards(data)
    }


def _run_json(command: list[str]) -> Any:
    """A command's JSON output; ValueError with the reason if it has none. Warnings some releases
    print before the JSON (a device it may not open) are skipped."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    if done.returncode != 0:
        raise ValueError(f"{command[0]} failed: {(done.stderr or done.stdout).strip()[:200]}")
    text = done.stdout
    start = min((at for at in (text.find("{"), text.find("[")) if at >= 0), default=-1)
    try:
        return json.loads(text[start:] if start >= 0 else text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{command[0]} printed no JSON: {exc}") from None


def _bindings() -> Any:
    """AMD's ``amdsmi`` module, initialised; None where it is not installed or cannot start."""
    try:
        import amdsmi  # type: ignore[import-not-found]  # AMD's, installed with ROCm, not on PyPI
    except ImportError:
        return None
    try:
        amdsmi.amdsmi_init()
    except Exception:  # installed, no driver loaded (a machine without AMD GPUs)
        return None
    return amdsmi


def _from_bindings(amdsmi: Any) -> list[GPU]:
    found = []
    for index, handle in enumerate(amdsmi.amdsmi_get_processor_handles()):
        asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
        gpu = _make(
            index,
            str(asic.get("market_name") or ""),
            asic.get("asic_serial"),
            amdsmi.amdsmi_get_gpu_device_bdf(handle),
            int(amdsmi.amdsmi_get_gpu_memory_total(handle, amdsmi.AmdSmiMemoryType.VRAM)),
        )
        if gpu is not None:
            found.append(gpu)
    return found


def detect() -> tuple[list[GPU], str]:
    """This machine's AMD GPUs, and how they were looked for: ``ok``, or why there are none."""
    amdsmi = _bindings()
    if amdsmi is not None:
        try:
            return _found(_from_bindings(amdsmi), "amdsmi")
        except Exception as exc:  # the library's own error types vary by release
            return [], f"amdsmi error: {exc}"
        finally:
            with contextlib.suppress(Exception):
                amdsmi.amdsmi_shut_down()
    for command, parse in ((AMD_SMI_STATIC, parse_amd_smi), (ROCM_SMI_STATIC, parse_rocm_smi)):
        if shutil.which(command[0]) is None:
            continue
        try:
            return _found(parse(_run_json(command)), command[0])
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return [], f"{command[0]}: {exc}"
    return [], "no amdsmi, amd-smi or rocm-smi"


def _found(gpus: list[GPU], how: str) -> tuple[list[GPU], str]:
    return gpus, "ok" if gpus else f"no AMD GPUs ({how})"


def _figure(read: Callable[[], Any]) -> float | None:
    """One figure from the bindings; None where this device does not report it (the others still count)."""
    try:
        return _number(read())
    except Exception:  # the library's own error types vary by release
        return None


#: The commands that read the GPUs' use, and how each is read: amd-smi first.
_METRICS: tuple[tuple[list[str], Callable[[Any], dict[int, Reading]]], ...] = (
    (AMD_SMI_METRIC, parse_amd_smi_metrics),
    (ROCM_SMI_METRIC, parse_rocm_smi_metrics),
)


class AmdProbe:
    """Reads the use of a worker's AMD GPUs: through the bindings (opened once), else one run of
    amd-smi or rocm-smi per sample for all of them. What cannot be read is left unknown."""

    def __init__(self, gpus: list[GPU]) -> None:
        self._gpus = gpus
        self._amdsmi = _bindings()
        self._handles: dict[int, Any] = {}
        if self._amdsmi is not None:
            with contextlib.suppress(Exception):
                self._handles = dict(enumerate(self._amdsmi.amdsmi_get_processor_handles()))
        self._command = next(
            ((command, parse) for command, parse in _METRICS if shutil.which(command[0])), None
        )

    def read(self) -> dict[int, Reading]:
        """Each GPU's use now, by index."""
        if self._handles:
            return {gpu.index: self._read_one(gpu.index) for gpu in self._gpus if gpu.index in self._handles}
        if self._command is None:
            return {}
        command, parse = self._command
        try:
            return parse(_run_json(command))
        except (OSError, subprocess.SubprocessError, ValueError):
            return {}

    def _read_one(self, index: int) -> Reading:
        amdsmi, handle = self._amdsmi, self._handles[index]
        memory = _figure(lambda: amdsmi.amdsmi_get_gpu_memory_usage(handle, amdsmi.AmdSmiMemoryType.VRAM))
        return Reading(
            utilization=_figure(lambda: amdsmi.amdsmi_get_gpu_activity(handle)["gfx_activity"]),
            memory_used=int(memory) if memory is not None else None,
            temperature=_figure(
                lambda: amdsmi.amdsmi_get_temp_metric(
                    handle, amdsmi.AmdSmiTemperatureType.HOTSPOT, amdsmi.AmdSmiTemperatureMetric.CURRENT
                )
            ),
        )

    def close(self) -> None:
        if self._amdsmi is not None:
            with contextlib.suppress(Exception):
                self._amdsmi.amdsmi_shut_down()
