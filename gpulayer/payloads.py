"""What a function job carries: its call, and its result or exception, pickled.

Pickled with cloudpickle, so functions from ``__main__``, closures and lambdas travel by value. A call
is ``(function, args, kwargs)``, the function pickled on its own (:func:`pickle_function`) once for all
the calls of a batch, and unpickled once per executor. Nothing here is unpickled unchecked: a call
only once the job's signature is found to name its digest, a result only once the signature of the
worker that claimed the attempt, over it, its job and its attempt, is found good (:mod:`gpulayer.signing`).
"""

from __future__ import annotations

import io
import pickle
import types
from pathlib import Path
from typing import IO, Any

import cloudpickle

from .signing import WorkerKey, open_result

#: Archive names in the job's files: the call (inputs), and its result or exception (outputs).
CALL = "call.pkl"
RESULT = "result.pkl"
ERROR = "error.pkl"


#: What cloudpickle names the file of code it pickles by value.
_DYNAMIC = "<dynamic-code>"
_CODE_REDUCE = cloudpickle.Pickler.dispatch_table[types.CodeType]


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle's, except that code pickled by value keeps its file's name, relative to the project
    (``train.py``), where cloudpickle writes ``<dynamic-code>``: a remote traceback then names the
    user's script, and the worker, which runs in the project's bundle, finds its lines."""

    def __init__(self, file: IO[bytes], root: Path) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._root = root.resolve()
        self._names: dict[str, str] = {}

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, types.CodeType):
            return super().reducer_override(obj)
        rebuild, args = _CODE_REDUCE(obj)
        name = self._name(obj.co_filename)
        return rebuild, tuple(name if isinstance(arg, str) and arg == _DYNAMIC else arg for arg in args)

    def _name(self, filename: str) -> str:
        """Relative to the project when the file is in it; else as it was (a notebook's cell, ``<stdin>``)."""
        if filename not in self._names:
            try:
                self._names[filename] = Path(filename).resolve().relative_to(self._root).as_posix()
            except (ValueError, OSError):
                self._names[filename] = filename
        return self._names[filename]


def pickle_function(function: Any, root: Path | None = None) -> bytes:
    """``function`` pickled; with ``root``, the project it ships with, its code names its files."""
    if root is None:
        pickled: bytes = cloudpickle.dumps(function, protocol=pickle.HIGHEST_PROTOCOL)
        return pickled
    file = io.BytesIO()
    _Pickler(file, root).dump(function)
    return file.getvalue()


def dumps(obj: Any) -> bytes:
    pickled: bytes = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return pickled


def load_result(key: WorkerKey, job_id: str, attempt: int, name: str, blob: bytes) -> Any:
    """What a worker stored as ``name`` for the job's ``attempt``, if the worker identity ``key`` (the
    one that claimed the attempt) signed it so; :class:`UntrustedPayload` if not (and nothing of it
    is unpickled)."""
    return pickle.loads(open_result(key, job_id, attempt, name, blob))  # verified first
