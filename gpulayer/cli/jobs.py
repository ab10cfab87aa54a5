"""Commands about jobs: submit, list, inspect, follow, wait for, cancel, download."""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

import click

from ..errors import GpulayerError, Unschedulable, WaitTimeout
from ..job import WORKER_JOIN_GRACE, Job
from ..models import JobRecord, JobState, JobUsage, LogLine
from ..options import SubmitOptions
from ..units import format_size
from . import terminal
from .app import (
    EXIT_INTERRUPTED,
    CommandError,
    duration,
    job_exit_code,
    open_client,
    redis_url_option,
    requirement_options,
)
from .options import model_options
from .placement import print_plan

#: How long `cancel` waits to report that a running job has stopped.
_CANCEL_WAIT = 10.0
#: How long `submit --wait` lets a job sit in the queue before it says why it waits.
QUEUED_HINT_AFTER = 3.0
#: How often `submit --wait-for-capacity` looks at its job (s).
_CAPACITY_POLL = 0.1
CAPACITY_HELP = (
    "Wait even when no connected worker could ever run the job, for a machine that joins (one the "
    "autoscaler starts, docs/capacity.md, or one started by hand). Without --wait: until the job has "
    "started, saying each decision of the autoscaler; exit 1, the job left queued, if it says no "
    "provider offers a machine that could run it. With --wait: the logs follow once it starts, and why "
    "it waits (the autoscaler's decision among the reasons) is said as it waits."
)


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--source", type=click.Path(path_type=Path), help="Folder shipped as the job's working folder.")
@click.option(
    "--input",
    "inputs",
    multiple=True,
    type=click.Path(path_type=Path),
    help="File or folder placed in the working folder under its base name (repeatable).",
)
@model_options(SubmitOptions, files={"requirements_text": "requirements"})
@requirement_options
@click.option(
    "--gpus-per-node", type=click.IntRange(0, 64), help="GPUs each node of a gang job needs (as --gpus)."
)
@click.option(
    "--wait",
    is_flag=True,
    help="Stream the job's logs, bring its outputs back into --dest, and exit with its exit code.",
)
@click.option(
    "--dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    help="With --wait: the folder its outputs are unpacked into (default: this one).",
)
@click.option("--wait-for-capacity", is_flag=True, help=CAPACITY_HELP)
@redis_url_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def submit(
    source: Path | None,
    inputs: tuple[Path, ...],
    gpus_per_node: int | None,
    wait: bool,
    dest: Path,
    wait_for_capacity: bool,
    redis_url: str | None,
    command: tuple[str, ...],
    **given: Any,
) -> None:
    """Queue CMD to run on a worker that has what it needs; prints the job id. Put CMD after `--`:

    gpulayer submit --gpus 2 --gpu-memory 24GB --source . --output 'results/*' -- python train.py

    A gang job runs on several workers at once (see docs/distributed.md):

    gpulayer submit --nodes 2 --gpus-per-node 4 --source . -- python train.py
    """
    if gpus_per_node is not None:
        if given.get("gpus") is not None:
            raise click.UsageError("give --gpus or --gpus-per-node, not both")
        given["gpus"] = gpus_per_node
    # The options and the requirements, each by its field's name: the client tells them apart.
    job = open_client(redis_url).submit(list(command), source=source, inputs=inputs, **given)
    if not wait and not wait_for_capacity:
        click.echo(job.id)
        _warn_if_no_worker_fits(job)
        _serve_inputs(job)
        return
    if not wait:  # --wait-for-capacity alone: until the job has started
        click.echo(job.id)
        with _interruptible(job):
            _wait_for_capacity(job)
        return
    click.echo(f"job {job.id} queued", err=True)
    if not wait_for_capacity:
        with _interruptible(job):
            _unless_unrunnable(job)
    with _interruptible(job), job.saying_why_queued(QUEUED_HINT_AFTER, _say):
        _print_lines(job, follow=True)
        record = job.wait()
    _report_end(record)
    if given["outputs"]:
        _bring_back(job, dest)
    sys.exit(job_exit_code(record))


