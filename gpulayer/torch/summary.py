"""``ModelSummary``: a table of the module's layers and its parameter counts, when a fit starts."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import torch

from .callbacks import Callback
from .module import Module

if TYPE_CHECKING:
    from .trainer import Trainer


class ModelSummary(Callback):
    """Print (rank 0, stderr) the module's children to ``max_depth`` levels (name, type, parameters),
    then its trainable, non-trainable and total parameters and their size in MB, as Lightning's."""

    def __init__(self, max_depth: int = 1) -> None:
        self.max_depth = max_depth

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        if trainer.is_global_zero and self.max_depth != 0:
            print(summary(module, self.max_depth), file=sys.stderr, flush=True)


def summary(module: torch.nn.Module, max_depth: int = 1) -> str:
    """The table; ``max_depth=-1``: every level."""
    rows = [
        (str(index), name, type(child).__name__, _count(sum(p.numel() for p in child.parameters())))
        for index, (name, child) in enumerate(
            (name, child)
            for name, child in module.named_modules()
            if name and (max_depth < 0 or name.count(".") < max_depth)
        )
    ]
    header = ("", "Name", "Type", "Params")
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(4)]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]  # fmt: skip
    rule = "-" * max(len(line) for line in lines)
    parameters = list(module.parameters())
    trainable = sum(p.numel() for p in parameters if p.requires_grad)
    total = sum(p.numel() for p in parameters)
    size = sum(p.numel() * p.element_size() for p in parameters) / 1e6
    totals = [
        f"{_count(trainable):<10}Trainable params",
        f"{_count(total - trainable):<10}Non-trainable params",
        f"{_count(total):<10}Total params",
        f"{size:<10.3f}Total estimated model params size (MB)",
    ]
    return "\n".join([lines[0], rule, *lines[1:], rule, *totals])


def _count(number: int) -> str:
    """``number`` as Lightning shows it: 1.2 K, 3.4 M, 5.6 B."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if number >= size:
            return f"{number / size:.1f} {unit}"
    return str(number)
