"""Numeric precision: full float32, or mixed precision with autocast (bfloat16, or float16 with a
gradient scaler). Parameters and optimizer state stay float32 in every mode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal, TypeVar, get_args

import torch

from . import data

T = TypeVar("T")

#: Lightning's names: mixed precision autocasts the steps (parameters stay float32); true
#: precision keeps the parameters, the batches' floating tensors and new tensors in that type.
PrecisionName = Literal[
    "32", "32-true", "16", "16-mixed", "bf16", "bf16-mixed", "16-true", "bf16-true", "64", "64-true"
]
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)
#: Each name: its autocast type (mixed), or the type of everything (true); None for both: float32.
_TYPES: dict[str, tuple[torch.dtype | None, torch.dtype | None]] = {
    "32": (None, None),
    "32-true": (None, None),
    "16": (torch.float16, None),
    "16-mixed": (torch.float16, None),
    "bf16": (torch.bfloat16, None),
    "bf16-mixed": (torch.bfloat16, None),
    "16-true": (None, torch.float16),
    "bf16-true": (None, torch.bfloat16),
    "64": (None, torch.float64),
    "64-true": (None, torch.float64),
}


def precision_name(given: str | int) -> PrecisionName:
    """A precision as its name (Lightning's ``16``, ``32``, ``64`` too); ValueError if it is none."""
    name = str(given)
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (or 16, 32, 64), not {given!r}")
    return name  # type: ignore[return-value]  # one of PrecisionName's, as just checked


class Precision:
    """The context steps run in (autocast, or the default type of true precision), the gradient
    scaler float16 autocast needs, and what true precision converts."""

    def __init__(self, name: str, device: torch.device) -> None:
        self.device_type = device.type
        self.dtype, self.true_dtype = _TYPES[precision_name(name)]
        if self.dtype is not None and not torch.amp.is_autocast_available(device.type):
            raise ValueError(f"precision={name!r} needs autocast, which PyTorch lacks on {device.type}")
        # Small float16 gradients underflow to zero; the scaler multiplies the loss, then divides
        # the gradients back before the optimizer sees them. bfloat16 has float32's range.
        self.scaler = torch.amp.GradScaler(device.type) if self.dtype is torch.float16 else None

    @property
    def has_context(self) -> bool:
        """Whether steps run in a context of their own (the per-batch loop skips it otherwise)."""
        return self.dtype is not None or self.true_dtype is not None

    def convert_module(self, module: torch.nn.Module) -> None:
        if self.true_dtype is not None:
            module.to(self.true_dtype)

    def convert_input(self, batch: T) -> T:
        """``batch`` with its floating tensors in true precision's type (as it is, otherwise)."""
        dtype = self.true_dtype
        if dtype is None:
            return batch
        return data.apply(batch, lambda tensor: tensor.to(dtype) if tensor.is_floating_point() else tensor)

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """Where steps run: autocast (mixed), the default type set to true precision's, or as is."""
        if self.dtype is not None:
            return torch.autocast(self.device_type, dtype=self.dtype)
        if self.true_dtype is not None:
            return _default_dtype(self.true_dtype)
        return contextlib.nullcontext()


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)
