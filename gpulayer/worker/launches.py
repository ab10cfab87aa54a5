"""How a job's processes start: one launch per kind of job, which its runner's lifecycle calls.

A command runs in a folder of its own (:class:`CommandLaunch`); a function's call in a warm executor
(:class:`~.calling.CallLaunch`); one node's part of a gang job as that node's ranks
(:class:`~.parts.PartLaunch`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..models import JobState
from .endings import Ending
from .output import Tracked
from .usage import LeadersMeter

if TYPE_CHECKING:
    from .runner import JobRunner


class Launch:
    """What a kind of job changes in the lifecycle; the defaults are a plain job's."""

    #: Whether the job runs in a folder of its own, with a checkpoint folder beside it (a function's
    #: call runs in its code bundle's folder, in an executor that outlives the job).
    folder = True

    def announce(self, job: JobRunner) -> str:
        """What the start tells others of where this job listens (rank 0 of a gang job)."""
        return ""

    def label(self, line: str) -> str:
        """A line of the worker's in the job's log, as it is shown."""
        return line

    def start(self, job: JobRunner, env: dict[str, str], call: bytes | None, announced: str) -> Ending | None:
        """Start the job's processes with ``env`` added to the worker's, and follow them to the job's
        end (None: the job was given back, or is not this worker's any more)."""
        raise NotImplementedError


class CommandLaunch(Launch):
    def start(self, job: JobRunner, env: dict[str, str], call: bytes | None, announced: str) -> Ending | None:
        try:
            env = {**job.base_env, "PYTHONUNBUFFERED": "1", **env}
            box = job.contain(LeadersMeter())
            process = job.processes.spawn(job.spec.command, job.workdir, env, box=box)
        except OSError as exc:
            code, reason = spawn_failure(job.spec.command[0], exc)
            job.system(reason)
            return Ending(JobState.FAILED, code, reason)
        return job.command([Tracked(process)])


def spawn_failure(program: str, exc: OSError) -> tuple[int, str]:
    if isinstance(exc, FileNotFoundError):
        return 127, f"command not found: {program}"
    if isinstance(exc, PermissionError):
        return 126, f"permission denied: {program}"
    return 126, f"cannot start {program}: {exc.strerror}"
