"""Whom a worker's jobs run as: the worker's own user, or, with ``--run-as USER``, another user, so a
job can read neither the worker's home (its access, its keys) nor its ``/proc/<pid>/environ``.

Running jobs as another user needs root (to start processes as that user). The worker then also
reads what a job leaves behind (its outputs, its checkpoint folder, the results of its ranks) with
that user's file permissions, in the slot's thread only (Linux's per-thread ``setfsuid``), so a link
a job plants towards a file of the worker's reads as nothing the job could not read itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import grp
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


@dataclasses.dataclass(frozen=True)
class RunAs:
    """Another user that every job process of a worker runs as."""

    user: str
    uid: int
    gid: int
    #: The user's other groups (``video``, ``render``: what GPU devices often need).
    groups: tuple[int, ...]

    @classmethod
    def lookup(cls, user: str) -> RunAs:
        """:class:`ConfigError` with one line when jobs cannot run as ``user`` here."""
        if _libc is None:
            raise ConfigError("--run-as works on Linux only")
        if os.geteuid() != 0:
            raise ConfigError("--run-as needs the worker to run as root (to start jobs as another user)")
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise ConfigError(f"--run-as: no user named {user!r} on this machine") from None
        if entry.pw_uid == 0:
            raise ConfigError("--run-as: the user must not be root")
        groups = tuple(gid for gid in os.getgrouplist(user, entry.pw_gid) if gid != entry.pw_gid)
        return cls(user, entry.pw_uid, entry.pw_gid, groups)

    def popen_options(self) -> dict[str, Any]:
        """What :class:`subprocess.Popen` takes to start a process as this user."""
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def environment(self) -> dict[str, str]:
        """The variables that say who a job is (its HOME is its own, made for it: see the runner)."""
        return {"USER": self.user, "LOGNAME": self.user}

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """File access in this thread with the user's permissions, as its jobs have them."""
        assert _libc is not None
        _libc.setfsgid(self.gid)
        _libc.setfsuid(self.uid)
        try:
            yield
        finally:
            _libc.setfsuid(os.geteuid())
            _libc.setfsgid(os.getegid())

    def own(self, path: Path) -> None:
        """Hand ``path`` and everything under it (links themselves, never what they point to) to the
        user, deepest first, so no job of the user's can reach into it before all of it is the user's."""
        for dirpath, dirnames, filenames in os.walk(path, topdown=False):
            for name in dirnames + filenames:
                os.lchown(os.path.join(dirpath, name), self.uid, self.gid)
        os.lchown(path, self.uid, self.gid)

    def can_run(self, program: str) -> str | None:
        """None if the user can start ``program``; else why not, in a few words."""
        try:
            subprocess.run(
                [program, "-c", "pass"],
                capture_output=True,
                timeout=60,
                check=True,
                cwd="/",
                env={"PATH": os.defpath},
                **self.popen_options(),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return str(exc) or type(exc).__name__
        return None


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def job_area(explicit: Path | None, name: str) -> Path:
    """Where a worker with ``--run-as`` keeps its job folders (with each job's HOME and TMPDIR) and
    bundles: a folder the job user can pass through but not list (711), owned by the worker, outside
    the worker's own home (which the job user must not enter)."""
    area = explicit or Path("/var/lib/gpulayer") / name
    area.mkdir(parents=True, exist_ok=True, mode=0o711)
    info = area.lstat()
    if area.is_symlink() or info.st_uid != os.geteuid():
        raise ConfigError(f"{area} is not a folder of this worker's user: refusing to run jobs in it")
    area.chmod(0o711)
    return area


def describe(run_as: RunAs | None) -> str:
    """Whom jobs run as, for the worker's first log line."""
    if run_as is None:
        return f"as this worker's user ({pwd.getpwuid(os.geteuid()).pw_name})"
    groups = ", ".join(group_name(gid) for gid in run_as.groups)
    return f"as {run_as.user} (uid {run_as.uid}" + (f"; groups {groups})" if groups else ")")
