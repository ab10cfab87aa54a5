"""How a job on this worker ends, as its runner records it, and why one is stopped early: what the
runner, its launchers, the lease keeper and the worker share, apart from any of them."""

from __future__ import annotations

import dataclasses
from typing import Literal

from ..models import JobState, JobUsage, OutputSummary

#: Why a job stops before its command ends by itself.
StopReason = Literal["cancel", "timeout", "requeue", "stale"]


@dataclasses.dataclass(frozen=True)
class Ending:
    """How a job ended, as the worker records it."""

    state: JobState
    exit_code: int | None = None
    reason: str | None = None
    outputs: OutputSummary | None = None
    #: A function's result or exception (its name in the outputs, and its pickle, which is signed for
    #: the job and attempt as it is stored), stored with the end in one round trip.
    result: tuple[str, bytes] | None = None
    #: A part of a gang job that could not start its ranks: the gang job goes back to wait.
    unstarted: bool = False
    #: What the job's processes used, stored with its end.
    usage: JobUsage | None = None


def shell_code(returncode: int) -> int:
    """Exit codes as a shell reports them: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode
