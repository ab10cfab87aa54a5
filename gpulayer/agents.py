"""GPUlayer for coding agents: a Model Context Protocol server, built with the official ``mcp`` SDK
(the ``gpulayer[mcp]`` extra), whose tools submit, watch and fetch jobs through :class:`Client`.

Every answer is structured and bounded: states and reason codes rather than prose, a log tail or a
page with a byte cap rather than a whole log, waits bounded by the agent's timeout (and
:data:`MAX_WAIT`) that report progress and let other calls through. A failure is a tool error of
one line, tagged with the CLI's exit status; the server itself never stops over one.
"""

from __future__ import annotations

import base64
import functools
import io
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import WithJsonSchema
from redis.exceptions import RedisError

from . import __version__
from .client import Client
from .errors import GpulayerError, WaitTimeout
from .inventory import known
from .job import WORKER_JOIN_GRACE, Job
from .models import JobRecord, JobState, LogLine, validated
from .options import SubmitOptions
from .placement import Plan
from .redis_failures import redis_failure
from .requirements import Requirements
from .unpacking import extract

#: The longest one wait_for_job call waits (s), whatever the agent asks.
MAX_WAIT = 600.0
#: A wait reports progress, and gives the event loop back, this often (s).
_SLICE = 1.0
#: The most bytes of log text one answer carries.
MAX_LOG_BYTES = 64 * 1024
#: A list_jobs call with a name to match looks at this many jobs at most, this many per read.
_LOOKED_AT_MOST = 2000
_SCAN_PAGE = 200
T = TypeVar("T")

_READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
_DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)
_INSTRUCTIONS = (
    "GPUlayer runs commands on whichever connected worker has the GPUs, CPU slots, memory, "
    "frameworks and labels they ask for. list_workers and plan_job say what is there and why a job "
    "would not run; submit_job queues one (shipping a project folder as its working folder); "
    "wait_for_job, get_job and get_logs follow it; download_outputs fetches what it declared."
)

#: How a submit_job tool takes its options: with :class:`SubmitOptions`'s schema, checked by the
#: client (not the SDK) so that a bad one is a one-line tool error like every other.
OptionsArgument = Annotated[
    dict[str, Any] | None,
    WithJsonSchema({"anyOf": [SubmitOptions.model_json_schema(), {"type": "null"}], "default": None}),
]


def tool_errors(function: Callable[..., T]) -> Callable[..., T]:
    """A GPUlayer error, or Redis's (out of reach, refusing), as a tool error of one line with the
    CLI's exit status: the agent reads the cause, not "Error executing tool"."""

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> T:
        try:
            return function(*args, **kwargs)
        except GpulayerError as exc:
            raise _tool_error(exc) from None
        except RedisError as exc:
            raise _tool_error(redis_failure(exc)) from None

    return wrapped


def _tool_error(error: GpulayerError) -> ToolError:
    return ToolError(f"{error} (exit status {error.exit_code})")


def build(client: Client, *, read_only: bool = False, remote: bool = False) -> MCPServer:
    """The server, its tools bound to ``client``; ``read_only``: only the tools that change nothing.
    ``remote``: for agents on other machines (over HTTP), so no tool touches this machine's files:
    a job's source comes as an archive, and outputs are fetched from the HTTP API."""
    server = MCPServer("gpulayer", version=__version__, instructions=_INSTRUCTIONS)
    _read_tools(server, client)
    if not read_only:
        (_remote_write_tools if remote else _write_tools)(server, client)

    @server.resource("gpulayer://jobs/{job_id}/logs", mime_type="text/plain")
    def job_logs(job_id: str) -> str:
        """The job's last 1,000 log lines (at most 64 KiB), one per line."""
        lines, _ = _capped([line for _, line in tool_errors(client.get(job_id).log_tail)(1000)])
        return "\n".join(line["text"] for line in lines)

    return server


