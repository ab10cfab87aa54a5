"""The checks validate_gpu.py runs, each a function of its timeout that returns an :class:`Outcome`.

Most run against the embedded GPUlayer (:class:`~_gpu_hub.Hub`); the jobs run ``_gpu_job.py``,
which prints what it saw, and the checks decide from that.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _gpu_hub import (
    HERE,
    WORKER,
    Hub,
    Outcome,
    Target,
    ended,
    job_timeout,
    judged,
    log_tail,
    said,
    tail,
    wait_for,
)
from _gpu_job import cuda_sum
from _nvidia_smi import compare
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

import gpulayer as gl
from gpulayer.models import JobState, validation_message
from gpulayer.requirements import Requirements
from gpulayer.service import Service

TRAINER = HERE / "_gpu_trainer.py"
#: Utilisation (percent) a load job must reach, and by how much above the idle GPU's.
BUSY, RISE = 50.0, 30.0
#: What `/metrics` serves for a real GPU only (NVML's readings).
REAL_GAUGES = {"gpulayer_gpu_memory_used_bytes", "gpulayer_gpu_temperature_celsius"}


@dataclass(frozen=True)
class Check:
    name: str
    #: Given its timeout in seconds.
    run: Callable[[float], Outcome]
    timeout: float
    #: Needs the embedded GPUlayer (`up` runs first, `down` last).
    hub: bool = False
    #: Runs even once the run's budget is spent (`down`).
    always: bool = False


def detect(target: Target, hub: Hub, timeout: float) -> Outcome:
    """`gpulayer resources detect --json` against nvidia-smi's list."""
    done = hub.gpulayer("resources", "detect", "--json", timeout=timeout)
    if done.returncode != 0:
        return Outcome("fail", f"resources detect exited {done.returncode}: {tail(done.stderr)}")
    found = json.loads(done.stdout)
    found.pop("frameworks", None)
    problems = compare(found, target.smi, simulated=target.rehearsal)
    data = {"nvidia_smi": [asdict(gpu) for gpu in target.smi], "detect": found}
    names = ", ".join(f"{gpu.index}: {gpu.name} {gpu.uuid}" for gpu in target.smi)
    return judged(
        problems,
        f"{len(target.smi)} GPU(s) as nvidia-smi lists them ({names}); driver "
        f"{found.get('driver_version')}, CUDA {found.get('cuda_version')}",
        data,
    )


def sees_its_gpu(target: Target, hub: Hub, timeout: float) -> Outcome:
    """A `--gpus 1` job sees exactly the GPU it holds, numbered as nvidia-smi does, and computes on it."""
    job = hub.submit("see", "--device", target.device, gpus=1, timeout=job_timeout(timeout))
    record = job.wait(timeout - 5)
    reports = said(job)
    data: dict[str, Any] = {"job": job.id, "gpus": record.gpus, "seen": reports, "log": log_tail(job)}
    problems = ended(record)
    if not reports:
        return judged([*problems, "the job reported nothing"], "", data)
    seen = reports[0]
    if record.gpus != [target.gpu.index]:
        problems.append(f"the job holds GPUs {record.gpus}, not [{target.gpu.index}]")
    if seen["env"] != target.visible():
        problems.append(f"its environment is {seen['env']}, not {target.visible()}")
    if target.device == "cuda" and (seen["device_count"], seen["uuids"]) != (1, [target.gpu.uuid]):
        problems.append(
            f"torch sees {seen['device_count']} device(s) {seen['uuids']}, not [{target.gpu.uuid}]"
        )
    if not seen["matmul_max_error"] < 1e-6:
        problems.append(f"a float64 matmul on {target.device} is off by {seen['matmul_max_error']}")
    return judged(
        problems,
        f"CUDA_VISIBLE_DEVICES={seen['env']['CUDA_VISIBLE_DEVICES']} (PCI_BUS_ID): "
        f"torch sees {seen['uuids'] or [target.device]}; a matmul agrees with the CPU's",
        data,
    )


