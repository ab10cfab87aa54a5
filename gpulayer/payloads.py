"""What a function job carries: its call, and its result or exception, pickled and signed.

Pickled with cloudpickle, so functions from ``__main__``, closures and lambdas travel by value;
signed with the installation's secret (:mod:`gpulayer.signing`) and checked before unpickling.
A call is ``(function, args, kwargs)``, the function pickled on its own (:func:`pickle_function`)
once for all the calls of a batch, and unpickled once per executor.
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

from .signing import Signer

#: Archive names in the job's files: the call (inputs), and its result or exception (outputs).
CALL = "call.pkl"
RESULT = "result.pkl"
ERROR = "error.pkl"


def pickle_function(function: Any) -> bytes:
    pickled: bytes = cloudpickle.dumps(function, protocol=pickle.HIGHEST_PROTOCOL)
    return pickled


def pack(obj: Any, signer: Signer) -> bytes:
    return signer.sign(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def unpack(blob: bytes, signer: Signer) -> Any:
    """The object, if ``blob`` carries this installation's signature; :class:`UntrustedPayload` if not."""
    return pickle.loads(signer.verify(blob))  # verified first