def _read_tools(server: MCPServer, client: Client) -> None:
    @server.tool(annotations=_READ)
    @tool_errors
    def list_workers() -> dict[str, Any]:
        """The connected workers: each one's GPUs (model, memory, busy or free), CPU slots, memory,
        labels, frameworks of note (torch, jax, ...: a job's ``frameworks`` may name any installed
        package) and what its jobs hold now."""
        return {
            "workers": [
                {**worker.model_dump(mode="json"), "frameworks": known(worker.frameworks)}
                for worker in client.workers()
            ]
        }

    @server.tool(annotations=_READ)
    @tool_errors
    def plan_job(requirements: Requirements | None = None, nodes: int = 1) -> dict[str, Any]:
        """Where a job asking for ``requirements`` (gpus, gpu_memory like "24GB", gpu_name, accelerator,
        cpus, memory, frameworks like ["torch>=2.1"], labels) would start now, whether any worker could
        ever run it, and for each other worker why not: codes (no_gpu, gpu_memory, gpus_busy, ...) and
        a line of text. ``nodes`` > 1: a gang job on that many workers. Submits nothing."""
        return client.plan(requirements, nodes=nodes).model_dump(mode="json")

    @server.tool(annotations=_READ)
    @tool_errors
    def get_job(job_id: str) -> dict[str, Any]:
        """A job's state (queued, scheduled, running, succeeded, failed, cancelled, timed_out), exit
        code, worker, attempts, reason and timestamps; for a queued job, why it waits."""
        return _detail(client, client.get(job_id).status())

    @server.tool(annotations=_READ)
    @tool_errors
    def list_jobs(
        state: str | None = None, name: str | None = None, limit: int = 20, offset: int = 0
    ) -> dict[str, Any]:
        """Jobs newest first, a page at a time: all, or those in ``state``, or whose name contains
        ``name`` (up to ``limit`` of them among the next 2,000 jobs). ``next_offset`` is where the
        next page starts (null: none)."""
        found, next_offset = _named(client, state, name, max(1, min(limit, 200)), offset)
        return {"jobs": [_summary(record) for record in found], "next_offset": next_offset}

    @server.tool(annotations=_READ)
    @tool_errors
    def get_logs(
        job_id: str,
        tail: int | None = 50,
        after: str | None = None,
        rank: int | None = None,
        limit: int = 200,
    ) -> dict[str, Any]:
        """A job's log: its last ``tail`` lines (the default), or, given ``after`` (a cursor from an
        earlier answer; "0-0" for the start), the ``limit`` lines that follow. ``rank``: a gang job's
        rank only. At most 64 KiB of text; ``next_after`` is the cursor of what comes next."""
        job = client.get(job_id)
        limit = max(1, min(limit, 1000))
        entries = (
            job.log_page(after, limit) if after is not None else job.log_tail(max(1, min(tail or 50, 1000)))
        )
        picked = [(entry, line) for entry, line in entries if rank is None or line.rank == rank]
        # A page keeps its first lines (the cursor moves on from them), a tail its last.
        lines, truncated = _capped([line for _, line in picked], newest=after is None)
        last = (picked[len(lines) - 1][0] if after is not None else picked[-1][0]) if lines else after
        return {"lines": lines, "truncated": truncated, "next_after": last}

    @server.tool(annotations=_READ)
    async def wait_for_job(
        job_id: str, ctx: Context, timeout: float = 60, tail: int = 20, wait_for_capacity: bool = False
    ) -> dict[str, Any]:
        """Wait for a job to end, at most ``timeout`` seconds (and at most 600), reporting progress
        meanwhile; then its state (``ended`` says whether it has), exit code, reason and the last
        ``tail`` lines of its log. Other calls go on while it waits. A queued job no connected worker
        could ever run is answered at once with ``why`` (each worker's reason), unless
        ``wait_for_capacity`` (wait for a worker that joins)."""
        job = client.get(job_id)
        limit = max(0.0, min(timeout, MAX_WAIT))
        started = time.monotonic()
        if not wait_for_capacity:
            grace = min(limit, WORKER_JOIN_GRACE)
            plan = await anyio.to_thread.run_sync(tool_errors(job.unrunnable), grace)
            if plan is not None:
                record = await anyio.to_thread.run_sync(tool_errors(job.status))
                return {**_summary(record), "ended": False, **_unrunnable(plan)}
        record = await anyio.to_thread.run_sync(tool_errors(job.status))
        while not record.state.is_terminal and time.monotonic() - started < limit:
            left = limit - (time.monotonic() - started)
            record = await anyio.to_thread.run_sync(_waited, job, min(_SLICE, left))
            await ctx.report_progress(
                time.monotonic() - started, limit, f"job {job_id} is {record.state.value}"
            )
        entries = await anyio.to_thread.run_sync(tool_errors(job.log_tail), max(1, min(tail, 1000)))
        lines, _ = _capped([line for _, line in entries])
        return {**_summary(record), "ended": record.state.is_terminal, "log_tail": lines}


