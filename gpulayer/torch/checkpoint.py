"""Checkpoint files: written atomically, read back without running code, and the RNG states they carry.

A checkpoint is a dict of tensors, numbers, strings, lists and dicts, so ``torch.load`` reads it
with ``weights_only=True``: a checkpoint found in a shared folder cannot run code when loaded.
"""

from __future__ import annotations

import importlib
import io
import os
import random
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

#: Bumped when the checkpoint's layout changes in a way older code cannot read.
FORMAT = 1


def write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that a reader (or a run killed part-way) sees the old file or the
    new one, never half of one: a temporary file beside it, then renamed over it. ``durable``: on
    disk before the rename, so that it also survives the machine losing power."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        if durable:
            file.flush()
            os.fsync(file.fileno())
    os.replace(temporary, path)


def save(checkpoint: dict[str, Any], paths: Iterable[Path]) -> None:
    """Serialize ``checkpoint`` once and write it to each of ``paths``."""
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    data = buffer.getvalue()
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)


def load(path: Path) -> dict[str, Any]:
    checkpoint: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    if checkpoint.get("format") != FORMAT:
        raise ValueError(f"{path} is not a gpulayer.torch checkpoint this version reads")
    return checkpoint


def load_weights(path: Path) -> dict[str, Any]:
    """A checkpoint's ``state_dict`` and ``hyper_parameters``, of ``gl.torch`` or of Lightning (whose
    files hold both under the same names), read without running code."""
    found: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(found.get("state_dict"), dict):
        raise ValueError(f"{path} holds no state_dict: not a checkpoint of gl.torch or Lightning")
    return found


def storable(values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Of ``values``, those a checkpoint can hold and load back without running code (numbers,
    strings, tensors, and lists, tuples and dicts of them); and the names of the rest."""
    kept = {name: value for name, value in values.items() if _plain(value)}
    return kept, [name for name in values if name not in kept]


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float | str | torch.Tensor):
        return True
    if isinstance(value, list | tuple):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str | int) and _plain(item) for key, item in value.items())
    return False


def rng_state() -> dict[str, Any]:
    """This process's random number generators: torch's (CPU and, once used, CUDA), Python's and,
    if the program imported it, NumPy's."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, position, has_gauss, gauss = numpy.random.get_state()
        state["numpy"] = (kind, keys.tolist(), position, has_gauss, gauss)
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        numpy = importlib.import_module("numpy")
        kind, keys, position, has_gauss, gauss = state["numpy"]
        numpy.random.set_state((kind, numpy.array(keys, dtype=numpy.uint32), position, has_gauss, gauss))
