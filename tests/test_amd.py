"""AMD GPUs, without one: what amd-smi and rocm-smi print (fixtures written from AMD's documented JSON,
in tests/fixtures/amd) read into GPUs and telemetry; each way of finding them (AMD's amdsmi bindings,
then amd-smi, then rocm-smi) chosen in turn, with stand-ins on PATH and in sys.modules; the devices a
job on them is shown; `--accelerator rocm`; and simulated AMD GPUs on a real worker."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import pytest

from gpulayer import Client, JobState, amd
from gpulayer.inventory import GPU, WorkerInfo
from gpulayer.placement import plan
from gpulayer.requirements import Requirements
from gpulayer.resources import parse_fake_gpus
from gpulayer.worker.devices import devices_shown, visible_devices
from gpulayer.worker.telemetry import GpuProbe
from tests.conftest import Workers

FIXTURES = Path(__file__).parent / "fixtures" / "amd"
MIB = 2**20
CAT = shutil.which("cat")
A100 = '[{"name": "NVIDIA A100-SXM4-80GB", "memory_gb": 80}]'


def fixture(name: str) -> object:
    return json.loads((FIXTURES / name).read_text())


def test_amd_smi_names_each_gpu_its_memory_bus_and_rocm_uuid() -> None:
    gpus = amd.parse_amd_smi(fixture("amd-smi-static.json"))
    assert [(gpu.index, gpu.kind, gpu.name) for gpu in gpus] == [
        (0, "rocm", "AMD Instinct MI300X"),
        (1, "rocm", "AMD Instinct MI300X"),
    ]
    assert gpus[0].memory_total == 196592 * MIB
    assert gpus[0].pci_bus_id == "0000:0c:00.0"
    assert [gpu.uuid for gpu in gpus] == ["GPU-6f1f0a2b3c4d5e6f", "GPU-2b3c4d5e6f708192"]


def test_an_older_amd_smi_prints_a_bare_list_and_a_gpu_without_a_serial_is_named_by_its_bus() -> None:
    [gpu] = amd.parse_amd_smi(fixture("amd-smi-static-6.0.json"))
    assert (gpu.name, gpu.memory_total) == ("AMD Radeon PRO W7900", 49136 * MIB)
    assert gpu.uuid == "amd-gpu-0000:03:00.0"


def test_rocm_smi_names_each_card() -> None:
    gpus = amd.parse_rocm_smi(fixture("rocm-smi-static.json"))
    assert [(gpu.index, gpu.name, gpu.uuid, gpu.pci_bus_id) for gpu in gpus] == [
        (0, "AMD Instinct MI210", "GPU-8d2a1c5b1b0a3b2c", "0000:63:00.0"),
        (1, "AMD Instinct MI210", "GPU-4c1e7d9a06b3f215", "0000:83:00.0"),
    ]
    assert gpus[0].memory_total == 68702699520


def test_each_tools_metrics_give_use_memory_and_temperature() -> None:
    assert amd.parse_amd_smi_metrics(fixture("amd-smi-metric.json")) == {
        0: amd.Reading(utilization=87.0, memory_used=51200 * MIB, temperature=64.0),
        1: amd.Reading(utilization=0.0, memory_used=283 * MIB, temperature=38.0),
    }
    assert amd.parse_rocm_smi_metrics(fixture("rocm-smi-metric.json")) == {
        0: amd.Reading(utilization=93.0, memory_used=34359738368, temperature=45.0),
        1: amd.Reading(utilization=0.0, memory_used=10960896, temperature=33.0),  # junction N/A: edge
    }


@pytest.fixture
def no_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No amdsmi module to import (as on a machine without ROCm's Python bindings)."""
    monkeypatch.setitem(sys.modules, "amdsmi", None)


