"""benchmarks/validate_gpu.py everywhere but on a GPU: it skips where there is none, reads
nvidia-smi's output, compares detect's list with it, records each check, and rehearses its checks
against a simulated GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpulayer.inventory import GPU, Resources
from tests.conftest import session_server

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
SCRIPT = BENCHMARKS / "validate_gpu.py"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvidia_smi"
# The benchmarks import each other by their file names, as scripts run from their folder do;
# appended, so that nothing there shadows a module the other tests import.
sys.path.append(str(BENCHMARKS))

import _gpu_checks  # noqa: E402
import _nvidia_smi  # noqa: E402
import validate_gpu  # noqa: E402
from _gpu_checks import Check  # noqa: E402
from _gpu_hub import Hub, Outcome, rehearsal_target  # noqa: E402
from _nvidia_smi import NvidiaSmiError, SmiGpu  # noqa: E402

H200 = SmiGpu(
    0, "NVIDIA H200", "GPU-8f2c6d1e-3b7a-4c95-a1e4-6d0b9f27c358", 143771, "570.124.06", "00000000:19:00.0"
)


def run_script(
    *args: str, path: str, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPULAYER_")}
    env.update(PATH=path, **session_server(), **(extra or {}))
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def only_result(folder: Path) -> dict[str, Any]:
    [path] = folder.glob("validate_gpu-*.json")
    return dict(json.loads(path.read_text()))


def fake_nvidia_smi(folder: Path, fixture: str) -> Path:
    """An ``nvidia-smi`` that prints a fixture, whatever it is asked."""
    folder.mkdir()
    program = folder / "nvidia-smi"
    program.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(FIXTURES / fixture)!r}).read())\n"
    )
    program.chmod(0o755)
    return folder


# -- where there is no GPU ----------------------------------------------------------------------


def test_a_machine_without_nvidia_smi_skips_saying_why_and_exits_0(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    done = run_script("--results", str(tmp_path / "results"), path=str(tmp_path / "bin"))
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert line.startswith("validate_gpu: skipped: no nvidia-smi on PATH")
    result = only_result(tmp_path / "results")
    assert result["skipped"].startswith("no nvidia-smi on PATH")
    assert result["checks"] == []
    assert result["machine"]["gpus"] == []
    assert {"host", "cpus", "python", "date", "torch", "gpulayer"} <= set(result["machine"])


def test_a_machine_whose_torch_sees_no_cuda_device_skips_after_listing_its_gpus(tmp_path: Path) -> None:
    bin_folder = fake_nvidia_smi(tmp_path / "bin", "h200.csv")
    # CUDA_VISIBLE_DEVICES empty: no CUDA device for torch, even on a machine that has one.
    done = run_script(
        "--results", str(tmp_path / "results"), path=str(bin_folder), extra={"CUDA_VISIBLE_DEVICES": ""}
    )
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert "skipped: torch" in line
    assert "sees no CUDA device" in line
    result = only_result(tmp_path / "results")
    assert "sees no CUDA device" in result["skipped"]
    assert result["machine"]["gpus"] == [
        {"index": 0, "name": "NVIDIA H200", "uuid": H200.uuid, "memory_mib": 143771,
         "driver_version": "570.124.06", "pci_bus_id": "00000000:19:00.0"}
    ]  # fmt: skip
    assert result["machine"]["nvidia_smi"] == [(FIXTURES / "h200.csv").read_text().strip()]
    assert result["machine"]["torch"]["available"] is False


# -- nvidia-smi's output ------------------------------------------------------------------------


def test_one_h200_is_read_from_nvidia_smis_line() -> None:
    assert _nvidia_smi.parse((FIXTURES / "h200.csv").read_text()) == [H200]


def test_several_gpus_keep_nvidia_smis_order_and_names_with_spaces() -> None:
    gpus = _nvidia_smi.parse((FIXTURES / "mig_mixed.csv").read_text())
    assert [(gpu.index, gpu.name, gpu.memory_mib) for gpu in gpus] == [
        (0, "NVIDIA A100 80GB PCIe", 81920),
        (1, "NVIDIA A100 80GB PCIe", 81920),
        (2, "NVIDIA RTX 6000 Ada Generation", 49140),
    ]
    assert len({gpu.uuid for gpu in gpus}) == 3
    assert {gpu.driver_version for gpu in gpus} == {"550.90.07"}
    assert gpus[2].pci_bus_id == "00000000:CA:00.0"


def test_bracketed_values_are_unknown_and_a_comma_stays_in_the_name() -> None:
    [gpu] = _nvidia_smi.parse("NVIDIA Odd, Board, GPU-1234, [N/A], [Not Supported], 00000000:01:00.0\n\n")
    assert (gpu.name, gpu.uuid, gpu.memory_mib, gpu.driver_version) == (
        "NVIDIA Odd, Board",
        "GPU-1234",
        None,
        None,
    )


@pytest.mark.parametrize(
    "text", ["No devices were found", "NVIDIA H200, 143771, 570.124.06", "name, uuid, memory.total, x, y"]
)
def test_what_is_not_nvidia_smis_csv_is_refused(text: str) -> None:
    with pytest.raises(NvidiaSmiError, match="not a line of nvidia-smi"):
        _nvidia_smi.parse(text)


@pytest.mark.parametrize("spelling", ["00000000:19:00.0", "0000:19:00.0", "19:00.0", "0000:19:00.0\n"])
def test_a_pci_bus_id_has_one_spelling(spelling: str) -> None:
    assert _nvidia_smi.bus_id(spelling) == "00000000:19:00.0"


# -- detect beside nvidia-smi -------------------------------------------------------------------


def detected(gpus: list[SmiGpu], **changes: Any) -> dict[str, Any]:
    """What `resources detect --json` prints on a machine with these GPUs, as NVML reports them."""
    resources = Resources(
        host="box", platform="Linux x86_64", cpus=16, memory=2**37, nvml="ok",
        driver_version=gpus[0].driver_version, cuda_version="12.8",
        gpus=[GPU(index=gpu.index, kind="cuda", name=gpu.name, uuid=gpu.uuid, pci_bus_id=gpu.pci_bus_id,
                  memory_total=(gpu.memory_mib or 0) * 2**20 + 4096, memory_free=2**30,
                  compute_capability="9.0") for gpu in gpus],
    )  # fmt: skip
    data = json.loads(resources.model_dump_json())
    data.update(changes)
    return dict(data)


def test_detect_agrees_with_nvidia_smi_on_the_same_gpus() -> None:
    for fixture in ("h200.csv", "mig_mixed.csv"):
        gpus = _nvidia_smi.parse((FIXTURES / fixture).read_text())
        assert _nvidia_smi.compare(detected(gpus), gpus) == []


def test_every_difference_from_nvidia_smi_is_named() -> None:
    gpus = _nvidia_smi.parse((FIXTURES / "mig_mixed.csv").read_text())
    found = detected(gpus, driver_version="535.183.01")
    found["gpus"][0]["uuid"] = "GPU-00000000-0000-0000-0000-000000000000"
    found["gpus"][1]["memory_total"] -= 2**30
    found["gpus"][2]["simulated"] = True
    assert _nvidia_smi.compare(found, gpus) == [
        "driver: detect 535.183.01, nvidia-smi 550.90.07",
        f"GPU 0: uuid: detect 'GPU-00000000-0000-0000-0000-000000000000', nvidia-smi {gpus[0].uuid!r}",
        "GPU 1: memory: detect 80896.0 MiB, nvidia-smi 81920 MiB",
        "GPU 2: simulated: detect True, expected False",
    ]


def test_a_gpu_detect_misses_and_a_machine_without_nvml_are_differences() -> None:
    gpus = _nvidia_smi.parse((FIXTURES / "mig_mixed.csv").read_text())
    found = detected(gpus)
    del found["gpus"][1]
    assert _nvidia_smi.compare(found, gpus) == [
        "detect lists 2 GPUs, nvidia-smi 3",
        f"GPU 1 ({gpus[1].uuid}): not in detect's list",
    ]
    no_nvml = {**detected([H200]), "nvml": "NVML not available: NVML Shared Library Not Found", "gpus": []}
    assert _nvidia_smi.compare(no_nvml, [H200]) == [
        "detect found no NVIDIA GPU: NVML not available: NVML Shared Library Not Found"
    ]


# -- running checks -----------------------------------------------------------------------------


def test_a_failing_check_is_recorded_and_the_next_ones_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validate_gpu, "GRACE", 0.2)
    ran: list[str] = []

    def passing(timeout: float) -> Outcome:
        ran.append("passing")
        return Outcome("pass", "fine", {"value": 1})

    def raising(timeout: float) -> Outcome:
        ran.append("raising")
        raise RuntimeError("CUDA error: no kernel image is available")

    def hanging(timeout: float) -> Outcome:
        ran.append("hanging")
        time.sleep(5)
        return Outcome("pass", "too late")

    checks = [
        Check("raising", raising, 10),
        Check("hanging", hanging, 0.3),
        Check("failing", lambda timeout: Outcome("fail", "off by one"), 10),
        Check("passing", passing, 10),
    ]
    lines: list[str] = []
    results = validate_gpu.run_checks(checks, budget=60, say=lines.append)
    assert [(r["name"], r["status"]) for r in results] == [
        ("raising", "fail"), ("hanging", "fail"), ("failing", "fail"), ("passing", "pass")
    ]  # fmt: skip
    assert ran == ["raising", "hanging", "passing"]
    assert results[0]["detail"] == "RuntimeError: CUDA error: no kernel image is available"
    assert "Traceback" in results[0]["data"]["traceback"]
    assert results[1]["detail"] == "timed out after 0.3 s (left running)"
    assert results[1]["seconds"] < 2
    assert results[3]["data"] == {"value": 1}
    assert len(lines) == 4
    assert "raising" in lines[0]


def test_checks_stop_starting_once_the_budget_is_spent_but_down_still_runs() -> None:
    def slow(timeout: float) -> Outcome:
        time.sleep(0.3)
        return Outcome("pass", "slow")

    checks = [
        Check("slow", slow, 60),
        Check("next", lambda timeout: Outcome("pass", "never"), 60),
        Check("down", lambda timeout: Outcome("pass", f"given {timeout:.0f} s"), 60, always=True),
    ]
    budget = validate_gpu.LEAST + 0.2
    results = validate_gpu.run_checks(checks, budget=budget, say=lambda line: None)
    assert [(r["name"], r["status"]) for r in results] == [
        ("slow", "pass"),
        ("next", "fail"),
        ("down", "pass"),
    ]
    assert results[1]["detail"] == f"not run: the run's budget of {budget:.0f} s was spent"
    assert results[2]["detail"] == "given 60 s"


def test_a_check_that_needs_gpulayer_brings_up_and_down_with_it(tmp_path: Path) -> None:
    target = rehearsal_target()
    every = _gpu_checks.checks(target, Hub(target, tmp_path))
    assert tuple(check.name for check in every) == _gpu_checks.NAMES
    assert [check.name for check in validate_gpu.chosen(every, ["remote"])] == ["up", "remote", "down"]
    assert [check.name for check in validate_gpu.chosen(every, ["trainer_bf16"])] == ["trainer_bf16"]
    assert validate_gpu.chosen(every, []) == every
    assert [check.name for check in every if check.always] == ["down"]


def test_a_result_is_named_by_its_date_gpu_and_machine(tmp_path: Path) -> None:
    description = {"date": "2026-12-02", "host": "gpu-node.lab", "gpus": [vars(H200)], "gpu_under_test": 0,
                   "rehearsal": False}  # fmt: skip
    path = validate_gpu.result_path(tmp_path, description)
    assert path == tmp_path / "validate_gpu-2026-12-02-nvidia-h200-gpu-node-lab.json"


# -- a rehearsal: the checks themselves, against a simulated GPU ----------------------------------


def test_a_rehearsal_without_gpulayer_writes_every_checks_record(tmp_path: Path) -> None:
    done = run_script(
        "--rehearse", "--only", "detect", "--only", "fractional", "--results", str(tmp_path),
        path=os.environ["PATH"],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith("validate_gpu: 1 passed, 0 failed, 1 not supported in ")
    result = only_result(tmp_path)
    assert (result["pass"], result["fail"], result["not_supported"]) == (1, 0, 1)
    assert isinstance(result["seconds"], float)
    assert [check["name"] for check in result["checks"]] == ["detect", "fractional"]
    for check in result["checks"]:
        assert set(check) == {"name", "status", "detail", "seconds", "timeout", "data"}
        assert check["seconds"] >= 0
    detect, fractional = result["checks"]
    assert detect["status"] == "pass", detect["detail"]
    assert detect["data"]["detect"]["gpus"][0]["uuid"] == rehearsal_target().gpu.uuid
    assert fractional["status"] == "not supported"
    assert "whole GPUs" in fractional["detail"]
    machine = result["machine"]
    assert machine["rehearsal"] is True
    assert machine["gpu_under_test"] == 0
    assert machine["gpus"][0]["name"] == "NVIDIA H200 (simulated)"
    assert machine["torch"]["installed"] is True
    assert set(machine["gpulayer"]) == {"version", "commit", "dirty"}
    assert "skipped" not in result


@pytest.mark.slow
def test_a_rehearsal_runs_the_gpulayer_checks_on_a_simulated_gpu(tmp_path: Path) -> None:
    names = ["job_sees_its_gpu", "second_job_waits", "telemetry", "remote", "gang_gloo", "trainer_bf16"]
    only = [word for name in names for word in ("--only", name)]
    done = run_script("--rehearse", *only, "--results", str(tmp_path), path=os.environ["PATH"])
    result = only_result(tmp_path)
    statuses = {check["name"]: (check["status"], check["detail"]) for check in result["checks"]}
    assert done.returncode == 0, statuses
    assert list(statuses) == ["up", *names[:-1], "down", "trainer_bf16"]
    assert {status for status, _ in statuses.values()} == {"pass"}
    assert "its GPU is busy" in statuses["second_job_waits"][1]


@pytest.mark.skipif(
    Path(sys.executable).parent != ROOT / ".venv" / "bin" or shutil.which("nvidia-smi", path="/usr/bin:/bin"),
    reason="the wrapper runs the repository's .venv (these tests run elsewhere), or this machine has a GPU",
)
def test_the_wrapper_runs_the_script_in_the_repositorys_virtualenv(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "validate_gpu.sh"), "--results", str(tmp_path)],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("validate_gpu: skipped: no nvidia-smi on PATH")
    assert only_result(tmp_path)["skipped"]


def test_the_wrapper_passes_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    done = subprocess.run(
        [shellcheck, str(ROOT / "scripts" / "validate_gpu.sh")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout


#: A build backend of the stub checkout below: an editable wheel of metadata and a .pth, built
#: from nothing, so that pip needs no index to install it.
STUB_BACKEND = """
import os, zipfile

