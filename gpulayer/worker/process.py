"""Starting a job's process in its own session, noticing when it exits, and killing all it left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil


def spawn(command: Sequence[str], cwd: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start ``command`` (no shell) as the leader of a new session, so its whole tree can be signalled."""
    return subprocess.Popen(
        list(command),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def exit_notifier(pid: int) -> int | None:
    """A file descriptor readable once ``pid`` exits (a Linux pidfd), or None where there is none."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def has_exited(pid: int) -> bool:
    """Whether ``pid`` has exited, without reaping it: while it is a zombie its id cannot be reused,
    so its process group can still be signalled safely."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def signal_tree(leader: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the job's process group and to every descendant of its leader, including
    those that left the group (a daemonising child, a data loader that called setsid)."""
    descendants: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        descendants = psutil.Process(leader).children(recursive=True)
    signal_group(leader, sig)
    for process in descendants:
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)


def signal_group(leader: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the job's process group only: one system call, for the end of every job."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, sig)