def second_waits(target: Target, hub: Hub, timeout: float) -> Outcome:
    """A second `--gpus 1` job waits while the first holds the GPU, `why` says busy, and it starts
    once the first has ended."""
    deadline = time.monotonic() + timeout
    first = hub.submit("hold", "--device", target.device, "--seconds", str(timeout), gpus=1)
    if not wait_for(lambda: said(first), timeout / 2, 0.2):
        return Outcome(
            "fail",
            f"the first job never held the GPU: it is {first.status().state.value}",
            {"log": log_tail(first)},
        )
    second = hub.submit("see", "--device", target.device, gpus=1)
    time.sleep(2.0)  # a free GPU is claimed within milliseconds of a submit: 2 s is a long wait
    waiting = second.status().state
    why = hub.gpulayer("why", second.id, timeout=30)
    first.cancel()
    after = second.wait(max(1.0, deadline - time.monotonic()))
    before = first.status()
    data = {
        "why": why.stdout.splitlines(),
        "second_while_first_held": waiting.value,
        "first_ended": str(before.ended_at),
        "second_started": str(after.started_at),
    }
    problems = [] if waiting == JobState.QUEUED else [f"the second job was {waiting.value}, not queued"]
    if "busy" not in why.stdout or WORKER not in why.stdout:
        problems.append(f"`gpulayer why` did not say {WORKER} is busy: {tail(why.stdout + why.stderr)}")
    problems += ended(after)
    if after.started_at and before.ended_at and after.started_at < before.ended_at:
        problems.append("the second job started before the first ended")
    return judged(
        problems, f"queued while the first held the GPU; why: {tail(why.stdout, 1)}; then ran", data
    )


def telemetry(target: Target, hub: Hub, timeout: float) -> Outcome:
    """The GPU's utilisation in `/metrics` and in the worker's telemetry (the dashboard's feed) rises
    under a load job."""
    made = hub.gpulayer("token", "create", "--name", "validate-metrics", "--role", "metrics")
    if made.returncode != 0:
        return Outcome("fail", f"token create exited {made.returncode}: {tail(made.stderr)}")
    token = made.stdout.strip().splitlines()[-1]
    # The check before may have left its load in the worker's latest sample (one a second): the
    # GPU is idle once a reading says so, not at the first two readings.
    idle = poll_metrics(hub, token, lambda seen: len(seen) >= 2 and seen[-1] < BUSY, min(10.0, timeout / 4))
    load_for = max(5.0, min(20.0, timeout / 3))
    job = hub.submit("load", "--device", target.device, "--seconds", str(load_for), gpus=1)
    wait_for(lambda: said(job), timeout / 3, 0.2)
    started = time.time()
    busy = poll_metrics(hub, token, lambda seen: len(seen) >= 3 and max(seen) >= BUSY, load_for)
    job.cancel()
    samples = Service(hub.client).telemetry(time.time() - started + 2, [WORKER]).get(WORKER, [])
    feed = [gpu.utilization for sample in samples for gpu in sample.gpus if gpu.uuid == target.gpu.uuid]
    gauges = metric_samples(metrics_text(hub, token), target.gpu.uuid)
    data = {"idle": idle, "under_load": busy, "feed": feed, "labels_and_gauges": gauges}
    problems = [] if idle else ["no GPU utilisation in /metrics before the load"]
    if not busy or max(busy) < BUSY or (idle and max(busy) - min(idle) < RISE):
        problems.append(f"/metrics: utilisation {busy} under load, {idle} before")
    if not any(value is not None and value >= BUSY for value in feed):
        problems.append(f"the worker's telemetry: utilisation {feed} under load")
    simulated = {sample["labels"].get("simulated") for sample in gauges}
    if simulated != {str(target.rehearsal).lower()}:
        problems.append(f"/metrics says simulated={simulated}")
    served = {sample["name"] for sample in gauges}
    if not target.rehearsal and REAL_GAUGES - served:
        problems.append(f"/metrics lacks {sorted(REAL_GAUGES - served)} for the GPU")
    return judged(
        problems,
        f"utilisation {min(idle or [math.nan]):.0f}% idle, up to "
        f"{max(busy or [math.nan]):.0f}% under load ({len(feed)} telemetry samples)",
        data,
    )


def metrics_text(hub: Hub, token: str) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{hub.web_port}/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(answer.read().decode())


def metric_samples(text: str, uuid: str) -> list[dict[str, Any]]:
    """The GPU gauges `/metrics` serves for the GPU with this UUID."""
    return [
        {"name": sample.name, "labels": sample.labels, "value": sample.value}
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("gpulayer_gpu_") and sample.labels.get("uuid") == uuid
    ]


def poll_metrics(hub: Hub, token: str, enough: Callable[[list[float]], bool], seconds: float) -> list[float]:
    """The GPU's utilisation as `/metrics` says it, twice a second, until ``enough`` of it or ``seconds``."""
    seen: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (seen and enough(seen)):
        for sample in metric_samples(metrics_text(hub, token), hub.target.gpu.uuid):
            if sample["name"] == "gpulayer_gpu_utilization_percent":
                seen.append(float(sample["value"]))
        time.sleep(0.5)
    return seen