INFO = "gpulayer-0.dist-info/"
FILES = {
    "gpulayer.pth": os.path.abspath("src") + "\\n",
    INFO + "METADATA": "Metadata-Version: 2.1\\nName: gpulayer\\nVersion: 0\\nProvides-Extra: torch\\n"
    "Requires-Dist: torch; extra == 'torch'\\n",
    INFO + "WHEEL": "Wheel-Version: 1.0\\nGenerator: stub\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
}


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = "gpulayer-0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, text in FILES.items():
            wheel.writestr(path, text)
        wheel.writestr(INFO + "RECORD", "".join(f"{path},,\\n" for path in [*FILES, INFO + "RECORD"]))
    return name
"""


def test_the_wrapper_keeps_the_torch_of_a_python3_that_is_a_virtualenvs(tmp_path: Path) -> None:
    """Where python3 is a virtual environment's with torch in it (as on the machines the device tool
    lends), the .venv the wrapper makes installs nothing more for torch: offline, it still runs."""
    parent = tmp_path / "parent"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(parent)], check=True)
    [site] = parent.glob("lib/python*/site-packages")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch-9.9.dist-info").mkdir()
    (site / "torch-9.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 9.9\n"
    )
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "validate_gpu.sh", checkout / "scripts")
    (checkout / "src" / "gpulayer").mkdir(parents=True)
    (checkout / "src" / "gpulayer" / "__init__.py").write_text("")
    (checkout / "stub_backend.py").write_text(STUB_BACKEND)
    (checkout / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "stub_backend"\nbackend-path = ["."]\n'
    )
    (checkout / "benchmarks").mkdir()
    (checkout / "benchmarks" / "validate_gpu.py").write_text(
        "import sys, torch, gpulayer\nprint('ran with', torch.__file__, *sys.argv[1:])\n"
    )
    done = subprocess.run(
        [str(checkout / "scripts" / "validate_gpu.sh"), "--budget", "1"],
        env={"PATH": f"{parent / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "PIP_NO_INDEX": "1",
             "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"ran with {site / 'torch' / '__init__.py'} --budget 1"
