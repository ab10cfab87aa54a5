"""What the compatibility suite's scripts share that is no part of what they try: the mode the
harness runs them in (``--devices N``, ``--num-nodes N``, ``--accelerator cpu``, ``--root DIR``),
seeded data, and the one line of results the harness reads (``RESULT {json}``).

It imports neither Lightning nor GPUlayer: each script does, by its first line, and the harness
swaps that line alone (tests/test_lightning_compat.py).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

#: Samples a step sees, over every rank: a run of N ranks takes batches of BATCH / N each, so that
#: it steps on the same samples as one process does.
BATCH = 8


class Mode:
    """Where the script's Trainers run, from its command line."""

    def __init__(self) -> None:
        parser = argparse.ArgumentParser()
        parser.add_argument("--devices", type=int, default=1)
        parser.add_argument("--num-nodes", type=int, default=1)
        parser.add_argument("--accelerator", default="cpu")
        parser.add_argument("--root", type=Path, default=Path("runs"))
        given = parser.parse_args()
        self.devices: int = given.devices
        self.num_nodes: int = given.num_nodes
        self.accelerator: str = given.accelerator
        self.root: Path = given.root.absolute()

    @property
    def batch_size(self) -> int:
        """Each rank's batch: :data:`BATCH` split between the ranks."""
        return BATCH // (self.devices * self.num_nodes)

    def trainer(self, folder: str, **options: Any) -> dict[str, Any]:
        """A Trainer's keywords: this mode's, a run folder of its own under the root, ``options``."""
        where = {"accelerator": self.accelerator, "devices": self.devices, "num_nodes": self.num_nodes}
        return {**where, "default_root_dir": str(self.root / folder), **options}

    def loader(self, *tensors: torch.Tensor) -> DataLoader[Any]:
        """The tensors' rows in order (every framework and rank count sees the same batches)."""
        return DataLoader(TensorDataset(*tensors), batch_size=self.batch_size, shuffle=False)


def regression(samples: int, features: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` rows of a noisy linear target, the same for a seed on any machine."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator)
    weights = torch.linspace(-2.0, 2.0, features).unsqueeze(1)
    return x, x @ weights + 0.1 * torch.randn(samples, 1, generator=generator)


def norm(module: torch.nn.Module) -> float:
    """The norm of all of ``module``'s parameters together: what trained weights are compared by."""
    return float(torch.cat([p.detach().double().flatten() for p in module.parameters()]).norm())


def files(folder: Path) -> list[str]:
    """The files under ``folder``, relative to it, sorted."""
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


def column(table: Path, name: str) -> list[float]:
    """The values of a CSV file's column ``name``, in its rows' order, skipping empty cells."""
    with open(table, newline="") as file:
        return [float(row[name]) for row in csv.DictReader(file) if row.get(name)]


def columns(table: Path) -> list[str]:
    with open(table, newline="") as file:
        return sorted(next(csv.reader(file)))


def report(**numbers: Any) -> None:
    """The script's one line of results, last in its output."""
    print("RESULT " + json.dumps(numbers, sort_keys=True), flush=True)