def _serve_inputs(job: Job) -> None:
    """Serve the job's inputs too large for Redis until a worker has pulled them, saying so."""
    if job.serves_inputs():
        click.echo(
            f"serving job {job.id}'s inputs (too large for Redis) until a worker has pulled them: "
            "keep this running (stopped, the job fails)",
            err=True,
        )
        job.serve_inputs()


def _wait_for_capacity(job: Job) -> None:
    """Until ``job`` leaves its queue: each new decision of the autoscaler's on it, said once; exit 1
    when no provider offers a machine that could run it (the job stays queued)."""
    said = None
    while job.status().state is JobState.QUEUED:
        decision = job.capacity()
        if decision is not None and decision.text != said:
            said = decision.text
            _say(said)
            if decision.unmet:
                raise CommandError(f"job {job.id} stays queued: {said}", 1)
        time.sleep(_CAPACITY_POLL)


def _warn_if_no_worker_fits(job: Job) -> None:
    """A job left queued with no connected worker that could ever run it is said so, not silently."""
    plan = job.why()
    if not plan.schedulable:
        click.echo(f"gpulayer: job {job.id} waits in the queue; it cannot start yet:", err=True)
        print_plan(plan, err=True)


def _unless_unrunnable(job: Job) -> None:
    """A wait for a queued job that no connected worker could ever run ends at once, saying why
    worker by worker (exit 1); with none connected, once a worker starting beside it has had
    :data:`WORKER_JOIN_GRACE` to register. (With ``--wait-for-capacity`` the wait goes on instead,
    saying why the job waits as it does, the autoscaler's decision among the reasons.)"""
    plan = job.unrunnable(WORKER_JOIN_GRACE)
    if plan is None:
        return
    for line in plan.lines():
        _say(line)
    raise CommandError(
        f"job {job.id} stays queued: no connected worker could ever run it "
        f"(--wait-for-capacity waits for one that joins; `gpulayer cancel {job.id}` drops it)",
        Unschedulable.exit_code,
    )


def _say(line: str) -> None:
    click.echo(f"gpulayer: {line}", err=True)


def _bring_back(job: Job, dest: Path) -> None:
    """The outputs of a job `submit --wait` followed, unpacked into ``dest``; what could not be brought
    back is said, and the exit code stays the job's."""
    try:
        for path in job.download_outputs(dest):
            click.echo(f"gpulayer: output {path}", err=True)
    except GpulayerError as exc:
        click.echo(f"gpulayer: {exc} (later: gpulayer outputs {job.id} --dest DIR)", err=True)


@contextmanager
def _interruptible(job: Job) -> Iterator[None]:
    """Ctrl-C stops the waiting, not the job, and says so and how to stop it (exit 130, as a shell's)."""
    try:
        yield
    except KeyboardInterrupt:
        _interrupted(job)


def _interrupted(job: Job) -> NoReturn:
    click.echo("", err=True)
    click.echo(
        f"gpulayer: stopped waiting; job {job.id} goes on "
        f"(`gpulayer cancel {job.id}` stops it, `gpulayer logs -f {job.id}` follows it again)",
        err=True,
    )
    sys.exit(EXIT_INTERRUPTED)