def _write_tools(server: MCPServer, client: Client) -> None:
    @server.tool(annotations=_WRITE)
    @tool_errors
    def submit_job(
        command: list[str] | str,
        source: str | None = None,
        inputs: list[str] | None = None,
        requirements: Requirements | None = None,
        options: OptionsArgument = None,
    ) -> dict[str, Any]:
        """Queue ``command`` (a list of arguments, or a string split as a shell would; it runs without
        a shell) on a worker that has what ``requirements`` ask for (see plan_job), run as
        ``options`` say (its environment, outputs: paths or globs kept when it ends, for
        download_outputs; retries; nodes for a gang job; ...). ``source``: a folder on this machine
        shipped as the job's working folder (minus .git, caches, what .gitignore ignores and
        GPUlayer's own home); ``inputs``: files placed there. Returns its id and state, and, when no
        connected worker could ever run it (it stays queued), ``runnable: false`` and ``why``. Paths are
        read as this server's user, on its machine: it runs over stdio, on the user's own machine,
        for them (the server the HTTP API serves takes no path: only an archive)."""
        folder = _local(source) if source else None
        named = [_local(path) for path in inputs or []]
        return _submitted(client, command, folder, named, requirements, options)

    _cancel_tool(server, client)

    @server.tool(annotations=_WRITE)
    @tool_errors
    def download_outputs(job_id: str, dest: str) -> dict[str, Any]:
        """Unpack the outputs an ended job declared into the folder ``dest`` on this machine (made if
        missing); lists the files written."""
        written = client.get(job_id).download_outputs(_local(dest))
        return {"id": job_id, "files": [str(path) for path in written]}


def _cancel_tool(server: MCPServer, client: Client) -> None:
    @server.tool(annotations=_DESTRUCTIVE)
    @tool_errors
    def cancel_job(job_id: str) -> dict[str, Any]:
        """Cancel a job: a queued one ends at once, a running one is stopped within about a second.
        ``cancelled`` is false if it had already ended."""
        job = client.get(job_id)
        cancelled = job.cancel()
        return {"id": job_id, "cancelled": cancelled, "state": job.status().state.value}


def _remote_write_tools(server: MCPServer, client: Client) -> None:
    @server.tool(name="submit_job", annotations=_WRITE)
    @tool_errors
    def submit_remote(
        command: list[str] | str,
        source_archive: str | None = None,
        requirements: Requirements | None = None,
        options: OptionsArgument = None,
    ) -> dict[str, Any]:
        """Queue ``command`` (a list of arguments, or a string split as a shell would) on a worker
        that has what ``requirements`` ask for (see plan_job), run as ``options`` say.
        ``source_archive``: the job's working folder as a tar archive (gzip or not), base64, checked
        and unpacked as POST /jobs does; ``options.outputs``: paths or globs kept when it ends (fetch
        them from the HTTP API's /api/v1/jobs/{id}/outputs). Returns its id and state (and ``why``
        when no connected worker could ever run it)."""
        with tempfile.TemporaryDirectory(prefix="gpulayer-mcp-") as scratch:
            source = None
            if source_archive is not None:
                source = Path(scratch) / "source"
                source.mkdir()
                try:
                    archive = base64.b64decode(source_archive, validate=True)
                except ValueError:
                    raise ToolError("source_archive is not base64 (exit status 2)") from None
                extract(io.BytesIO(archive), source, max_bytes=client.settings.max_source_bytes)
            return _submitted(client, command, str(source) if source else None, [], requirements, options)

    _cancel_tool(server, client)


