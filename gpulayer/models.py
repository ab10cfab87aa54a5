"""The domain as pydantic models: what a job asks for, where it stands, what it printed.

No Redis, no CLI here; the CLI and the client validate with these same classes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Literal, TypeVar, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from .environments import PythonEnvironment
from .errors import InvalidJobSpec
from .options import CommandOptions, GangOptions, Launcher
from .requirements import DEFAULT, Requirements

M = TypeVar("M", bound=BaseModel)
#: What an API token may do: everything; submit and cancel jobs (and read); read; read /metrics only.
Role = Literal["admin", "submitter", "viewer", "metrics"]
#: Whom a machine acts as towards Redis: its user there, and the keys it holds (docs/security.md).
#: ``capacity``: the autoscaler's (docs/capacity.md), an identity of its own only.
AccessRole = Literal["admin", "web", "submitter", "worker", "viewer", "capacity"]
#: The roles a machine's own identity may have (`gpulayer access add ROLE NAME`).
IdentityRole = Literal["web", "submitter", "worker", "viewer", "capacity"]
#: A job record larger than this is refused: by the client at submit, by a worker that finds one.
MAX_SPEC_BYTES = 1024 * 1024
#: Names a job's checkpoint folder to it: what it saves there is given back to its retries.
CHECKPOINT_VARIABLE = "GPULAYER_CHECKPOINT_DIR"
#: Tells each process of a job its job's id: how a worker knows a job's strays, and a Trainer its run.
JOB_ID_VARIABLE = "GPULAYER_JOB_ID"
#: Tells each process of a job its attempt, from 1.
ATTEMPT_VARIABLE = "GPULAYER_ATTEMPT"


class JobState(str, enum.Enum):
    """Where a job stands. ``queued → scheduled → running →`` one of the four ends."""

    QUEUED = "queued"
    #: A worker took it and is fetching its files; its process has not started. (A command job with
    #: no files to fetch goes on to ``running`` in the same step as its claim.)
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def rq_status(self) -> str:
        """The status RQ's own tools show for a job in this state."""
        return _RQ_STATUS[self]


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT})
_RQ_STATUS = {
    JobState.QUEUED: "queued",
    JobState.SCHEDULED: "started",
    JobState.RUNNING: "started",
    JobState.SUCCEEDED: "finished",
    JobState.FAILED: "failed",
    JobState.TIMED_OUT: "failed",
    JobState.CANCELLED: "canceled",
}


def plain_name(name: str) -> str:
    """``name`` if it is one file's name (what an input is called in its job's folder): not empty,
    no ``/`` or ``\\``, not ``.`` or ``..``, no NUL; else ValueError saying so."""
    if not name or name in (".", "..") or any(character in name for character in "/\\\0"):
        raise ValueError(f"{name!r} is not a plain file name (no /, \\, NUL, . or ..)")
    if len(name.encode()) > 255:
        raise ValueError(f"{name[:40]!r}... is longer than a file name may be (255 bytes)")
    return name


class FunctionSpec(BaseModel):
    """What makes a job a call of a remote function: the call itself travels signed in the job's files."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The function's module and qualified name, for people reading the job.
    name: str = Field(min_length=1, max_length=1000)
    #: The SHA-256 of the code bundle the call runs from (unpacked once per machine).
    bundle: str = Field(pattern=r"^[0-9a-f]{64}$")
    #: Run in a new Python process, not a warm one kept from an earlier call.
    fresh_process: bool = False


class Distributed(BaseModel):
    """How a gang job spreads: ``nodes`` distinct workers, each running ``procs_per_node`` ranks, all
    started together or not at all. Each node needs what the job's requirements say."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nodes: int = Field(ge=1, le=256)
    procs_per_node: int = Field(default=1, ge=1, le=256)
    launcher: Launcher = "direct"

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @classmethod
    def of(cls, requirements: Requirements, gang: GangOptions) -> Distributed | None:
        """The gang these options ask for, or None when they ask for none; ``procs_per_node``
        defaults to the GPUs per node of a job that asks for GPUs, else 1."""
        if not gang.is_gang:
            return None
        gpus = requirements.gpus if requirements.accelerator in ("cuda", "rocm", "any") else 0
        fields = {
            "nodes": gang.nodes or 1,
            "procs_per_node": gang.procs_per_node or gpus or 1,
            "launcher": gang.launcher or "direct",
        }
        return validated(cls, fields)


