"""How a job runs, besides its command, its files and what it needs of a machine: written once.

Each option's bounds, default and description live here and nowhere else. :class:`SubmitOptions` is
the parameter object of a command job's submit: the keywords of :meth:`gpulayer.Client.submit`
(typed by :class:`SubmitKeywords`), the options of `gpulayer submit`, the body of ``POST /jobs``
and its OpenAPI schema, and the MCP ``submit_job`` tools are made from its fields.
:class:`CallOptions` is a remote function's; a job's :class:`~gpulayer.models.JobSpec` keeps the
fields of :class:`CommandOptions`. Adding an option is a field here, the worker code that reads it,
a test and a line of the docs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from typing_extensions import TypedDict

from .environments import MAX_REQUIREMENT_CHARS, MAX_REQUIREMENTS, requirement_line
from .requirements import RequirementKeywords

#: Which failures of a job are retried: its worker was lost, its command exited non-zero, or both.
RetryOn = Literal["lost", "exit", "both"]
#: How a gang job's ranks start: by the worker itself, with torchrun's environment; or by torchrun.
Launcher = Literal["direct", "torchrun"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the worker sets for a job, which its ``env`` may not set: they say which GPUs it holds
#: (``CUDA_VISIBLE_DEVICES`` would otherwise reach past its reservation), which rank of a gang it is,
#: that Python ignores the user site folder (``PYTHONNOUSERSITE``), and everything GPUlayer's own
#: (``GPULAYER_*``).
RESERVED_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_NAME",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "PYTHONNOUSERSITE",
    }
)
RESERVED_ENV_PREFIXES = ("GPULAYER_", "TORCHELASTIC_")

OutputPattern = Annotated[str, Field(min_length=1, max_length=1024)]
PipSpec = Annotated[str, Field(min_length=1, max_length=MAX_REQUIREMENT_CHARS)]
#: The largest requirements file a job may carry (its text travels in the job's signed spec).
MAX_REQUIREMENTS_TEXT = 256 * 1024


def reserved_variable(name: str) -> bool:
    """Whether a job's ``env`` may not set ``name`` (the worker sets it, or keeps it from jobs)."""
    return name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)


class RunOptions(BaseModel):
    """How any job runs and is retried, a command's or a remote function call's; kept in its spec."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    timeout: float | None = Field(
        default=None, gt=0, description="Seconds before the job is stopped; none: no limit."
    )
    priority: int = Field(
        default=0, ge=-1000, le=1000, description="Higher runs first, within and across queues."
    )
    retries: int = Field(
        default=2, ge=0, le=100, description="How many times it runs again after a failure retry_on names."
    )
    retry_on: RetryOn = Field(
        default="lost", description="Which failures are retried: a lost worker, a non-zero exit, or both."
    )
    retry_delay: float = Field(
        default=1.0,
        ge=0,
        le=3600,
        description="Seconds before the first retry; each later one waits twice as long.",
    )
    kill_grace: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        description="Seconds between SIGTERM and SIGKILL when it times out or its worker stops; "
        "none: the worker's setting.",
    )

    def kept(self) -> dict[str, Any]:
        """What of these options a job's spec keeps (:class:`CommandOptions`'s fields), by name: those
        not at their default, which the spec has too (each given one costs the spec a check)."""
        return {
            name: value for name, default in _kept(type(self)) if (value := getattr(self, name)) != default
        }


class GangOptions(BaseModel):
    """What makes a job a gang job (kept in its spec as :class:`~gpulayer.models.Distributed`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    nodes: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="A gang job on this many distinct workers at once, each with what it needs.",
    )
    procs_per_node: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="Ranks per node of a gang job (default: its GPUs per node, else 1).",
    )
    launcher: Launcher | None = Field(
        default=None,
        description="How a gang job's ranks start: direct (the worker starts them) or torchrun.",
    )

    @property
    def is_gang(self) -> bool:
        return self.nodes is not None or self.procs_per_node is not None or self.launcher is not None