def remote(target: Target, hub: Hub, timeout: float) -> Outcome:
    """`@gl.remote(gpus=1)` returns a CUDA computation's result."""
    n = 1_000_003
    decorate = gl.remote(gpus=1, timeout=job_timeout(timeout), retries=0, client=hub.client, source=HERE)
    value = decorate(cuda_sum).remote(n, target.device).result(timeout - 5)
    expected = (n - 1) * n * (2 * n - 1) // 6
    problems = [] if value["sum"] == expected else [f"the sum is {value['sum']}, not {expected}"]
    if value["env"] != target.visible():
        problems.append(f"the call's environment is {value['env']}, not {target.visible()}")
    if target.device == "cuda" and value["device"] != target.gpu.name:
        problems.append(f"it ran on {value['device']}, not {target.gpu.name}")
    return judged(
        problems, f"the sum of squares below {n} came back from {value['device']}", {"value": value}
    )


def gang(target: Target, hub: Hub, timeout: float, backend: str) -> Outcome:
    """A 2-rank gang job on the one GPU all-reduces over ``backend``."""
    if backend == "nccl" and target.rehearsal:
        return Outcome("not supported", "NCCL needs CUDA, and a rehearsal runs on the CPU")
    program = ("gang", "--device", target.device, "--backend", backend)
    job = hub.submit(*program, gpus=1, nodes=1, procs_per_node=2, timeout=job_timeout(timeout))
    record = job.wait(timeout - 5)
    reports = sorted(said(job), key=lambda report: report["rank"])
    log = log_tail(job, 40)
    data = {"job": job.id, "reports": reports, "log": log}
    # NCCL's own words (its last error, as torch passes it on) when ranks share a GPU.
    refused = [line for line in log if "Duplicate GPU" in line or "ncclInvalidUsage" in line]
    if backend == "nccl" and refused:
        return Outcome("not supported", f"NCCL refuses two ranks on one GPU: {refused[0]}", data)
    problems = ended(record)
    if [report["rank"] for report in reports] != [0, 1]:
        problems.append(f"ranks {[report['rank'] for report in reports]} reported, not [0, 1]")
    problems += [
        f"rank {report['rank']}: all_reduce gave {report['total']}, not {report['expected']}"
        for report in reports
        if report["total"] != report["expected"]
    ]
    problems += [
        f"rank {report['rank']} sees {report['env']}, not {target.visible()}"
        for report in reports
        if report["env"] != target.visible()
    ]
    return judged(problems, f"2 ranks on GPU {target.gpu.index} all-reduced over {backend}", data)


def fractional(target: Target, hub: Hub, timeout: float) -> Outcome:
    """Several jobs on one GPU, if placement has a way to ask for a share of one."""
    try:
        Requirements.model_validate({"accelerator": "cuda", "gpus": 0.5})
    except ValidationError as exc:
        return Outcome(
            "not supported",
            "placement reserves whole GPUs, each by its UUID for one job "
            f"(docs/placement.md); gpus=0.5 is refused: {validation_message(exc)}",
        )
    return Outcome("fail", "gpus=0.5 is accepted now: this check must learn to run two jobs on one GPU")


