"""Lightning's utilities a training script reaches for: :func:`seed_everything` and
:func:`rank_zero_only`."""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import torch

P = ParamSpec("P")
R = TypeVar("R")


def seed_everything(seed: int = 0) -> int:
    """Seed Python's, NumPy's (where installed) and PyTorch's generators, on every device; returns
    ``seed``. Each rank calls it with the same seed (the Trainer gives each rank's data order and
    dropout their own seeds besides)."""
    random.seed(seed)
    torch.manual_seed(seed)  # every device's too
    try:
        import numpy
    except ImportError:
        pass
    else:
        numpy.random.seed(seed % 2**32)
    return seed


def rank_zero_only(function: Callable[P, R]) -> Callable[P, R | None]:
    """``function`` run on rank 0 only (of the Trainer's ranks, torchrun's, or a gang job's): on the
    others the call does nothing and returns None."""

    @functools.wraps(function)
    def on_rank_zero(*args: P.args, **kwargs: P.kwargs) -> R | None:
        return function(*args, **kwargs) if _rank() == 0 else None

    return on_rank_zero


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))
