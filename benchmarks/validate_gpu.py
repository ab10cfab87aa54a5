"""Every GPU claim GPUlayer makes, checked on this machine's real NVIDIA GPU, in one run of minutes.

CI has no GPU: everything GPU-facing is tested there with simulated GPUs. This script runs the
same claims against a real one and records each as a named check (pass, fail or not supported,
with its detail, data and timing) in one JSON file under ``benchmarks/results/``, with the
machine's description (nvidia-smi's GPUs, driver, CPUs, torch and CUDA, GPUlayer's commit):

* ``detect``: `gpulayer resources detect --json` agrees with nvidia-smi (name, UUID, memory,
  PCI bus id, driver);
* ``up``: `gpulayer up` in a private GPULAYER_HOME, its worker offering the GPU under test alone;
* ``job_sees_its_gpu``: a `--gpus 1` job sees exactly that GPU (``CUDA_VISIBLE_DEVICES`` its
  nvidia-smi index, ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, torch's one device has its UUID) and a
  CUDA matmul agrees with the CPU's;
* ``second_job_waits``: a second `--gpus 1` job stays queued while the first holds the GPU,
  `gpulayer why` says busy, and it runs once the first has ended;
* ``telemetry``: the GPU's utilisation in `/metrics` and in the worker's telemetry stream (the
  dashboard's feed) rises under a load job;
* ``remote``: `@gl.remote(gpus=1)` returns a CUDA computation's result;
* ``gang_gloo``, ``gang_nccl``: a 2-rank gang job on the one GPU all-reduces (NCCL refusing two
  ranks on one GPU is recorded as not supported);
* ``fractional``: GPU sharing, recorded as not supported while placement reserves whole GPUs;
* ``down``: `gpulayer down` stops what `up` started;
* ``trainer_fp32``, ``_bf16``, ``_16_mixed``, ``_compile``: ``gl.torch.Trainer`` on CUDA beside
  a plain PyTorch loop on the same model: the step times and their ratio.

Each check has a timeout and a failing one does not stop the others; the run stops starting
checks once ``--budget`` seconds are spent (``down`` runs anyway). The exit status is 1 if any
check failed. A machine without nvidia-smi, or whose torch sees no CUDA device, skips: one line
says why, the JSON says ``"skipped"``, and the exit status is 0. ``--rehearse`` runs every check
on the CPU against a simulated GPU, to try the script itself where there is no GPU.

    scripts/validate_gpu.sh                    # sets up .venv if needed, then runs this
    python benchmarks/validate_gpu.py [--gpu 0] [--budget 360] [--only NAME ...] [--results DIR]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from _common import RESULTS, machine
from _gpu_checks import NAMES, Check, checks
from _gpu_hub import Hub, Outcome, Target, rehearsal_target
from _nvidia_smi import NvidiaSmiError, SmiGpu, parse, query

ROOT = Path(__file__).resolve().parent.parent
#: A check is not started with less than this left of the budget.
LEAST = 5.0
#: How long past its timeout a check's thread is waited for before it counts as hung.
GRACE = 10.0
TORCH_PROBE = """
import json
try:
    import torch
except ImportError as exc:
    print(json.dumps({"installed": False, "error": str(exc)}))
    raise SystemExit(0)
available = torch.cuda.is_available()
found = {"installed": True, "version": torch.__version__, "cuda": torch.version.cuda,
         "available": available, "devices": []}