def _command_not_blank(command: list[str]) -> list[str]:
    if not command or not command[0].strip():
        raise ValueError("the command is empty")
    if any("\0" in arg for arg in command):
        raise ValueError("the command holds a NUL byte")
    return command


#: A job's command: its arguments, run without a shell.
Command = Annotated[
    list[Annotated[str, Field(max_length=65536)]], Field(max_length=4096), AfterValidator(_command_not_blank)
]
_COMMAND: TypeAdapter[list[str]] = TypeAdapter(Command)


class JobSpec(CommandOptions):
    """What a job asks for: a command, or a call of a remote function. Stored with the job; the worker
    runs exactly this. How it runs (retries, priority, environment, ...) is :class:`CommandOptions`'s."""

    command: Command
    #: Whether a source folder was shipped; it is unpacked at the root of the job's folder.
    source: bool = False
    #: Names the inputs take in the job's folder (each input keeps its base name).
    inputs: list[str] = Field(default_factory=list, max_length=4096)
    #: What the machine that runs it must have; jobs with the same requirements share a queue. (A
    #: factory: the shared default is frozen, and pydantic would deep-copy a plain default per job.)
    requirements: Requirements = Field(default_factory=lambda: DEFAULT)
    #: Set for a call of a remote function; ``command`` then just names it.
    function: FunctionSpec | None = None
    #: Set for a gang job: the command runs as ranks on several workers at once.
    distributed: Distributed | None = None
    #: Set for a job that brings its own Python environment: its worker builds it (once per machine)
    #: and runs the job with its ``python``.
    environment: PythonEnvironment | None = None

    @property
    def queue(self) -> QueueSpec:
        return QueueSpec(requirements=self.requirements, priority=self.priority)

    def same_but_command(self, other: JobSpec) -> bool:
        """Whether the two specs differ in nothing but their command (jobs one batch submit can make)."""
        return all(getattr(self, name) == getattr(other, name) for name in _BESIDE_COMMAND)

    def with_command(self, command: list[str]) -> JobSpec:
        """This spec with another command, checked as a spec's is (:class:`InvalidJobSpec`); the
        whole spec's size is checked as it is stored."""
        try:
            return self.model_copy(update={"command": _COMMAND.validate_python(command)})
        except ValidationError as exc:
            raise InvalidJobSpec(f"invalid job: command: {validation_message(exc)}") from None

    @field_validator("inputs")
    @classmethod
    def _inputs_plain(cls, inputs: list[str]) -> list[str]:
        return [plain_name(name) for name in inputs]

    @model_validator(mode="after")
    def _function_has_no_files(self) -> JobSpec:
        if self.function and (self.source or self.inputs or self.outputs):
            raise ValueError("a function's job carries its code and arguments: no source, inputs or outputs")
        return self


_BESIDE_COMMAND = tuple(name for name in JobSpec.model_fields if name != "command")


class QueueSpec(BaseModel):
    """What every job of one queue asks for: the queue's entry in the registry workers read."""

    model_config = ConfigDict(frozen=True)

    requirements: Requirements = Field(default_factory=lambda: DEFAULT)
    priority: int = 0


