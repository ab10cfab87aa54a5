"""The function-call protocol on the worker's side: a call goes to a warm executor for its code
bundle, requirements and GPUs (or a new one), and its reply, or the executor's death, ends the job."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..models import JobState
from ..payloads import ERROR, RESULT
from ..units import format_size
from .endings import Ending
from .executor_pool import Executor, Key
from .launches import Followed, Launch, LaunchContext, Started
from .output import Tracked
from .threads import VARIABLES
from .usage import ExecutorMeter

#: What of its first call's environment an executor starts with: numeric libraries read their
#: thread counts once, as they load, and every call an executor serves asks for the same (they come
#: from its CPUs, part of the requirements in its key).
_STARTS_WITH = ("HOME", "TMPDIR", "TMP", "TEMP", "PYTHONNOUSERSITE", "VIRTUAL_ENV", "PATH", *VARIABLES)


class CallLaunch(Launch):
    folder = False

    def start(
        self, job: LaunchContext, env: dict[str, str], call: bytes | None, announced: str
    ) -> Started | Ending:
        """Send the call to an executor: a warm one for this code and these GPUs, or a new one."""
        function = job.spec.function
        assert function is not None
        assert call is not None
        folder = job.retry(job.functions.bundles.folder, function.bundle)
        # It starts as the call's (its HOME is the call's for its user site, which stays off), and
        # each call it serves sets its own.
        start_env = {**job.base_env, **{name: env[name] for name in _STARTS_WITH if name in env}}
        try:
            executor = _executor(job, Key.of(job.spec, job.base_env), folder, start_env)
        except OSError as exc:
            reason = f"cannot start a Python process for the call: {exc.strerror}"
            job.say(reason)
            return Ending(JobState.FAILED, reason=reason)
        with contextlib.suppress(BrokenPipeError):  # a dead executor shows as its exit, below
            executor.send({"env": env}, call)
        return Started([Tracked(executor.process)], executor, executor.replies, outputs=False)

    def finish(self, job: LaunchContext, started: Started, followed: Followed) -> Ending:
        if followed.reply is None or job.stopped() is not None:
            returncode = followed.returncode
            ending = job.outcome(returncode if returncode is not None else 1, None, None)
            if ending.state is JobState.FAILED:
                return dataclasses.replace(ending, reason=f"the call's Python process died ({ending.reason})")
            return ending
        return reply_ending(job, *followed.reply)


def _executor(job: LaunchContext, key: Key, folder: Path, env: Mapping[str, str]) -> Executor:
    """An executor for the call, its cgroup held to the job's limits: a warm one, unless it already
    uses more memory than this job may (it is stopped), or the call asks for a fresh process."""
    executors = job.functions.executors
    function = job.spec.function
    assert function is not None
    if not function.fresh_process:
        executor = executors.acquire(key, env, folder, job.python)
        try:
            job.contain(ExecutorMeter(executor.process.pid), executor.box)
            return executor
        except OSError:
            executors.release(executor, keep=False)
    executor = executors.start(key, env, folder, job.python)
    try:
        job.contain(ExecutorMeter(executor.process.pid), executor.box)
    except OSError:
        executors.release(executor, keep=False)
        raise
    return executor


def reply_ending(job: LaunchContext, header: dict[str, Any], payload: bytes) -> Ending:
    """How the call ended, with what it returned (or raised) to store as its result."""
    cap = job.max_result_bytes
    if len(payload) > cap:
        reason = (
            f"its result pickles to {format_size(len(payload))}, above the "
            f"{format_size(cap)} cap (GPULAYER_MAX_JOB_BYTES on the worker)"
        )
        job.say(reason)
        return Ending(JobState.FAILED, 1, reason)
    if header["ok"]:
        return Ending(JobState.SUCCEEDED, 0, result=(RESULT, payload))
    return Ending(JobState.FAILED, 1, _one_line(header["error"]), result=(ERROR, payload))


def _one_line(text: str, limit: int = 500) -> str:
    line = text.strip().splitlines()[0] if text.strip() else text
    return line if len(line) <= limit else line[: limit - 1] + "…"
