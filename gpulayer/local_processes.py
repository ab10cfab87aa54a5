"""The processes GPUlayer starts on this machine besides jobs (a local worker, the web server): its own
CLI in the background, and how they are waited for and stopped. `gpulayer up` keeps them running;
a private installation (:mod:`gpulayer.private`) stops them with the process that started them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from . import access as accesses
from . import home as local
from .errors import ServerError

#: What the processes started here must not inherit: they find their own role's access in the home.
NOT_INHERITED = ("GPULAYER_REDIS_URL", accesses.TOKEN_VARIABLE)
#: How long a process started here gets to say it is ready.
START_TIMEOUT = 20.0
# Python 3.10 has no -P: the same, by hand (with -c, the current folder is sys.path[0], as '').
_OFF_THE_CURRENT_FOLDER = (
    "import runpy, sys; sys.path[:1] = [] if sys.path[:1] == [''] else sys.path[:1]; "
    "runpy.run_module('gpulayer', run_name='__main__', alter_sys=True)"
)


def gpulayer_command(*args: str) -> list[str]:
    """``python -m gpulayer ARGS`` with the current folder off the module path: a folder holding a
    ``gpulayer/`` of its own (a checkout's parent) would shadow the installed package. (``-P``, not
    PYTHONSAFEPATH: the jobs a worker starts would inherit that variable.)"""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "gpulayer", *args]
    return [sys.executable, "-c", _OFF_THE_CURRENT_FOLDER, *args]


def child_env(home: Path) -> dict[str, str]:
    """The environment of a process started here: this one's, in ``home``, without its access."""
    env = {name: value for name, value in os.environ.items() if name not in NOT_INHERITED}
    env["GPULAYER_HOME"] = str(home)
    return env


def start(args: Sequence[str], home: Path, log: Path) -> subprocess.Popen[bytes]:
    """``gpulayer ARGS`` in the background, in a session of its own (a Ctrl-C meant for the terminal's
    command does not reach it), its output appended to ``log``."""
    with os.fdopen(local.open_log(log), "ab") as log_file:
        return subprocess.Popen(
            gpulayer_command(*args),
            env=child_env(home),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(process: subprocess.Popen[bytes], ready: Callable[[], bool], failed: str) -> None:
    """Block until ``ready()``; if ``process`` exits or :data:`START_TIMEOUT` passes first, kill it and
    raise :class:`ServerError` (``failed``)."""
    deadline = time.monotonic() + START_TIMEOUT
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            kill(process.pid)
            process.wait()
            raise ServerError(failed)
        time.sleep(0.05)


def stop(pid: int, timeout: float, gone: Callable[[], None] = lambda: None) -> None:
    """SIGTERM (a worker finishes its running jobs), again after ``timeout`` (``gone`` is told: a
    worker then stops them and puts them back in their queues), SIGKILL 15 s later."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if wait_gone(pid, timeout):
        return
    gone()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not wait_gone(pid, 15.0):
        kill(pid)


def wait_gone(pid: int, timeout: float) -> bool:
    """Whether ``pid`` ended within ``timeout`` (a zombie counts as ended: its parent or init reaps it)."""
    deadline = time.monotonic() + timeout
    while local.alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
