"""The HTTP API, under /api/v1: what the CLI does, as JSON. Each route names the least role it needs."""

from __future__ import annotations

import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, g, jsonify, request, send_file
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from werkzeug.datastructures import FileStorage

from ..archive import SPOOL_BYTES
from ..errors import ArchiveError, JobNotFinished, OutputNotProduced, UntrustedPayload
from ..job import Job
from ..models import JobState, Role, plain_name, validation_message
from ..options import SubmitOptions
from ..requirements import Requirements
from ..units import parse_duration
from ..unpacking import extract
from .auth import client, requires, service
from .errors import ApiError

api = Blueprint("api", __name__, url_prefix="/api/v1")
#: Most jobs, and log lines, one page holds.
MAX_PAGE = 1000


class SubmitRequest(SubmitOptions):
    """``POST /jobs``: a command job, as ``gpulayer submit`` takes it (the job itself is then checked
    by the same :class:`gpulayer.JobSpec` the CLI builds). It names no file: files come only as the
    multipart form's uploads, never as paths, which would be the server's own files."""

    command: list[str] | str
    requirements: Requirements = Field(default_factory=Requirements, description="What the job needs.")


#: The most jobs one ``POST /jobs`` list may hold.
MAX_LIST = 10_000


class TokenRequest(BaseModel):
    """``POST /tokens``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str
    role: Role
    #: A duration (``30d``, ``12h``, seconds); none: it never expires.
    expires: str | float | None = None


def _body(model: type[BaseModel]) -> Any:
    data = request.get_json(silent=True)
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    return model.model_validate(data)


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    raw = request.args.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise ApiError(400, f"{name} must be a whole number from {low} to {high}")
    return int(raw)


@api.get("/jobs")
@requires("viewer")
def list_jobs() -> Response:
    """The newest jobs first; ``state``, ``limit`` (at most 1,000) and ``offset`` page through them."""
    state = request.args.get("state")
    if state is not None and state not in {s.value for s in JobState}:
        raise ApiError(400, f"state must be one of {', '.join(s.value for s in JobState)}")
    limit, offset = _int_arg("limit", 50, 1, MAX_PAGE), _int_arg("offset", 0, 0, 10**9)
    records = client().jobs(state, limit=limit, offset=offset)
    following = offset + limit if len(records) == limit else None
    return jsonify(jobs=[record.as_json() for record in records], next_offset=following)


@api.post("/jobs")
@requires("submitter")
def submit() -> tuple[Response, int]:
    """Queue a command job; answers its id (201). The body is the job as JSON, or a multipart form
    with that JSON in its ``spec`` field, the job's source folder as a tar archive (gzip or not) in
    ``source``, and input files in ``inputs`` (each lands in the job's folder under its own name).
    Or a JSON list of jobs that differ only in their command: answers their ids, in order."""
    if request.mimetype != "multipart/form-data":
        data = request.get_json(silent=True)
        if isinstance(data, list):
            return jsonify(ids=[job.id for job in _submit_list(data)]), 201
        return jsonify(id=_submit_one(_body(SubmitRequest)).id), 201
    try:
        body = SubmitRequest.model_validate_json(request.form.get("spec", ""))
    except ValidationError as exc:
        raise ApiError(400, f"the spec field must hold the job as JSON: {validation_message(exc)}") from None
    with tempfile.TemporaryDirectory(prefix="gpulayer-upload-") as scratch:
        source = _unpacked(request.files.get("source"), Path(scratch) / "source")
        inputs = _saved(request.files.getlist("inputs"), Path(scratch) / "inputs")
        job = _submit_one(body, source, inputs)
    return jsonify(id=job.id), 201


def _submit_one(body: SubmitRequest, source: Path | None = None, inputs: list[Path] | None = None) -> Job:
    """The job a checked body asks for, with the files uploaded beside it (in the server's scratch
    folder). The body is the options model itself: no key of the request becomes a keyword."""
    return client().submit(
        body.command, source=source, inputs=inputs or [], requirements=body.requirements, options=body
    )


def _submit_list(data: list[Any]) -> list[Job]:
    """Jobs sent as a list: checked whole, then queued together (:meth:`Client.submit_many`)."""
    if not 0 < len(data) <= MAX_LIST:
        raise ApiError(400, f"a list of jobs holds 1 to {MAX_LIST} of them")
    items = [SubmitRequest.model_validate(item) for item in data]
    first = items[0]
    shared = first.model_dump(exclude={"command"})
    if any(item.model_dump(exclude={"command"}) != shared for item in items[1:]):
        raise ApiError(
            400, "the jobs of a list must differ only in their command: send a list per set of options"
        )
    return client().submit_many(
        [item.command for item in items], requirements=first.requirements, options=first
    )


def _unpacked(upload: FileStorage | None, folder: Path) -> Path | None:
    if upload is None:
        return None
    folder.mkdir()
    try:
        extract(upload.stream, folder, max_bytes=client().settings.max_source_bytes)
    except ArchiveError as exc:
        raise ApiError(400, f"source: {exc}") from None
    return folder


def _saved(uploads: list[FileStorage], folder: Path) -> list[Path]:
    folder.mkdir()
    saved = []
    for upload in uploads:
        # Refused, not renamed: the job would otherwise find its input under a name it was not given.
        name = upload.filename or ""
        try:
            plain_name(name)
        except ValueError as exc:
            raise ApiError(400, f"inputs: {exc}") from None
        if (folder / name).exists():
            raise ApiError(400, f"inputs: two files are named {name!r}")
        upload.save(folder / name)
        saved.append(folder / name)
    return saved


@api.get("/jobs/<job_id>")
@requires("viewer")
def job_detail(job_id: str) -> Response:
    """The job's record, with each attempt and, while it is queued, why each worker is not running it
    and what the autoscaler last decided for it (null where it decided nothing)."""
    job = client().get(job_id)
    data = job.status().as_json()
    plan = job.why() if data["state"] == "queued" else None
    data["reasons"] = [r.model_dump() for r in plan.reasons] if plan else []
    data["capacity"] = plan.capacity if plan else None
    return jsonify(data)


@api.post("/jobs/<job_id>/cancel")
@requires("submitter")
def cancel(job_id: str) -> Response:
    """Cancel the job; 409 if it had already ended."""
    job = client().get(job_id)
    if not job.cancel():
        raise ApiError(409, f"job {job_id} had already ended ({job.status().state.value})")
    return jsonify(id=job_id, state=job.status().state.value)


@api.get("/jobs/<job_id>/logs")
@requires("viewer")
def logs(job_id: str) -> Response:
    """Stored log lines after the line ``after`` (an id from a page before), at most ``limit``;
    ``rank`` keeps one rank's lines of a gang job."""
    after = request.args.get("after", "0-0")
    if not all(part.isdigit() for part in after.split("-", 1)) or after.count("-") != 1:
        raise ApiError(400, "after must be a line id like 1732900000000-0")
    rank = request.args.get("rank")
    if rank is not None and not rank.isdigit():
        raise ApiError(400, "rank must be a whole number")
    page = client().get(job_id).log_page(after, _int_arg("limit", MAX_PAGE, 1, MAX_PAGE))
    lines = [
        {"id": line_id, **line.model_dump(mode="json")}
        for line_id, line in page
        if rank is None or line.rank == int(rank)
    ]
    return jsonify(lines=lines, next_after=page[-1][0] if page else after)


@api.get("/jobs/<job_id>/outputs")
@requires("viewer")
def outputs(job_id: str) -> Response:
    """The job's outputs, as the gzip-compressed tar archive it stored, once found signed by the
    worker that ran the job (else 502: the server hands on no archive a worker did not sign)."""
    record = client().get(job_id).status()
    if not record.state.is_terminal:
        raise JobNotFinished(f"job {job_id} is {record.state.value}; outputs are uploaded when it ends")
    spooled = tempfile.SpooledTemporaryFile(SPOOL_BYTES)  # noqa: SIM115 - send_file closes it
    try:
        client().get(job_id).outputs_archive(spooled)
    except OutputNotProduced as exc:
        spooled.close()
        raise ApiError(404, str(exc)) from None
    except UntrustedPayload:
        spooled.close()
        raise
    spooled.seek(0)
    return send_file(spooled, mimetype="application/gzip", download_name=f"{job_id}-outputs.tar.gz")


@api.get("/workers")
@requires("viewer")
def workers() -> Response:
    """The connected workers: what each offers and what its jobs hold now."""
    return jsonify(workers=[worker.model_dump(mode="json") for worker in client().workers()])


@api.get("/machines")
@requires("viewer")
def machines() -> Response:
    """The machines the autoscaler started, the newest first (those that run, and those that ended in
    the last day), each with its age (s) and what it has cost so far (null where its price is unknown)."""
    now = datetime.now(timezone.utc)
    found = [
        {**machine.model_dump(mode="json"), "age": machine.age(now), "cost": machine.cost(now)}
        for machine in client().machines()
    ]
    return jsonify(machines=found)


@api.get("/telemetry")
@requires("viewer")
def telemetry() -> Response:
    """Each connected worker's samples (CPU, memory, each GPU) over the last ``minutes`` (at most 60),
    oldest first."""
    seconds = _int_arg("minutes", 60, 1, 60) * 60
    samples = service().telemetry(seconds)
    return jsonify(
        interval=client().settings.telemetry_interval,
        workers={name: [s.model_dump(mode="json") for s in found] for name, found in samples.items()},
    )


@api.get("/activity")
@requires("viewer")
def activity() -> Response:
    """Samples of the installation (jobs by state, queue depths) over the last ``minutes`` (at most 60)."""
    seconds = _int_arg("minutes", 60, 1, 60) * 60
    return jsonify(
        interval=client().settings.telemetry_interval,
        samples=[sample.model_dump(mode="json") for sample in service().activity(seconds)],
    )


@api.get("/queues")
@requires("viewer")
def queues() -> Response:
    """Each queue with how many jobs wait in it, and how many gang jobs wait for workers."""
    found, gangs = service().queues()
    return jsonify(queues=[queue.model_dump(mode="json") for queue in found], gangs_waiting=gangs)


@api.get("/tokens")
@requires("admin")
def tokens() -> Response:
    """Every API token that still works (names, roles, times; never the tokens)."""
    return jsonify(tokens=[token.model_dump(mode="json") for token in service().tokens()])


@api.post("/tokens")
@requires("admin")
def create_token() -> tuple[Response, int]:
    """A new token; the answer is the only time it is shown (201)."""
    body: TokenRequest = _body(TokenRequest)
    try:
        seconds = parse_duration(body.expires) if isinstance(body.expires, str) else body.expires
    except ValueError as exc:
        raise ApiError(400, f"expires: {exc}") from None
    token, info = service().create_token(body.name, body.role, seconds)
    return jsonify(token=token, **info.model_dump(mode="json")), 201


@api.delete("/tokens/<name>")
@requires("admin")
def revoke_token(name: str) -> Response:
    """Revoke a token: it stops working at once."""
    service().revoke_token(name)
    return jsonify(revoked=name, by=g.token.name)