def _submitted(
    client: Client,
    command: list[str] | str,
    source: str | None,
    inputs: list[str],
    requirements: Requirements | None,
    options: dict[str, Any] | None,
) -> dict[str, Any]:
    """What both submit_job tools do, once their files are on this machine."""
    checked = validated(SubmitOptions, options or {})
    job = client.submit(command, source=source, inputs=inputs, requirements=requirements, options=checked)
    plan = job.unrunnable()
    return {"id": job.id, "state": job.status().state.value, **(_unrunnable(plan) if plan else {})}


def _unrunnable(plan: Plan) -> dict[str, Any]:
    """What an answer adds for a queued job no connected worker could ever run: each worker's reason."""
    return {"runnable": False, "why": [reason.model_dump() for reason in plan.reasons]}


def _named(
    client: Client, state: str | None, name: str | None, limit: int, offset: int
) -> tuple[list[JobRecord], int | None]:
    """Up to ``limit`` jobs, newest first from ``offset``, whose name contains ``name`` (any job
    for None), among at most :data:`_LOOKED_AT_MOST`; and the offset after the last one looked at,
    or None when no job is left. A page of matches is not a page of jobs: an agent would otherwise
    read an empty page as no match at all."""
    found: list[JobRecord] = []
    at = offset
    page = limit if name is None else _SCAN_PAGE
    while at - offset < _LOOKED_AT_MOST:
        records = client.jobs(state, limit=page, offset=at)
        for record in records:
            at += 1
            if name is None or name in (record.name or ""):
                found.append(record)
                if len(found) == limit:
                    return found, at
        if len(records) < page:
            return found, None
    return found, at


def _waited(job: Job, seconds: float) -> JobRecord:
    @tool_errors
    def wait() -> JobRecord:
        try:
            return job.wait(timeout=seconds)
        except WaitTimeout:
            return job.status()

    return wait()


def _local(path: str) -> str:
    """A path the agent gave: its home spelled out, relative to the server's folder."""
    return os.path.abspath(os.path.expanduser(path))


def _summary(record: JobRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "name": record.name,
        "command": record.command,
        "state": record.state.value,
        "exit_code": record.exit_code,
        "reason": record.reason,
        "worker": record.worker,
        "attempt": record.attempt,
        "created_at": record.created_at.isoformat(),
        "ended_at": record.ended_at.isoformat() if record.ended_at else None,
    }


def _detail(client: Client, record: JobRecord) -> dict[str, Any]:
    detail = record.as_json()
    if record.state is JobState.QUEUED:
        detail["why"] = [reason.model_dump() for reason in client.get(record.id).why().reasons]
    return detail


def _capped(lines: list[LogLine], *, newest: bool = True) -> tuple[list[dict[str, Any]], bool]:
    """The lines as JSON, and whether some were left out: when their text passes
    :data:`MAX_LOG_BYTES`, the newest are kept (``newest``) or the oldest."""
    kept: list[dict[str, Any]] = []
    size = 0
    truncated = False
    for line in reversed(lines) if newest else lines:
        size += len(line.text.encode()) + 1
        if size > MAX_LOG_BYTES:
            truncated = True
            break
        kept.append({"stream": line.stream, "text": line.text, "attempt": line.attempt, "rank": line.rank})
    return (list(reversed(kept)) if newest else kept), truncated
