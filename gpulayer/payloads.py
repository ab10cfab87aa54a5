"""What a function job carries: its call, and its result or exception, pickled.

Pickled with cloudpickle, so functions from ``__main__``, closures and lambdas travel by value. A call
is ``(function, args, kwargs)``, the function pickled on its own (:func:`pickle_function`) once for all
the calls of a batch, and unpickled once per executor. Nothing here is unpickled unchecked: a call
only once the job's signature is found to name its digest, a result only once the signature of the
worker that claimed the attempt, over it, its job and its attempt, is found good (:mod:`gpulayer.signing`),
and then as data only unless the caller allows pickle (:mod:`gpulayer.unpickling`).
"""

from __future__ import annotations

import importlib
import io
import pickle
import sys
import types
from pathlib import Path
from typing import IO, Any

import cloudpickle

from .errors import UnsafePickle
from .signing import WorkerKey, open_result
from .unpickling import Policy, Refused, load_tensor, loads_data, lookup, own_class, registered_by_value

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


class _ResultPickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle's, except for what a client that unpickles data only could not rebuild otherwise: a
    tensor travels as ``torch.save`` wrote it (the client loads it with ``weights_only=True``), and a
    class this process got by value (one of the caller's script, or of a module it sends by value)
    by its name, which the client finds in its own code."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            saved = io.BytesIO()
            torch.save(obj, saved)
            return load_tensor, (saved.getvalue(),)
        if isinstance(obj, type) and _sent_by_value(obj):
            return own_class, (obj.__module__, obj.__qualname__)
        return super().reducer_override(obj)


def _sent_by_value(cls: type) -> bool:
    """Whether ``cls`` reached this process by value, so cloudpickle would send it back as code,
    and the caller can find it by its name: a class of the caller's script, or of a module it sends
    by value (not one imported here); not one defined in a function, which has no name to be found by."""
    if "<locals>" in cls.__qualname__:
        return False
    module = sys.modules.get(cls.__module__)
    if module is None or registered_by_value(cls.__module__):
        return True
    return cls.__module__ == "__main__" and lookup(module, cls.__qualname__) is not cls


def exception_message(exc: BaseException) -> str:
    """What ``exc`` says; its repr where that is empty (``raise ValueError()``), so a reason never
    ends at its colon."""
    text = str(exc)
    return text if text.strip() else repr(exc)


def described(exc: BaseException) -> str:
    """``Type: message``, as a traceback's last line names an exception."""
    return f"{type(exc).__name__}: {exception_message(exc)}"


def dump_result(obj: Any) -> bytes:
    """What a call returned (or the exception it raised), pickled for the caller (:class:`_ResultPickler`)."""
    file = io.BytesIO()
    _ResultPickler(file, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return file.getvalue()


def load_result(key: WorkerKey, job_id: str, attempt: int, name: str, blob: bytes, policy: Policy) -> Any:
    """What a worker stored as ``name`` for the job's ``attempt``, if the worker identity ``key`` (the
    one that claimed the attempt) signed it so; :class:`UntrustedPayload` if not (and nothing of it
    is unpickled). Unpickled under ``policy``:
    :class:`UnsafePickle` for a global that is not data, before it is called."""
    payload = open_result(key, job_id, attempt, name, blob)  # verified first
    try:
        return loads_data(payload, policy)
    except Refused as refused:
        raise UnsafePickle(
            f"job {job_id} returned a pickle that calls {refused}: refused "
            "(allow_pickle=True trusts this installation's workers with code)"
        ) from None


def imported(path: str) -> Any:
    """The function ``path`` names (``"module.function"``, ``"module.Class.method"``), imported where
    its call runs: what a job enqueued through :mod:`gpulayer.rq` carries in place of the function."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        try:
            found: Any = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if not f"{module}.".startswith(f"{exc.name}."):
                raise  # the module is there, and what it imports is not
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(f"no module of {path!r} can be imported")
