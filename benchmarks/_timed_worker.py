"""A GPUlayer worker whose slot threads account their CPU time to the parts of a job's path.

    python benchmarks/_timed_worker.py OUT.json worker start --redis-url URL ...

Runs ``gpulayer worker start`` as the CLI would, with each part's functions wrapped: every call adds
the CPU time its thread spent in it (``time.thread_time``: the kernel's count for that thread, so a
wait for a lock, the GIL or Redis counts nothing), less what its wrapped callees took, to its part.
At exit the totals go to OUT.json as ``{part: [seconds, calls]}``. Used by ``worker_profile.py``.
"""

from __future__ import annotations

import atexit
import functools
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpulayer.cli import main
from gpulayer.worker import folders, intake, process, runner, slots, supervisor

#: Each part, as the functions (object, name) that make it up. Most run inside another part's (all in
#: the slot's): a caller's time is counted without its timed callees'.
PARTS: dict[str, list[tuple[Any, str]]] = {
    "seal check": [(intake, "check_job")],
    "spawn": [(process.JobProcesses, "spawn")],
    "folders": [(folders.Folders, "make"), (folders.Folders, "remove")],
    "following its processes": [(supervisor.Supervisor, "follow"), (runner.JobRunner, "_follow")],
    "reap and strays": [(process.JobProcesses, "reap"), (process.JobProcesses, "kill_strays")],
    "checkpoint folder": [(runner.JobRunner, "_checkpoint_folder"), (runner.JobRunner, "_clean_up")],
    "end and next claim": [(runner.JobRunner, "_end")],
    "job record and runner": [(intake.JobIntake, "runner")],
    "the rest of the slot": [(slots.Slots, "_run_in_slot")],
}

_totals: dict[str, list[float]] = {part: [0.0, 0] for part in PARTS}
_lock = threading.Lock()
_stacks = threading.local()


def _timed(part: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        stack = _stacks.__dict__.setdefault("stack", [])
        stack.append(0.0)  # what wrapped callees take
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent = time.thread_time() - started
            inner = stack.pop()
            if stack:
                stack[-1] += spent
            with _lock:
                _totals[part][0] += spent - inner
                _totals[part][1] += 1

    return timed


def _save(path: str) -> None:
    with open(path, "w") as out:
        json.dump(_totals, out)


if __name__ == "__main__":
    for part, functions in PARTS.items():
        for owner, name in functions:
            setattr(owner, name, _timed(part, getattr(owner, name)))
    atexit.register(_save, sys.argv[1])
    main(sys.argv[2:])
