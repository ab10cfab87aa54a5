"""What a function job carries: its call, and its result or exception, pickled.

Pickled with cloudpickle, so functions from ``__main__``, closures and lambdas travel by value. A call
is ``(function, args, kwargs)``, the function pickled on its own (:func:`pickle_function`) once for all
the calls of a batch, and unpickled once per executor. Nothing here is unpickled unchecked: a call
only once the job's signature is found to name its digest, a result only once a worker's signature
over it, its job and its attempt is found good (:mod:`gpulayer.signing`).
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

from .signing import VerifyKey, open_result

#: Archive names in the job's files: the call (inputs), and its result or exception (outputs).
CALL = "call.pkl"
RESULT = "result.pkl"
ERROR = "error.pkl"


def pickle_function(function: Any) -> bytes:
    pickled: bytes = cloudpickle.dumps(function, protocol=pickle.HIGHEST_PROTOCOL)
    return pickled


def dumps(obj: Any) -> bytes:
    pickled: bytes = cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return pickled


def load_result(key: VerifyKey, job_id: str, attempt: int, name: str, blob: bytes) -> Any:
    """What a worker stored as ``name`` for the job's ``attempt``, if it is signed so;
    :class:`UntrustedPayload` if not (and nothing of it is unpickled)."""
    return pickle.loads(open_result(key, job_id, attempt, name, blob))  # verified first