@click.command(name="jobs")
@click.option(
    "--state", type=click.Choice([state.value for state in JobState]), help="Only jobs in this state."
)
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON array of job records.")
@redis_url_option
def list_jobs(state: str | None, limit: int, as_json: bool, redis_url: str | None) -> None:
    """The newest jobs first."""
    records = open_client(redis_url).jobs(state, limit=limit)
    if as_json:
        click.echo(json.dumps([record.as_json() for record in records], indent=2))
        return
    rows = [("ID", "NAME", "STATE", "EXIT", "WORKER", "CREATED", "TIME", "COMMAND")]
    for record in records:
        rows.append(
            (
                record.id,
                record.name or "-",
                record.state.value + (" (corrupt)" if record.corrupt else ""),
                "-" if record.exit_code is None else str(record.exit_code),
                record.worker or "-",
                record.created_at.astimezone().strftime("%m-%d %H:%M:%S"),
                _elapsed(record),
                _one_line(shlex.join(record.command))[:60],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True))
        click.echo("  ".join(cells) + "  " + row[-1])


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@redis_url_option
def status(job_id: str, as_json: bool, redis_url: str | None) -> None:
    """Where a job stands and how it ended; for a queued job, why each worker is not running it."""
    job = open_client(redis_url).get(job_id)
    record = job.status()
    plan = job.why() if record.state is JobState.QUEUED else None
    if as_json:
        data = record.as_json()
        data["reasons"] = [reason.model_dump() for reason in plan.reasons] if plan else []
        click.echo(json.dumps(data, indent=2))
        return
    fields = [
        ("id", record.id),
        ("name", record.name),
        ("command", shlex.join(record.command)),
        ("needs", record.spec.requirements.describe()),
        ("python env", record.spec.environment.describe() if record.spec.environment else None),
        ("gang", _gang_text(record)),
        ("priority", record.spec.priority or None),
        ("state", record.state.value),
        ("exit code", record.exit_code),
        ("reason", record.reason),
        ("corrupt record", record.corrupt),
        ("worker", record.worker),
        ("gpus", ",".join(map(str, record.gpus)) or None),
        ("attempt", record.attempt),
        ("queue", record.queue),
        ("created", record.created_at),
        ("scheduled", record.scheduled_at),
        ("started", record.started_at),
        ("ended", record.ended_at),
        ("duration", _elapsed(record)),
        ("outputs", _outputs_text(record)),
        ("usage", _usage_text(record.usage)),
    ]
    for label, value in fields:
        if value is not None and value != "":
            text = (
                value.astimezone().isoformat(sep=" ", timespec="milliseconds")
                if isinstance(value, datetime)
                else value
            )
            click.echo(f"{label + ':':<11} {text}")
    for part in record.parts:
        gpus = f"  gpus {','.join(map(str, part.gpus))}" if part.gpus else ""
        click.echo(f"  node {part.node}  {part.worker}{gpus}")
    if len(record.attempts) > 1 or (record.attempts and record.state is JobState.QUEUED):
        click.echo("attempts:")
        for attempt in record.attempts:
            code = f", exit {attempt.exit_code}" if attempt.exit_code is not None else ""
            why = f": {attempt.reason}" if attempt.reason else ""
            click.echo(f"  {attempt.attempt}  {attempt.worker or '-'}  {attempt.outcome}{code}{why}")
    if record.retry_at:
        click.echo(f"retry at:   {record.retry_at.astimezone().isoformat(sep=' ', timespec='seconds')}")
    if plan:
        print_plan(plan)


@click.command()
@click.argument("job_id")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends.")
@click.option("--rank", type=click.IntRange(0), help="Of a gang job: only what this rank printed.")
@redis_url_option
def logs(job_id: str, follow: bool, rank: int | None, redis_url: str | None) -> None:
    """A job's output: stdout lines to stdout, stderr and GPUlayer's own lines to stderr. The lines
    of a gang job's ranks start with their rank, unless --rank picks one. With --follow, ends with the
    job's end, and exits with its exit code as `wait` does."""
    job = open_client(redis_url).get(job_id)
    if not follow:
        _print_lines(job, follow=False, rank=rank)
        return
    with _interruptible(job):
        _print_lines(job, follow=True, rank=rank)
        record = job.wait()
    _report_end(record)
    sys.exit(job_exit_code(record))


@click.command()
@click.argument("job_id")
@click.option("--timeout", callback=duration, metavar="DURATION", help="Give up after this long (exit 75).")
@click.option("--wait-for-capacity", is_flag=True, help=CAPACITY_HELP)
@redis_url_option
def wait(job_id: str, timeout: float | None, wait_for_capacity: bool, redis_url: str | None) -> None:
    """Wait for a job to end; exits with its exit code (124 timed out, 130 cancelled). A queued job
    no connected worker could ever run ends the wait at once, saying why (exit 1)."""
    job = open_client(redis_url).get(job_id)
    with _interruptible(job):
        if not wait_for_capacity:
            _unless_unrunnable(job)
        record = job.wait(timeout)
    _report_end(record)
    sys.exit(job_exit_code(record))


