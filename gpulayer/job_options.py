"""How a job runs, besides its command, its files and what it needs of a machine: the one model the
ways to submit derive from or are checked against.

``POST /jobs``'s body (and so the OpenAPI document) derives from :class:`JobOptions`; the keywords
of :meth:`gpulayer.Client.submit` and ``submit_many``, the options of `gpulayer submit`, the MCP
``submit_job`` tool and a remote function's :class:`~gpulayer.calls.CallOptions` are checked
against it by tests/test_submit_model.py, which fails when one of them gains, loses or renames an
option, or gives it another default.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .models import Launcher, RetryOn


class JobOptions(BaseModel):
    """What a submit may say of how its job runs. None: the default the job spec applies."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the job.")
    timeout: float | None = Field(None, description="Seconds before the job is stopped; none: no limit.")
    name: str | None = Field(None, description="A name to recognise the job by.")
    outputs: list[str] = Field(
        default_factory=list, description="Paths or globs in the job's folder, uploaded when it ends."
    )
    priority: int = Field(0, description="Higher runs first.")
    retries: int | None = Field(None, description="Runs again after this many failures (default 2).")
    retry_on: RetryOn | None = Field(
        None, description="Which failures are retried: a lost worker (the default), a non-zero exit, both."
    )
    retry_delay: float | None = Field(
        None, description="Seconds before the first retry (default 1); doubles after each."
    )
    idempotency_key: str | None = Field(
        None, description="A second submit with the same key returns the first job instead of another."
    )
    fail_if_unschedulable: bool = Field(
        False, description="Refuse the job, writing nothing, if no connected worker could ever run it."
    )
    nodes: int | None = Field(
        None, description="A gang job on this many distinct workers at once, each with what it needs."
    )
    procs_per_node: int | None = Field(
        None, description="Ranks per node of a gang job (default: its GPUs per node, else 1)."
    )
    launcher: Launcher | None = Field(
        None, description="How a gang job's ranks start: direct (torchrun's environment) or torchrun."
    )