def validation_message(error: ValidationError) -> str:
    """One line from pydantic's report: the first problem, with where it is."""
    first = error.errors()[0]
    where = _where(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _where(loc: tuple[int | str, ...]) -> str:
    # A requirement reads as its own name: "gpu_memory", not "requirements.gpu_memory".
    return ".".join(str(part) for part in loc).removeprefix("requirements.")


def validated(model: type[M], fields: Mapping[str, object]) -> M:
    """``model`` built from ``fields``, or :class:`InvalidJobSpec` with a one-line reason (and the
    field at fault, with pydantic's report of it, for a caller that names fields otherwise)."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = _where(first["loc"][:1] if first["loc"][:1] != ("requirements",) else first["loc"][:2])
        problem: dict[str, object] = {"type": first["type"], "msg": first["msg"], "ctx": first.get("ctx", {})}
        raise InvalidJobSpec(f"invalid job: {validation_message(exc)}", field or None, problem) from None


#: Why a spec over :data:`MAX_SPEC_BYTES` is refused.
SPEC_TOO_LARGE = "invalid job: its description (command, environment, outputs) is over 1 MiB"


def build_spec(**fields: object) -> JobSpec:
    spec = validated(JobSpec, fields)
    if len(spec.model_dump_json()) > MAX_SPEC_BYTES:
        raise InvalidJobSpec(SPEC_TOO_LARGE)
    return spec


class OutputSummary(BaseModel):
    """What a job's outputs came to when it ended."""

    files: int = 0
    bytes: int = 0
    #: Declared patterns that matched nothing.
    missing: list[str] = Field(default_factory=list)
    #: The worker that keeps them, when they were over what Redis holds (``redis_outputs_max_bytes``):
    #: a download pulls them from it. None: they are in Redis.
    held_by: str | None = None


#: How an attempt ended: as a job ends; or ``lost`` (its worker stopped renewing its lease, or
#: restarted); ``returned`` (put back by a worker's cold shutdown); ``unstarted`` (a gang job's part
#: could not start its ranks).
AttemptOutcome = Literal["succeeded", "failed", "cancelled", "timed_out", "lost", "returned", "unstarted"]
#: Why a job ended as it did, for programs to act on (its ``reason`` says it for people).
ReasonCode = Literal["worker_lost"]
#: It failed because its worker (for a gang job, one of its workers) was lost with no retry left.
WORKER_LOST: ReasonCode = "worker_lost"


class JobUsage(BaseModel):
    """What one attempt of a job used, as its worker measured it when it ended (docs/jobs.md says
    how, for each kind of job)."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    #: CPU time its processes spent, user and system together (s).
    cpu_seconds: float = Field(ge=0)
    #: The most memory (resident set, bytes) one of its processes held at once; None where unknown.
    peak_memory: int | None = Field(default=None, ge=0)
    #: The most GPU memory (bytes) its processes held at once on its GPUs, sampled about once a
    #: second through NVML; None without NVML (simulated GPUs) or without GPUs.
    peak_gpu_memory: int | None = Field(default=None, ge=0)


def _usage_or_none(value: object, handler: ValidatorFunctionWrapHandler) -> JobUsage | None:
    """A stored usage that cannot be read shows as unknown: the attempt it belongs to still reads."""
    try:
        return cast(JobUsage | None, handler(value))
    except ValidationError:
        return None


class Attempt(BaseModel):
    """How one attempt of a job ended: on which worker, with what exit code, and why."""

    attempt: int
    worker: str | None
    #: The worker identity that claimed it: the only one whose signature its files are accepted under.
    identity: str | None = None
    outcome: AttemptOutcome
    exit_code: int | None = None
    reason: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    #: What it used, where its worker measured it (not for a lost or returned attempt).
    usage: Annotated[JobUsage | None, WrapValidator(_usage_or_none)] = None


class GangPart(BaseModel):
    """Where one node of a gang job runs (or ran) in its latest attempt."""

    node: int
    worker: str
    #: GPUs it holds on that worker, in nvidia-smi numbering.
    gpus: list[int] = Field(default_factory=list)


class JobRecord(BaseModel):
    """A job as stored: its spec, its state with timestamps, and how it ended."""

    id: str
    name: str | None
    command: list[str]
    state: JobState
    attempt: int
    worker: str | None
    #: The worker identity that claimed its latest attempt (for a gang job, node 0's).
    identity: str | None = None
    exit_code: int | None
    reason: str | None
    #: What ``reason`` says, as a code, where there is one: see :data:`ReasonCode`.
    reason_code: ReasonCode | None = None
    queue: str
    created_at: datetime
    queued_at: datetime | None
    scheduled_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    outputs: OutputSummary | None
    #: What its latest attempt that ended used (a gang job's: its nodes' CPU time added up, the
    #: largest of their peaks).
    usage: JobUsage | None = None
    #: GPUs it holds (or held), in nvidia-smi numbering on its worker.
    gpus: list[int] = Field(default_factory=list)
    #: Every attempt that has ended, oldest first.
    attempts: list[Attempt] = Field(default_factory=list)
    #: When a retry waiting out its back-off goes back in its queue.
    retry_at: datetime | None = None
    #: For a gang job placed on workers: its nodes, node 0 (where rank 0 runs) first.
    parts: list[GangPart] = Field(default_factory=list)
    spec: JobSpec
    #: Set when fields of the stored record could not be read (written by something other than
    #: GPUlayer): which. Those fields show their defaults; a job whose spec cannot be read shows the
    #: command ``(unreadable)``.
    corrupt: str | None = None

    def claimer(self, attempt: int) -> str | None:
        """The worker identity that claimed ``attempt`` of this job: the latest, or one that ended."""
        if attempt == self.attempt:
            return self.identity
        return next((ended.identity for ended in self.attempts if ended.attempt == attempt), None)

    def as_json(self) -> dict[str, object]:
        """As `gpulayer status --json` and the HTTP API show it: times in UTC, the spec without the
        fields left at their defaults."""
        data = self.model_dump(mode="json", exclude={"spec"})
        data["spec"] = self.spec.model_dump(mode="json", exclude_defaults=True)
        return data


class LogLine(BaseModel):
    """One line a job printed, or a line GPUlayer added (``system``), with the attempt it came from."""

    model_config = ConfigDict(frozen=True)

    stream: Literal["stdout", "stderr", "system"]
    text: str
    attempt: int
    #: For a line of a gang job printed by one of its ranks: that rank (global numbering).
    rank: int | None = None
    #: When Redis received it.
    time: datetime


class TokenInfo(BaseModel):
    """An API token as stored (never the token itself: only its SHA-256 is kept)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    role: Role
    created_at: datetime
    #: When it stops working; None: never.
    expires_at: datetime | None = None


class Identity(BaseModel):
    """One machine's identity, as the admin signs it into the installation's registry: its role, its
    Redis user, for a worker the public key its results and outputs are checked with, and how long
    it is valid."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    role: IdentityRole
    user: str
    #: A worker's result key, the public half (its private half is only in the worker's token).
    result_key: str | None = None
    created: datetime
    #: From then on nobody accepts what it signs; None: never.
    expires: datetime | None = None

    def expired(self, now: datetime) -> bool:
        return self.expires is not None and self.expires <= now


class BrowserSession(BaseModel):
    """What Redis keeps of a browser session, under the SHA-256 of its cookie."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The SHA-256 of the session's token: checked again at every request, so revoking ends it.
    token: str
    #: What every change made through the session must carry.
    csrf_token: str


class OpenedSession(BaseModel):
    """A new session: the cookie (given to the browser once, never stored), its record and token."""

    model_config = ConfigDict(frozen=True)

    cookie: str
    record: BrowserSession
    token: TokenInfo
    #: How long it lasts (whole seconds, at least 1): the cookie's Max-Age.
    lifetime: int


class QueueInfo(BaseModel):
    """One queue: the jobs of one requirement set and priority waiting for a worker."""

    name: str
    requirements: Requirements
    priority: int
    #: Jobs waiting in it now.
    depth: int


class ActivitySample(BaseModel):
    """The whole installation at one moment, sampled once per telemetry interval."""

    #: Milliseconds since the epoch.
    time: int
    jobs: dict[JobState, int]
    #: Jobs waiting in each queue, by queue name.
    queues: dict[str, int]
    gangs_waiting: int = 0