def trainer(target: Target, timeout: float, precision: str, compile: bool) -> Outcome:
    """The Trainer on the device, with this precision (and compiled), beside a plain loop."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "trainer.json"
        command = [sys.executable, str(TRAINER), "--device", target.device, "--precision", precision]
        command += ["--out", str(out), *(["--compile"] if compile else [])]
        if target.rehearsal:
            command += ["--warm", "1", "--epochs", "1"]  # a rehearsal tries the run, it times nothing
        env = {**os.environ, **(target.visible() if target.device == "cuda" else {})}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            return Outcome(
                "fail",
                f"exited {done.returncode}: {tail(done.stderr)}",
                {"stderr": done.stderr.splitlines()[-30:]},
            )
        result: dict[str, Any] = json.loads(out.read_text())
    want = {"32": "torch.float32", "bf16": "torch.bfloat16", "16-mixed": "torch.float16"}[precision]
    problems = []
    for side in ("plain", "trainer"):
        run = result[side]
        if run["output_dtype"] != want:
            problems.append(f"{side}: the model's output is {run['output_dtype']}, not {want}")
        if not run["param_device"].startswith(target.device):
            problems.append(f"{side}: the parameters are on {run['param_device']}")
        if not math.isfinite(run["loss"]):
            problems.append(f"{side}: the loss is {run['loss']}")
        if compile and run["compiled_graphs"] == 0:
            problems.append(f"{side}: compile made no graph")
    trained, mine = result["plain"]["step_ms"], result["trainer"]["step_ms"]
    return judged(
        problems,
        f"Trainer {mine:.3f} ms/step, plain loop {trained:.3f} ms/step: {result['ratio']:.2f}x",
        result,
    )


#: The checks, in the order they run (what `--only` takes).
NAMES = ("detect", "up", "job_sees_its_gpu", "devices_fenced", "second_job_waits", "telemetry",
         "remote", "gang_gloo", "gang_nccl", "fractional", "down", "trainer_fp32", "trainer_bf16",
         "trainer_16_mixed", "trainer_compile")  # fmt: skip


def devices_fenced(target: Target, hub: Hub, timeout: float) -> Outcome:
    """Where the worker fences GPU devices (cgroup v1's devices controller): a job holding no GPU
    cannot open the GPU's device node, and one holding it can (and computes on it: job_sees_its_gpu)."""
    worker = hub.client.workers()[0]
    containment = worker.containment or "unknown"
    if target.rehearsal or "GPU devices fenced" not in containment:
        return Outcome("not supported", f"no device fence to try here (containment: {containment})")
    minor = next((gpu.minor for gpu in worker.gpus if gpu.uuid == target.gpu.uuid), None)
    node = f"/dev/nvidia{target.gpu.index if minor is None else minor}"
    seen = {}
    for gpus in (0, 1):
        job = hub.submit("devices", gpus=gpus, cpus=1, timeout=job_timeout(timeout / 2))
        record = job.wait(timeout / 2)
        reports = said(job)
        if record.state is not JobState.SUCCEEDED or not reports:
            return Outcome("fail", f"the {gpus}-GPU job ended {record.state.value}", {"log": log_tail(job)})
        seen[gpus] = reports[0]["devices"]
    problems = []
    if seen[0].get(node) != "EPERM":
        problems.append(f"a job holding no GPU opened {node}: {seen[0].get(node)}")
    if seen[1].get(node) != "opened":
        problems.append(f"the job holding GPU {target.gpu.index} could not open {node}: {seen[1].get(node)}")
    passed = f"{node}: EPERM for a job without a GPU, opened by the job holding it ({containment})"
    return judged(problems, passed, {"without_gpu": seen[0], "with_gpu": seen[1]})


def checks(target: Target, hub: Hub) -> list[Check]:
    """Every check, in the order they run: the embedded GPUlayer's, then the Trainer's once it is down
    (nothing else then runs on the GPU while they time it)."""

    def on_hub(check: Callable[[Target, Hub, float], Outcome]) -> Callable[[float], Outcome]:
        def run(timeout: float) -> Outcome:
            try:
                return check(target, hub, timeout)
            finally:
                if hub.running:
                    hub.tidy()

        return run

    def gang_over(backend: str) -> Callable[[Target, Hub, float], Outcome]:
        return lambda target, hub, timeout: gang(target, hub, timeout, backend)

    def training(precision: str, compile: bool = False) -> Callable[[float], Outcome]:
        return lambda timeout: trainer(target, timeout, precision, compile)

    return [
        Check("detect", lambda timeout: detect(target, hub, timeout), 60),
        Check("up", hub.up, 90, hub=True),
        Check("job_sees_its_gpu", on_hub(sees_its_gpu), 120, hub=True),
        Check("devices_fenced", on_hub(devices_fenced), 90, hub=True),
        Check("second_job_waits", on_hub(second_waits), 90, hub=True),
        Check("telemetry", on_hub(telemetry), 90, hub=True),
        Check("remote", on_hub(remote), 120, hub=True),
        Check("gang_gloo", on_hub(gang_over("gloo")), 120, hub=True),
        Check("gang_nccl", on_hub(gang_over("nccl")), 120, hub=True),
        Check("fractional", lambda timeout: fractional(target, hub, timeout), 10),
        Check("down", hub.down, 60, hub=True, always=True),
        Check("trainer_fp32", training("32"), 150),
        Check("trainer_bf16", training("bf16"), 150),
        Check("trainer_16_mixed", training("16-mixed"), 150),
        Check("trainer_compile", training("32", compile=True), 300),
    ]
