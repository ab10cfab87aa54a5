"""Numeric precision: full float32, or mixed precision with autocast (bfloat16, or float16 with a
gradient scaler). Parameters and optimizer state stay float32 in every mode."""

from __future__ import annotations

import contextlib
from typing import Literal, get_args

import torch

PrecisionName = Literal["32", "bf16", "bf16-mixed", "16-mixed"]
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)


class Precision:
    """The autocast context steps run in, and the gradient scaler float16 needs."""

    def __init__(self, name: str, device: torch.device) -> None:
        if name not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {name!r}")
        self.device_type = device.type
        self.dtype: torch.dtype | None = {
            "32": None,
            "bf16": torch.bfloat16,
            "bf16-mixed": torch.bfloat16,
            "16-mixed": torch.float16,
        }[name]
        if self.dtype is not None and not torch.amp.is_autocast_available(device.type):
            raise ValueError(f"precision={name!r} needs autocast, which PyTorch lacks on {device.type}")
        # Small float16 gradients underflow to zero; the scaler multiplies the loss, then divides
        # the gradients back before the optimizer sees them. bfloat16 has float32's range.
        self.scaler = torch.amp.GradScaler(device.type) if self.dtype is torch.float16 else None

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)