if available:
    found["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    found["cudnn"] = torch.backends.cudnn.version()
    try:
        found["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:
        found["nccl"] = f"unknown: {exc}"
print(json.dumps(found))
"""


@dataclass
class Probe:
    """What this machine has: nvidia-smi's GPUs, torch's view of CUDA, and why it skips, if it does."""

    skipped: str | None = None
    #: Why asking torch about CUDA failed, on a machine with a GPU: a failure, not a reason to skip.
    failure: str | None = None
    smi_text: str = ""
    smi: list[SmiGpu] = field(default_factory=list)
    torch: dict[str, Any] = field(default_factory=dict)


class ProbeError(Exception):
    """The machine has a GPU, but asking torch about it failed (not a reason to skip)."""


def probe() -> Probe:
    found = Probe()
    if shutil.which("nvidia-smi") is None:
        found.skipped = "no nvidia-smi on PATH (no NVIDIA GPU or driver here)"
        return found
    try:
        found.smi_text = query()
        found.smi = parse(found.smi_text)
    except NvidiaSmiError as exc:
        found.skipped = f"nvidia-smi lists no GPU: {exc}"
        return found
    if not found.smi:
        found.skipped = "nvidia-smi lists no GPU"
        return found
    try:
        found.torch = torch_probe()
    except ProbeError as exc:
        found.failure = str(exc)
        return found
    if not found.torch["installed"]:
        found.skipped = f"torch is not installed for {sys.executable} (pip install -e '.[torch]')"
    elif not found.torch["available"]:
        found.skipped = f"torch {found.torch['version']} (CUDA {found.torch['cuda']}) sees no CUDA device"
    return found


def torch_probe(timeout: float = 120.0) -> dict[str, Any]:
    """torch's view of CUDA, asked in a process of its own: this one never holds a CUDA context."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise ProbeError(f"torch's CUDA probe did not answer within {timeout:.0f} s") from None
    if done.returncode != 0:
        raise ProbeError(f"torch's CUDA probe exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def gpulayer_build() -> dict[str, Any]:
    """GPUlayer's version and, from a checkout, its commit; reading git's state without its index
    lock, so that this never contends with someone working in the same tree."""
    found: dict[str, Any] = {"version": importlib.metadata.version("gpulayer"), "commit": None, "dirty": None}
    git = shutil.which("git")
    if git is None:
        return found
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    for key, args in (("commit", ["rev-parse", "HEAD"]), ("dirty", ["status", "--porcelain", "-uno"])):
        done = subprocess.run(
            [git, "-C", str(ROOT), *args], capture_output=True, text=True, env=env, timeout=30, check=False
        )
        if done.returncode == 0:
            found[key] = done.stdout.strip() if key == "commit" else bool(done.stdout.strip())
    return found


def describe(found: Probe, target: Target | None, started: datetime) -> dict[str, Any]:
    return {
        **machine(),
        "host": socket.gethostname(),
        "started": started.isoformat(timespec="seconds"),
        "gpus": [asdict(gpu) for gpu in (target.smi if target else found.smi)],
        "nvidia_smi": found.smi_text.strip().splitlines(),
        "gpu_under_test": target.gpu.index if target else None,
        "rehearsal": bool(target and target.rehearsal),
        "torch": found.torch,
        "gpulayer": gpulayer_build(),
    }


# -- running the checks -------------------------------------------------------------------------


def run_one(check: Check, timeout: float) -> tuple[Outcome, float]:
    """``check``'s outcome and seconds. It runs in a thread so that one that hangs past its timeout
    is left behind (as a daemon) and counted failed, and the run goes on."""
    box: list[Outcome] = []

    def run() -> None:
        try:
            box.append(check.run(timeout))
        except Exception as exc:
            box.append(Outcome("fail", f"{type(exc).__name__}: {exc}", {"traceback": traceback.format_exc()}))

    thread = threading.Thread(target=run, name=f"check {check.name}", daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(timeout + GRACE)
    seconds = time.monotonic() - started
    if not box:
        return Outcome("fail", f"timed out after {timeout:.3g} s (left running)"), seconds
    return box[0], seconds


def run_checks(
    checks: Sequence[Check], budget: float, say: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Each check in turn, each given its timeout or what is left of ``budget``, whichever is less."""
    deadline = time.monotonic() + budget
    results = []
    for check in checks:
        left = deadline - time.monotonic()
        timeout = check.timeout if check.always else min(check.timeout, max(left, 0.0))
        if left < LEAST and not check.always:
            outcome, seconds = Outcome("fail", f"not run: the run's budget of {budget:.0f} s was spent"), 0.0
        else:
            outcome, seconds = run_one(check, timeout)
        results.append(
            {
                "name": check.name,
                "status": outcome.status,
                "detail": outcome.detail,
                "seconds": round(seconds, 3),
                "timeout": round(max(timeout, 0.0), 1),
                "data": outcome.data,
            }
        )
        say(f"{outcome.status:>13}  {check.name:<18} {seconds:6.1f} s  {outcome.detail}")
    return results


def chosen(every: Sequence[Check], only: Sequence[str]) -> list[Check]:
    """The checks named in ``only`` (all when empty), with `up` and `down` if any of them needs them."""
    if not only:
        return list(every)
    hub = any(check.hub for check in every if check.name in only)
    return [check for check in every if check.name in only or (hub and check.name in ("up", "down"))]


# -- the result file -----------------------------------------------------------------------------


def result_path(folder: Path, description: dict[str, Any]) -> Path:
    """``validate_gpu-DATE-GPU-HOST.json``: a rerun the same day on the same machine replaces it."""
    gpus = description["gpus"]
    index = description["gpu_under_test"]
    what = (
        "rehearsal" if description["rehearsal"] else (gpus[index]["name"] if index is not None else "skipped")
    )
    slug = re.sub(r"[^a-z0-9]+", "-", f"{what}-{description['host']}".lower()).strip("-")
    return folder / f"validate_gpu-{description['date']}-{slug}.json"


def summary(results: Sequence[dict[str, Any]]) -> dict[str, int]:
    statuses = [result["status"] for result in results]
    return {status.replace(" ", "_"): statuses.count(status) for status in ("pass", "fail", "not supported")}


def save(folder: Path, result: dict[str, Any]) -> Path:
    path = result_path(folder, result["machine"])
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="where the JSON goes (benchmarks/results)"
    )
    parser.add_argument("--gpu", type=int, default=0, help="the GPU under test, in nvidia-smi numbering (0)")
    parser.add_argument("--budget", type=float, default=360.0, help="seconds to start checks in (360)")
    parser.add_argument(
        "--only", action="append", choices=NAMES, default=[], help="run this check (repeatable)"
    )
    parser.add_argument("--rehearse", action="store_true", help="on the CPU, against a simulated GPU")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    started, when = time.monotonic(), datetime.now(timezone.utc)
    found = Probe(smi=rehearsal_target().smi, torch=torch_probe()) if args.rehearse else probe()
    if found.failure:
        results = [{"name": "probe", "status": "fail", "detail": found.failure, "seconds": 0.0, "data": {}}]
        path = save(
            args.results, {"machine": describe(found, None, when), "checks": results, **summary(results)}
        )
        print(f"validate_gpu: {found.failure} (results in {path})")
        return 1
    if found.skipped:
        path = save(
            args.results, {"skipped": found.skipped, "machine": describe(found, None, when), "checks": []}
        )
        print(f"validate_gpu: skipped: {found.skipped} (results in {path})")
        return 0
    if not 0 <= args.gpu < len(found.smi):
        print(f"validate_gpu: there is no GPU {args.gpu}: nvidia-smi lists {len(found.smi)}", file=sys.stderr)
        return 2
    target = rehearsal_target() if args.rehearse else Target(found.smi[args.gpu], found.smi)
    with tempfile.TemporaryDirectory(prefix="validate-gpu-") as folder:
        hub = Hub(target, Path(folder))
        try:
            results = run_checks(chosen(checks(target, hub), args.only), args.budget)
        finally:
            if hub.pids:  # interrupted before `down` ran: stop what `up` started all the same
                hub.down(60)
    counts = summary(results)
    path = save(
        args.results,
        {
            "machine": describe(found, target, when),
            "checks": results,
            **counts,
            "seconds": round(time.monotonic() - started, 1),
        },
    )
    print(
        f"validate_gpu: {counts['pass']} passed, {counts['fail']} failed, {counts['not_supported']} not "
        f"supported in {time.monotonic() - started:.0f} s (results in {path})"
    )
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