def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tools: dict[str, dict[str, str]]) -> None:
    """Stand-ins for AMD's commands, alone on PATH: each prints the fixture named for its first
    argument (``static``/``metric`` for amd-smi; ``--showproductname``/``--showuse`` for rocm-smi)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool, outputs in tools.items():
        cases = "".join(f'  {arg}) {CAT} "{FIXTURES / name}" ;;\n' for arg, name in outputs.items())
        # A warning before the JSON, as amd-smi prints for a device it may not open.
        warning = 'echo "WARNING: /dev/kfd: permission denied"'
        script = f'#!/bin/sh\n{warning}\ncase "$1" in\n{cases}  *) exit 2 ;;\nesac\n'
        (folder / tool).write_text(script)
        (folder / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))


AMD_SMI = {"amd-smi": {"static": "amd-smi-static.json", "metric": "amd-smi-metric.json"}}
ROCM_SMI = {"rocm-smi": {"--showproductname": "rocm-smi-static.json", "--showuse": "rocm-smi-metric.json"}}


@pytest.mark.usefixtures("no_bindings")
def test_without_the_bindings_amd_smi_finds_the_gpus_and_telemetry_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path(tmp_path, monkeypatch, {**AMD_SMI, **ROCM_SMI})
    gpus, how = amd.detect()
    assert how == "ok"
    assert [gpu.uuid for gpu in gpus] == ["GPU-6f1f0a2b3c4d5e6f", "GPU-2b3c4d5e6f708192"]  # amd-smi's
    probe = GpuProbe(gpus)
    [busy, idle] = probe.sample(busy={0})
    probe.close()
    assert (busy.utilization, busy.memory_used, busy.temperature) == (87.0, 51200 * MIB, 64.0)
    assert (idle.utilization, idle.memory_total) == (0.0, 196592 * MIB)


@pytest.mark.usefixtures("no_bindings")
def test_without_amd_smi_rocm_smi_finds_them_and_with_neither_it_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path(tmp_path, monkeypatch, ROCM_SMI)
    gpus, how = amd.detect()
    assert (how, [gpu.name for gpu in gpus]) == ("ok", ["AMD Instinct MI210"] * 2)
    assert amd.AmdProbe(gpus).read()[0].utilization == 93.0
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert amd.detect() == ([], "no amdsmi, amd-smi or rocm-smi")


def test_the_bindings_come_first_where_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(tmp_path, monkeypatch, AMD_SMI)  # there, and not asked
    bindings = types.SimpleNamespace(
        AmdSmiMemoryType=types.SimpleNamespace(VRAM="vram"),
        AmdSmiTemperatureType=types.SimpleNamespace(HOTSPOT="hotspot"),
        AmdSmiTemperatureMetric=types.SimpleNamespace(CURRENT="current"),
        amdsmi_init=lambda: None,
        amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: ["h0"],
        amdsmi_get_gpu_asic_info=lambda h: {
            "market_name": "AMD Instinct MI250X",
            "asic_serial": "0xABCDEF0123456789",
        },
        amdsmi_get_gpu_device_bdf=lambda h: "0000:c1:00.0",
        amdsmi_get_gpu_memory_total=lambda h, kind: 64 * 2**30,
        amdsmi_get_gpu_activity=lambda h: {"gfx_activity": 55, "umc_activity": 10, "mm_activity": "N/A"},
        amdsmi_get_gpu_memory_usage=lambda h, kind: 3 * 2**30,
        amdsmi_get_temp_metric=lambda h, sensor, metric: 71,
    )
    monkeypatch.setitem(sys.modules, "amdsmi", bindings)
    [gpu], how = amd.detect()
    assert (how, gpu.name, gpu.uuid, gpu.memory_total) == (
        "ok",
        "AMD Instinct MI250X",
        "GPU-abcdef0123456789",
        64 * 2**30,
    )
    assert amd.AmdProbe([gpu]).read() == {0: amd.Reading(55.0, 3 * 2**30, 71.0)}


def rocm_gpus(count: int) -> list[GPU]:
    return amd.parse_amd_smi({"gpu_data": [
        {"gpu": i, "asic": {"market_name": "MI300X", "asic_serial": f"0x{i + 1:016x}"},
         "vram": {"size": {"value": 1024, "unit": "MB"}}}
        for i in range(count)
    ]})  # fmt: skip


def test_a_job_on_amd_gpus_sees_its_own_by_rocm_uuid_renumbered_from_zero() -> None:
    env = visible_devices(rocm_gpus(4), [1, 3])
    assert env["ROCR_VISIBLE_DEVICES"] == "GPU-0000000000000002,GPU-0000000000000004"
    assert env["HIP_VISIBLE_DEVICES"] == "0,1"  # HIP counts what ROCR lets through
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # HIP and PyTorch's ROCm build read it too


def test_a_job_holding_no_amd_gpu_sees_none_and_nvidia_jobs_see_no_amd_gpu() -> None:
    none = visible_devices(rocm_gpus(2), [])
    assert (none["ROCR_VISIBLE_DEVICES"], none["HIP_VISIBLE_DEVICES"], none["CUDA_VISIBLE_DEVICES"]) == (
        "-1",
        "-1",
        "",
    )
    nvidia = visible_devices(parse_fake_gpus(A100, "w"), [0])
    assert (nvidia["CUDA_VISIBLE_DEVICES"], nvidia["ROCR_VISIBLE_DEVICES"]) == ("0", "-1")


def test_jobs_on_different_amd_gpus_are_told_apart_though_hip_numbers_both_from_zero() -> None:
    # What keys a warm executor: one started for GPU 1 must not run a call that holds GPU 3.
    gpus = rocm_gpus(4)
    first, second = (devices_shown(visible_devices(gpus, [index])) for index in (1, 3))
    assert (first, second) == (["rocm:GPU-0000000000000002"], ["rocm:GPU-0000000000000004"])
    assert devices_shown(visible_devices(gpus, [])) == []
    assert devices_shown(visible_devices(parse_fake_gpus(A100, "w"), [0])) == ["cuda:0"]


def worker(name: str, gpus: list[GPU]) -> WorkerInfo:
    return WorkerInfo(name=name, host=name, pid=1, state="idle", slots=4, memory=2**34, gpus=gpus)


def test_a_rocm_job_asks_for_one_amd_gpu_and_is_not_placed_on_nvidia_ones() -> None:
    wanted = Requirements.model_validate({"accelerator": "rocm"})
    assert wanted.gpus == 1
    nvidia = worker("nvidia-box", parse_fake_gpus(A100, "w"))
    assert [reason.reason for reason in plan(wanted, [nvidia]).reasons] == ["needs rocm, has cuda only"]
    assert plan(wanted, [nvidia, worker("amd-box", rocm_gpus(1))]).worker == "amd-box"


SIMULATED_MI300X = json.dumps([{"name": "AMD Instinct MI300X", "kind": "rocm", "memory_gb": 192}] * 2)


def test_simulated_amd_gpus_run_a_rocm_job_that_sees_its_own(client: Client, workers: Workers) -> None:
    workers.start("mi300", 1, "--fake-gpus", SIMULATED_MI300X)
    [offered] = client.workers()
    assert {(gpu.kind, gpu.simulated) for gpu in offered.gpus} == {("rocm", True)}
    job = client.submit(
        ["sh", "-c", 'echo "$ROCR_VISIBLE_DEVICES $HIP_VISIBLE_DEVICES $CUDA_VISIBLE_DEVICES"'],
        accelerator="rocm",
    )
    assert job.wait(30).state is JobState.SUCCEEDED
    [line] = [line.text for line in job.logs()]
    assert line in ("0 0 0", "1 0 0")
    cuda = client.submit(["true"], accelerator="cuda")
    assert [reason.reason for reason in cuda.why().reasons] == ["needs cuda, has rocm only"]
    cuda.cancel()
