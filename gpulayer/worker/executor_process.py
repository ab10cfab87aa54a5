"""A function executor: a Python process that runs a worker's function jobs one at a time and stays
warm for the next job with the same code bundle and requirements.

The worker starts it as a fresh interpreter running :func:`main`, never as a fork of itself, so a
function may use CUDA whatever ran in the worker before. It runs in the code bundle's folder, which
comes first on ``sys.path``. Requests and replies travel on two pipes the worker passes in; what the
function prints goes to the executor's stdout and stderr, which the worker reads into the job's log.

A request is one message (:func:`pack`): a JSON header ``{"env"}`` and the call, whose digest the
worker has found in the job's signature. A reply is one message too: a JSON header ``{"ok": bool,
"error": "Type: message", "children": bool}`` and the pickled result, or the pickled report of the
exception (:func:`report`), which the worker signs for the job and attempt. The executor holds no key
and no credential: nothing a call does can sign.
"""

from __future__ import annotations

import contextlib
import json
import linecache
import os
import pickle
import sys
import tempfile
import traceback
import types
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..payloads import described, dump_result, exception_message

#: Functions unpickled so far, by their pickle; forgotten all at once past this many.
_FUNCTIONS: dict[bytes, Any] = {}
_FUNCTIONS_KEPT = 32


def main(argv: list[str]) -> None:
    requests = Connection(int(argv[1]), writable=False)
    replies = Connection(int(argv[2]), readable=False)
    # The project (the bundle, this process's folder) imports first, as it does where it was written.
    sys.path.insert(0, os.getcwd())
    while True:
        try:
            header, payload = unpack(requests.recv_bytes())
        except EOFError:
            return
        replies.send_bytes(pack(*run(header, payload)))


def pack(header: dict[str, Any], payload: bytes) -> bytes:
    """A request or a reply as one message (one write, two reads): the JSON header, a newline, the
    payload. The header as ``json.dumps`` writes it has no newline of its own."""
    return json.dumps(header).encode() + b"\n" + payload


def unpack(message: bytes) -> tuple[dict[str, Any], bytes]:
    header, _, payload = message.partition(b"\n")
    return json.loads(header), payload


def run(header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    """Run one call with the job's environment: the variables it changes are put back after (only
    those: rewriting the whole environment cost a third of an executor's CPU per short call). One
    already at its value is left alone: the thread variables a warm executor started with are every
    call's (setting a dozen of them cost a no-op call 20 µs more)."""
    before: dict[str, str | None] = {}
    for name, value in header["env"].items():
        now = os.environ.get(name)
        if now != value:
            before[name] = now
            os.environ[name] = value
    # tempfile reads TMPDIR once and keeps it: each call's temporary files go to its own TMPDIR.
    tempdir, tempfile.tempdir = tempfile.tempdir, os.environ.get("TMPDIR")
    reply: dict[str, Any]
    try:
        pickled, args, kwargs = pickle.loads(payload)  # the worker checked its digest against the signature
        reply, blob = {"ok": True}, dump_result(_function(pickled)(*args, **kwargs))
    except BaseException as exc:  # whatever the call raised, SystemExit included, is its result
        traceback.print_exc()
        reply, blob = {"ok": False, "error": described(exc)}, dump_result(report(exc))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        tempfile.tempdir = tempdir
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    # The worker kills what the call left running; it looks only when there is something to find.
    reply["children"] = has_children()
    return reply, blob


def _function(pickled: bytes) -> Any:
    """The function of a call, unpickled once per executor (its pickle was verified with the call)."""
    function = _FUNCTIONS.get(pickled)
    if function is None:
        if len(_FUNCTIONS) >= _FUNCTIONS_KEPT:
            _FUNCTIONS.clear()
        function = _FUNCTIONS[pickled] = pickle.loads(pickled)
        _remember_sources(function)
    return function


def _remember_sources(function: Any) -> None:
    """The lines of the project's files the function's code names (relative to the bundle, this
    process's folder), read now: linecache would look for them in the current folder when a
    traceback is printed, and a call may have changed it by then."""
    code = getattr(function, "__code__", None)
    if not isinstance(code, types.CodeType):
        return
    for name in {each.co_filename for each in _codes(code)}:
        path = Path(name)
        if path.is_absolute() or name.startswith("<") or name in linecache.cache or not path.is_file():
            continue
        with contextlib.suppress(OSError):  # a traceback without its lines, not a failed call
            lines = path.read_text(errors="replace").splitlines(keepends=True)
            # No modification time: linecache.checkcache keeps the entry, as it keeps a loader's.
            linecache.cache[name] = (path.stat().st_size, None, lines, str(path.resolve()))


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and the code nested in it (its lambdas, inner functions and comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def has_children() -> bool:
    """Whether this process has children still running; those that ended are reaped."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def report(exc: BaseException) -> dict[str, Any]:
    """What the caller needs to raise ``exc`` again: the exception itself pickled apart (None if it
    cannot be), so one that cannot be rebuilt there is still described."""
    try:
        pickled: bytes | None = dump_result(exc)
    except Exception:
        pickled = None
    kind = type(exc)
    return {
        "type": f"{kind.__module__}.{kind.__qualname__}",
        "message": exception_message(exc),
        "traceback": traceback.format_exc(),
        "exception": pickled,
    }