class CommandOptions(RunOptions):
    """What a command job's spec keeps besides :class:`RunOptions`: its environment, name, outputs."""

    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the job.")
    name: str | None = Field(
        default=None, min_length=1, max_length=200, description="A name to recognise the job by."
    )
    outputs: list[OutputPattern] = Field(
        default_factory=list,
        max_length=256,
        description="Paths or globs in the job's folder, uploaded when it ends.",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for key, value in env.items():
            if not _ENV_NAME.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if reserved_variable(key):
                raise ValueError(f"{key} is set by the worker for each job; a job's env may not set it")
            if "\0" in value:
                raise ValueError(f"the value of {key} holds a NUL byte")
        return env

    @field_validator("outputs")
    @classmethod
    def _outputs_relative(cls, outputs: list[str]) -> list[str]:
        return [_relative_pattern(pattern) for pattern in outputs]

    @field_validator("name")
    @classmethod
    def _name_one_line(cls, name: str | None) -> str | None:
        if name is not None and ("\n" in name or "\r" in name):
            raise ValueError("the name must be one line")
        return name


@functools.cache
def _kept(options: type[RunOptions]) -> tuple[tuple[str, Any], ...]:
    """The fields of ``options`` a spec keeps, with their defaults."""
    fields = options.model_fields.items()
    kept = CommandOptions.model_fields
    return tuple(
        (name, field.get_default(call_default_factory=True)) for name, field in fields if name in kept
    )


class EnvironmentOptions(BaseModel):
    """The Python environment a job brings (docs/environments.md): its worker builds it with uv, once
    per machine, and the job's ``python`` is that environment's. Made into the spec's
    :class:`~gpulayer.environments.PythonEnvironment` at submit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="A runtime profile (`gpulayer profiles` lists them): an accelerator, frameworks and "
        "packages at once; the options given beside it win.",
    )
    pip: list[PipSpec] = Field(
        default_factory=list,
        max_length=MAX_REQUIREMENTS,
        description="A package (PEP 508, e.g. 'six==1.16.0') installed in the job's own Python "
        "environment, which its worker builds with uv from its own package index.",
    )
    requirements_text: str | None = Field(
        default=None,
        max_length=MAX_REQUIREMENTS_TEXT,
        description="A requirements file's text (requirements only, no options), installed as pip's are.",
    )
    project_env: bool = Field(
        default=False,
        description="Install the source folder's project dependencies: its uv.lock, else its "
        "pyproject.toml's [project] dependencies.",
    )

    @field_validator("pip")
    @classmethod
    def _pip_requirements(cls, pip: list[str]) -> list[str]:
        return [requirement_line(text) for text in pip]

    @property
    def brings_environment(self) -> bool:
        return bool(self.profile or self.pip or self.requirements_text or self.project_env)


class _Given(BaseModel):
    """Options as a caller gives them. (Not a job's spec: a stored spec is read as it was written,
    without a Python step in pydantic's way, as the worker reads one per job.)"""

    @model_validator(mode="before")
    @classmethod
    def _none_is_the_default(cls, data: Any) -> Any:
        """An option given as None (``retries=None``, JSON's null) takes its default, as it always has."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class SubmitOptions(_Given, EnvironmentOptions, GangOptions, CommandOptions):
    """Everything a command job's submit may say of how it runs."""

    idempotency_key: str | None = Field(
        default=None,
        description="A second submit with the same key returns the first job instead of another.",
    )
    fail_if_unschedulable: bool = Field(
        default=False,
        description="Refuse the job, writing nothing, if no connected worker could ever run it.",
    )


class CallOptions(_Given, EnvironmentOptions, GangOptions, RunOptions):
    """How a remote function's calls run: what they need, and how they are retried and stopped."""

    #: What the machine must have: :class:`~gpulayer.Requirements`'s fields, checked as they are given.
    requirements: dict[str, Any] = Field(default_factory=dict)
    #: A fresh Python process for every call, instead of a warm one.
    fresh_process: bool = False
    #: The folder shipped with the code (default: the running script's folder, else the current one).
    source: Path | None = None
    #: Unpickle results whole, as code, rather than as data only (None: as the client says). Not part
    #: of the job: the caller's choice of how far it trusts this installation's workers.
    allow_pickle: bool | None = None


class RunKeywords(TypedDict, total=False):
    timeout: float | None
    priority: int
    retries: int
    retry_on: RetryOn
    retry_delay: float
    kill_grace: float | None


class GangKeywords(TypedDict, total=False):
    nodes: int | None
    procs_per_node: int | None
    launcher: Launcher | None


class EnvironmentKeywords(TypedDict, total=False):
    profile: str | None
    pip: Sequence[str]
    requirements_text: str | None
    project_env: bool


class SubmitKeywords(RequirementKeywords, RunKeywords, GangKeywords, EnvironmentKeywords, total=False):
    """:class:`SubmitOptions`'s fields and :class:`~gpulayer.Requirements`'s, as the keywords of
    :meth:`gpulayer.Client.submit` (tests/test_submit_model.py keeps them in step with the models)."""

    env: Mapping[str, str]
    name: str | None
    outputs: Sequence[str]
    idempotency_key: str | None
    fail_if_unschedulable: bool


class CallKeywords(RequirementKeywords, RunKeywords, GangKeywords, EnvironmentKeywords, total=False):
    """:class:`CallOptions`'s fields, ``requirements`` given as its fields, as keywords."""

    fresh_process: bool
    source: str | Path | None
    allow_pickle: bool | None


def _relative_pattern(pattern: str) -> str:
    path = PurePosixPath(pattern)
    if not pattern or "\0" in pattern:
        raise ValueError(f"output pattern {pattern!r} is empty or holds a NUL byte")
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(f"output {pattern!r} must be a path inside the job's folder (relative, no '..')")
    return pattern
