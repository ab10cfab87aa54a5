"""How a job's processes start: one launch per kind of job. A launch is given a narrow view of its job
(:class:`LaunchContext`), starts the job's processes and returns them (:class:`Started`); the runner
follows them to their end, and the launch then says what that end means for its kind of job.

A command runs in a folder of its own (:class:`CommandLaunch`); a function's call in a warm executor
(:class:`~.calling.CallLaunch`); one node's part of a gang job as that node's ranks
(:class:`~.parts.PartLaunch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..models import JobSpec, JobState, OutputSummary
from ..store.execution import Claim
from .boxes import Box
from .endings import Ending, StopReason
from .executor_pool import Executor
from .functions import FunctionRuntime
from .output import Tracked
from .process import JobProcesses
from .usage import LeadersMeter, Meter

T = TypeVar("T")


class Retry(Protocol):
    """A Redis call the job cannot do without, retried through an outage while its lease holds."""

    def __call__(self, call: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...


@dataclasses.dataclass(frozen=True)
class LaunchContext:
    """What a launch may use of its job: the job, its folder, and the few things it may do."""

    spec: JobSpec
    claim: Claim
    #: The job's folder (a function's call runs in its code bundle's instead).
    folder: Path
    #: The worker's environment for the job, before the job's own variables.
    base_env: Mapping[str, str]
    processes: JobProcesses
    functions: FunctionRuntime
    #: The largest result a call may return, in bytes.
    max_result_bytes: int
    #: A line of the worker's own in the job's log.
    say: Callable[[str], None]
    retry: Retry
    #: Puts the job's processes from now on in a box (default: a cgroup of the job's own), held to
    #: what the job asked for; before they start. :class:`OSError` if the box already holds more.
    contain: Callable[[Meter, Box | None], Box]
    #: Why the job is being stopped early, if it is.
    stopped: Callable[[], StopReason | None]
    #: How processes that ended with a return code end the job (a stop, a timeout, memory, ...).
    outcome: Callable[[int, OutputSummary | None, str | None], Ending]
    #: Where rank 0 of the job's gang listens, once node 0 has said it ('' or None before).
    master: Callable[[], str | None]
    #: The Python of the job's own environment, where it brings one (None: the worker's).
    python: str | None = None


@dataclasses.dataclass
class Started:
    """What a launch started, for the runner to follow to its end."""

    tracked: list[Tracked]
    #: The executor a function's call went to: the job ends with its reply on ``replies``.
    executor: Executor | None = None
    replies: Connection | None = None
    #: Whether this runner uploads the job's outputs (node 0 of a gang job holds them).
    outputs: bool = True


@dataclasses.dataclass(frozen=True)
class Followed:
    """How the started processes ended, as the runner saw them through, for the launch to finish."""

    #: The first process's return code; None where an executor replied (it lives on).
    returncode: int | None
    #: What the job's outputs came to, and why they could not be kept, if they could not.
    outputs: OutputSummary | None = None
    unkept: str | None = None
    #: An executor's reply (its header and payload), if it gave one.
    reply: tuple[dict[str, Any], bytes] | None = None
    #: The first of several processes that failed (its rank, and its exit status).
    failed: tuple[int | None, int] | None = None


class Launch:
    """What a kind of job changes in the lifecycle; the defaults are a plain job's."""

    #: Whether the job runs in a folder of its own, with a checkpoint folder beside it (a function's
    #: call runs in its code bundle's folder, in an executor that outlives the job).
    folder = True

    def announce(self) -> str:
        """What the start tells others of where this job listens (rank 0 of a gang job)."""
        return ""

    def label(self, line: str) -> str:
        """A line of the worker's in the job's log, as it is shown."""
        return line

    def start(
        self, job: LaunchContext, env: dict[str, str], call: bytes | None, announced: str
    ) -> Started | Ending:
        """Start the job's processes with ``env`` added to the worker's; or how the job ended
        without them (they could not start)."""
        raise NotImplementedError

    def finish(self, job: LaunchContext, started: Started, followed: Followed) -> Ending:
        """How the job ended, once what started has."""
        return job.outcome(followed.returncode or 0, followed.outputs, followed.unkept)


class CommandLaunch(Launch):
    def start(
        self, job: LaunchContext, env: dict[str, str], call: bytes | None, announced: str
    ) -> Started | Ending:
        try:
            env = {**job.base_env, "PYTHONUNBUFFERED": "1", **env}
            box = job.contain(LeadersMeter(), None)
            process = job.processes.spawn(job.spec.command, job.folder, env, box=box)
        except OSError as exc:
            code, reason = spawn_failure(job.spec.command[0], exc)
            job.say(reason)
            return Ending(JobState.FAILED, code, reason)
        return Started([Tracked(process)])


def spawn_failure(program: str, exc: OSError) -> tuple[int, str]:
    if isinstance(exc, FileNotFoundError):
        return 127, f"command not found: {program}"
    if isinstance(exc, PermissionError):
        return 126, f"permission denied: {program}"
    return 126, f"cannot start {program}: {exc.strerror}"
