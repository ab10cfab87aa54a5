"""Commands about where jobs run: `why`, `plan`, `workers`, `resources detect`."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Any

import click

from ..inventory import GPU, known
from ..placement import Plan
from ..resources import detect
from ..units import format_size
from .app import listed, open_client, redis_url_option, requirement_options


@click.command()
@click.argument("job_id")
@redis_url_option
def why(job_id: str, redis_url: str | None) -> None:
    """Why a queued job is not running: one line per worker."""
    job = open_client(redis_url).get(job_id)
    record = job.status()
    if record.state.value != "queued":
        click.echo(
            f"job {job_id} is {record.state.value}" + (f" on {record.worker}" if record.worker else "")
        )
        return
    print_plan(job.why())


@click.command()
@requirement_options
@redis_url_option
def plan(redis_url: str | None, **requirements: Any) -> None:
    """Where a job with these requirements would run now, and why not elsewhere; submits nothing.
    Exits 1 if no connected worker could ever run it."""
    result = open_client(redis_url).plan(**requirements)
    print_plan(result)
    sys.exit(0 if result.schedulable else 1)


def print_plan(plan: Plan, *, err: bool = False) -> None:
    """``plan`` as `plan` and `why` print it; with ``err``, to stderr, each line marked as GPUlayer's
    (a hint among a job's own output)."""
    for line in plan.lines():
        click.echo(f"gpulayer: {line}" if err else line, err=err)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON array, with every installed package.")
@redis_url_option
def workers(as_json: bool, redis_url: str | None) -> None:
    """The connected workers: what each offers and what its jobs hold now."""
    found = open_client(redis_url).workers()
    if listed(found, as_json, "no workers are connected"):
        return
    now = datetime.now(timezone.utc)
    for worker in found:
        seen = f"{(now - worker.last_heartbeat).total_seconds():.0f}s ago" if worker.last_heartbeat else "-"
        click.echo(f"{worker.name}  ({worker.host}, pid {worker.pid}, {worker.state}, heartbeat {seen})")
        click.echo(f"  jobs:       {worker.running} running")
        click.echo(f"  cpu slots:  {worker.cpus_used}/{worker.slots} used")
        click.echo(f"  memory:     {format_size(worker.memory_used)} of {format_size(worker.memory)} held")
        busy = set(worker.gpus_busy)
        for gpu in worker.gpus:
            click.echo(f"  gpu {_gpu_line(gpu)}  [{'busy' if gpu.uuid in busy else 'free'}]")
        if not worker.gpus:
            click.echo("  gpus:       none")
        click.echo(f"  containment: {worker.containment or 'unknown (a worker before 0.4)'}")
        if worker.labels:
            click.echo("  labels:     " + ", ".join(f"{key}={value}" for key, value in worker.labels.items()))
        frameworks = known(worker.frameworks)
        click.echo(
            "  frameworks: " + (", ".join(f"{n} {v}" for n, v in frameworks.items()) or "none of note")
        )


@click.group()
def resources() -> None:
    """What this machine has."""


@resources.command(name="detect")
@click.option("--json", "as_json", is_flag=True, help="One JSON object, with every installed package.")
@click.option(
    "--fake-gpus",
    envvar="GPULAYER_FAKE_GPUS",
    metavar="JSON",
    help="Simulated GPUs to report instead of real ones (as a worker would offer them).",
)
def detect_command(as_json: bool, fake_gpus: str | None) -> None:
    """CPUs, memory, NVIDIA GPUs (through NVML), Apple Silicon, and installed frameworks (read from
    package metadata, never imported)."""
    found = detect(fake_gpus=fake_gpus)
    if as_json:
        click.echo(found.model_dump_json(indent=2))
        return
    click.echo(f"host:       {found.host} ({found.platform})")
    click.echo(f"cpus:       {found.cpus}")
    click.echo(f"memory:     {format_size(found.memory)}")
    if found.gpus:
        versions = [
            f"driver {found.driver_version}" if found.driver_version else "",
            f"CUDA {found.cuda_version}" if found.cuda_version else "",
        ]
        click.echo(f"gpus:       {len(found.gpus)}  {' '.join(v for v in versions if v)}".rstrip())
        for gpu in found.gpus:
            click.echo(f"  {_gpu_line(gpu)}")
    else:
        click.echo(f"gpus:       none ({found.why_no_gpus})")
    frameworks = found.known_frameworks()
    click.echo("frameworks: " + (", ".join(f"{n} {v}" for n, v in frameworks.items()) or "none of note"))


def _gpu_line(gpu: GPU) -> str:
    free = (
        f", {format_size(gpu.memory_free)} free" if gpu.memory_free is not None and not gpu.simulated else ""
    )
    details = [
        f"cc {gpu.compute_capability}" if gpu.compute_capability else "",
        gpu.uuid,
        gpu.pci_bus_id or "",
        "(simulated)" if gpu.simulated else "",
    ]
    return f"{gpu.index}  {gpu.kind}  {gpu.name}  {format_size(gpu.memory_total)}{free}  " + "  ".join(
        part for part in details if part
    )
