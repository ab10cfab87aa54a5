"""Starting a command job's process with glibc's ``posix_spawn``: half the worker's CPU of
``subprocess.Popen`` per process (Popen builds the child's environment and file descriptors in
Python, then forks; ``posix_spawn`` does it all in C around a vfork).

Python's own ``os.posix_spawn`` cannot set the child's working folder before Python 3.13, so glibc is
called through ctypes. The child gets what Popen would give it: stdin from ``/dev/null``, stdout and
stderr into pipes, a session of its own, SIGPIPE and SIGXFSZ back to their defaults, no blocked
signal, and no file descriptor of the worker's but those three (``closefrom(3)``, as Popen's
``close_fds``). Where glibc lacks any of this (not Linux, glibc before 2.34), :data:`AVAILABLE` is
False and jobs start through Popen.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

_SETSIGDEF, _SETSIGMASK, _SETSID = 0x04, 0x08, 0x80
#: SIGCANCEL and SIGSETXID, below SIGRTMIN.
_GLIBC_INTERNAL = (32, 33)
#: Room for glibc's posix_spawn_file_actions_t (80 bytes), posix_spawnattr_t (336) and sigset_t
#: (128) on every architecture it supports; 8-byte aligned.
_OPAQUE_WORDS = 128
_NEEDED = (
    "posix_spawn",
    "posix_spawn_file_actions_init",
    "posix_spawn_file_actions_destroy",
    "posix_spawn_file_actions_addopen",
    "posix_spawn_file_actions_adddup2",
    "posix_spawn_file_actions_addchdir_np",
    "posix_spawn_file_actions_addclosefrom_np",
    "posix_spawnattr_init",
    "posix_spawnattr_setflags",
    "posix_spawnattr_setsigmask",
    "posix_spawnattr_setsigdefault",
    "sigemptyset",
)


def _glibc() -> tuple[ctypes.PyDLL, ctypes.CDLL] | None:
    """glibc twice: its functions called with the GIL held (those that only fill in a structure: letting
    go of the GIL around each would hand it to another thread a dozen times per job), and called
    without it (``posix_spawn``, which waits for the child's exec)."""
    if not sys.platform.startswith("linux"):
        return None
    library = ctypes.util.find_library("c") or "libc.so.6"
    try:
        held, released = ctypes.PyDLL(library, use_errno=True), ctypes.CDLL(library, use_errno=True)
    except OSError:
        return None
    return (held, released) if all(hasattr(held, name) for name in _NEEDED) else None


_loaded = _glibc()
_libc = _loaded[0] if _loaded else None
_posix_spawn = _loaded[1].posix_spawn if _loaded else None
#: Whether jobs can be started this way here.
AVAILABLE = _libc is not None


def _opaque() -> ctypes.Array[ctypes.c_uint64]:
    return (ctypes.c_uint64 * _OPAQUE_WORDS)()


def _attributes() -> ctypes.Array[ctypes.c_uint64] | None:
    """The spawn attributes every job shares, made once: glibc only reads them."""
    if _libc is None:
        return None
    empty, defaults, attributes = _opaque(), _opaque(), _opaque()
    _libc.sigemptyset(empty)
    _libc.sigemptyset(defaults)
    # What Popen's restore_signals puts back (Python ignores them, and a child would inherit that),
    # and glibc's two internal signals, which its posix_spawn would otherwise leave ignored in the
    # child. Set bit by bit: sigaddset refuses the internal ones.
    for number in (signal.SIGPIPE, signal.SIGXFSZ, *_GLIBC_INTERNAL):
        defaults[(number - 1) // 64] |= 1 << ((number - 1) % 64)
    _libc.posix_spawnattr_init(attributes)
    _libc.posix_spawnattr_setflags(attributes, ctypes.c_short(_SETSIGDEF | _SETSIGMASK | _SETSID))
    _libc.posix_spawnattr_setsigmask(attributes, empty)
    _libc.posix_spawnattr_setsigdefault(attributes, defaults)
    return attributes


_ATTRIBUTES = _attributes()


class Stream(Protocol):
    """The worker's end of a job's output: all the supervisor uses of it."""

    def fileno(self) -> int: ...
    def close(self) -> None: ...


class Started(Protocol):
    """A job's process, however it was started (``subprocess.Popen`` or :class:`Spawned`)."""

    @property
    def pid(self) -> int: ...
    @property
    def stdout(self) -> Stream | None: ...
    @property
    def stderr(self) -> Stream | None: ...

    #: Its return code once reaped (whoever reaps it may set it).
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self) -> int: ...


class PipeEnd:
    """A pipe's reading end as a :class:`Stream` (a file object would cost a system call to make)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Spawned:
    """A process :func:`spawn` started: as much of ``subprocess.Popen`` as the worker uses."""

    def __init__(self, pid: int, stdout: Stream, stderr: Stream) -> None:
        self.pid = pid
        self.stdout: Stream | None = stdout
        self.stderr: Stream | None = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reaped(os.WNOHANG)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self._reaped(0)
        return self.returncode

    def _reaped(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:
            self.returncode = 0  # reaped elsewhere, as Popen says then
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)


def _encoded(texts: list[str]) -> list[bytes]:
    """Each text in the file system's encoding, as Popen encodes them; all at once (a job's
    environment is dozens of them, and this is per job)."""
    if not texts:
        return []
    joined = "\0".join(texts)
    if joined.count("\0") != len(texts) - 1:
        raise ValueError("embedded null byte")
    return os.fsencode(joined).split(b"\0")


def _done(error: int, what: str) -> None:
    if error:
        raise OSError(error, os.strerror(error), what)


def spawn(path: str, argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> Spawned | None:
    """Start ``path`` with ``argv`` in ``cwd`` with exactly ``env`` (see the module's docstring);
    an ``OSError`` (FileNotFoundError, PermissionError, ...) if it cannot be; None if this one is
    Popen's to start (the worker's own stdout or stderr is closed, so the pipes would land on them).
    Needs :data:`AVAILABLE`."""
    if "=" in "".join(env):
        raise ValueError("illegal environment variable name")
    args = _encoded(list(argv))
    variables = _encoded([f"{name}={value}" for name, value in env.items()])
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    pid = None
    try:
        if min(out_write, err_write) >= 3:
            pid = _start(path, args, variables, cwd, out_write, err_write)
    finally:
        for child_end in (out_write, err_write):
            os.close(child_end)
        if pid is None:  # not started, or it failed: the worker's ends go too
            for own_end in (out_read, err_read):
                os.close(own_end)
    if pid is None:
        return None
    return Spawned(pid, PipeEnd(out_read), PipeEnd(err_read))


def _start(path: str, args: list[bytes], variables: list[bytes], cwd: Path, stdout: int, stderr: int) -> int:
    assert _libc is not None, "posix_spawn is not available here"
    assert _posix_spawn is not None
    actions = _opaque()
    _done(_libc.posix_spawn_file_actions_init(actions), "file actions")
    try:
        _done(_libc.posix_spawn_file_actions_addopen(actions, 0, b"/dev/null", os.O_RDONLY, 0), os.devnull)
        _done(_libc.posix_spawn_file_actions_adddup2(actions, stdout, 1), "stdout")
        _done(_libc.posix_spawn_file_actions_adddup2(actions, stderr, 2), "stderr")
        _done(_libc.posix_spawn_file_actions_addchdir_np(actions, os.fsencode(cwd)), str(cwd))
        _done(_libc.posix_spawn_file_actions_addclosefrom_np(actions, 3), "closefrom")
        pid = ctypes.c_int()
        error = _posix_spawn(
            ctypes.byref(pid),
            os.fsencode(path),
            actions,
            _ATTRIBUTES,
            (ctypes.c_char_p * (len(args) + 1))(*args, None),
            (ctypes.c_char_p * (len(variables) + 1))(*variables, None),
        )
    finally:
        _libc.posix_spawn_file_actions_destroy(actions)
    _done(error, path)
    return pid.value