@click.command()
@click.argument("job_id")
@redis_url_option
def cancel(job_id: str, redis_url: str | None) -> None:
    """Cancel a job: a queued one at once, a running one by stopping its processes."""
    job = open_client(redis_url).get(job_id)
    if not job.cancel():
        record = job.status()
        click.echo(f"job {job_id} had already ended ({record.state.value}); nothing to cancel")
        return
    try:
        record = job.wait(_CANCEL_WAIT)
    except WaitTimeout:
        click.echo(f"cancel requested; job {job_id} is still stopping on {job.status().worker}")
        return
    click.echo(f"job {job_id} {record.state.value}")


@click.command()
@click.argument("job_id")
@click.option(
    "--dest",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to unpack the outputs into (created if needed).",
)
@redis_url_option
def outputs(job_id: str, dest: Path, redis_url: str | None) -> None:
    """Download what a job declared as outputs."""
    for path in open_client(redis_url).get(job_id).download_outputs(dest):
        click.echo(path)


@click.command()
@click.option(
    "--older-than",
    callback=duration,
    metavar="DURATION",
    help="End the jobs that ended this long ago or more (default: GPULAYER_RETENTION_SECONDS, 7d).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be freed; delete nothing.")
@redis_url_option
def gc(older_than: float | None, dry_run: bool, redis_url: str | None) -> None:
    """End now what retention would end later: ended jobs, with their logs and outputs. The admin's."""
    freed = open_client(redis_url, ("admin",)).collect(older_than, dry_run=dry_run)
    click.echo(
        f"{'would free' if dry_run else 'freed'} {freed.jobs} job(s), {freed.files} output archive(s), "
        f"{format_size(freed.bytes)}"
    )


def _print_lines(job: Job, *, follow: bool, rank: int | None = None) -> None:
    for line in job.logs(follow=follow, rank=rank):
        _echo_line(line, prefix=rank is None)


def _echo_line(line: LogLine, prefix: bool = True) -> None:
    text = f"[rank {line.rank}] {line.text}" if prefix and line.rank is not None else line.text
    if line.stream == "stdout":
        terminal.echo(text)
    elif line.stream == "stderr":
        terminal.echo(text, err=True)
    else:
        terminal.echo(f"gpulayer: {text}", err=True)


def _report_end(record: JobRecord) -> None:
    detail = f": {record.reason}" if record.reason else ""
    terminal.echo(f"job {record.id} {record.state.value}{detail}", err=True)


def _elapsed(record: JobRecord) -> str:
    if record.started_at is None:
        return "-"
    end = record.ended_at or datetime.now(record.started_at.tzinfo)
    return f"{(end - record.started_at).total_seconds():.1f}s"


def _gang_text(record: JobRecord) -> str | None:
    gang = record.spec.distributed
    if gang is None:
        return None
    return f"{gang.nodes} nodes x {gang.procs_per_node} ranks ({gang.launcher})"


def _outputs_text(record: JobRecord) -> str | None:
    if record.outputs is None:
        return None
    text = f"{record.outputs.files} file(s), {record.outputs.bytes} bytes"
    if record.outputs.held_by:
        text += f", kept on worker {record.outputs.held_by} (over what Redis holds)"
    if record.outputs.missing:
        text += "; not produced: " + ", ".join(record.outputs.missing)
    return text


def _usage_text(usage: JobUsage | None) -> str | None:
    """ "1.52 s CPU, peak memory 151.2 MiB": what is known of it."""
    if usage is None:
        return None
    said = [f"{usage.cpu_seconds:.2f} s CPU"]
    if usage.peak_memory is not None:
        said.append(f"peak memory {format_size(usage.peak_memory)}")
    if usage.peak_gpu_memory is not None:
        said.append(f"peak GPU memory {format_size(usage.peak_gpu_memory)}")
    return ", ".join(said)


def _one_line(text: str) -> str:
    """``text`` with its control characters (a newline in a command) written as escapes, so a table
    row stays one row."""
    return _CONTROL.sub(lambda match: repr(match.group())[1:-1], text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
