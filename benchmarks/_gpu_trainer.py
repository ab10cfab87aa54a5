"""The Trainer on a device beside a plain PyTorch loop on the same model, for validate_gpu.py.

The model, data and optimizer are trainer_overhead.py's (an MLP 32-256-256-1, 8,192 samples in
batches of 64: 128 steps an epoch, Adam), so the CPU figure and this one compare. Both sides move
each batch to the device as the Trainer does (``non_blocking``), run under the same autocast
(bfloat16 for ``bf16``, float16 with a gradient scaler for ``16-mixed``) and, with ``--compile``,
compile the model's forward (``module.compile()``, what ``Trainer(compile=True)`` does).

A step's time is wall-clock time, the device synchronized at each epoch's start and end, per step,
the median over the epochs after ``--warm`` (which hold the compilation and the first CUDA
kernels); the Trainer's epoch is timed by a callback at its ``on_train_epoch_start`` and ``_end``.

``--width`` and ``--batch`` size the hidden layers and the batch: at the defaults a step is mostly
Python and kernel launches on the host; at ``--width 8192 --batch 1024`` an fp32 step is GPU work,
which shows whether the Trainer lets the host run ahead of the GPU as a plain loop does.

    python benchmarks/_gpu_trainer.py --device cuda --precision bf16 [--compile] --out result.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from trainer_overhead import BATCH, SAMPLES, WIDTH, loader, network

import gpulayer as gl

AUTOCAST = {"32": None, "bf16": torch.bfloat16, "16-mixed": torch.float16}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Shape:
    """The hidden layers' width and the batch: trainer_overhead.py's by default, where a step is mostly
    Python and kernel launches; wider and larger, the GPU's work outweighs them."""

    width: int = WIDTH
    batch: int = BATCH

    @property
    def steps(self) -> int:
        return SAMPLES // self.batch


class Net(torch.nn.Module):
    """The network behind a forward of its own, as the Trainer's module has: ``nn.Module.compile()``
    of a bare ``Sequential`` compiles nothing (dynamo skips a call that is all torch.nn's code)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = network(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]


def plain(device: torch.device, precision: str, compile: bool, epochs: int, shape: Shape) -> dict[str, Any]:
    model = Net(shape.width).to(device)
    if compile:
        model.compile()
    data: DataLoader[Any] = loader(shape.batch)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    dtype = AUTOCAST[precision]
    scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" else None
    seconds, seen, total = [], "", torch.zeros((), device=device)
    for _epoch in range(epochs):
        synchronize(device)
        started = time.perf_counter()
        total = torch.zeros((), device=device)
        for inputs, targets in data:
            x, y = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
                out = model(x)
                loss = torch.nn.functional.mse_loss(out, y)
            seen = seen or str(out.dtype)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            total += loss.detach()
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    return {
        "epoch_seconds": seconds,
        "output_dtype": seen,
        "loss": float(total) / shape.steps,
        "param_device": str(next(model.parameters()).device),
    }


class Regression(gl.torch.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = network(width)
        self.output_dtype = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self(x)  # through forward, which is what compile=True compiles
        self.output_dtype = self.output_dtype or str(out.dtype)
        loss = torch.nn.functional.mse_loss(out, y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> gl.torch.Optimizers:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class EpochClock(gl.torch.Callback):
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: list[float] = []
        self._started = 0.0

    def on_train_epoch_start(self, trainer: gl.torch.Trainer, module: gl.torch.Module) -> None:
        synchronize(self.device)
        self._started = time.perf_counter()

    def on_train_epoch_end(self, trainer: gl.torch.Trainer, module: gl.torch.Module) -> None:
        synchronize(self.device)
        self.seconds.append(time.perf_counter() - self._started)


def trainer(device: torch.device, precision: str, compile: bool, epochs: int, shape: Shape) -> dict[str, Any]:
    module, clock = Regression(shape.width), EpochClock(device)
    with tempfile.TemporaryDirectory() as folder:
        metrics = gl.torch.Trainer(
            accelerator=device.type,
            precision=precision,
            compile=compile,
            max_epochs=epochs,
            callbacks=[clock],
            default_root_dir=Path(folder),
            enable_checkpointing=False,
            enable_progress_bar=False,
            resume=False,
            log_every_n_steps=10**6,
        ).fit(module, loader(shape.batch))
    return {
        "epoch_seconds": clock.seconds,
        "output_dtype": module.output_dtype,
        "loss": float(metrics.get("train_loss", math.nan)),
        "param_device": str(next(module.parameters()).device),
    }


def compiled_graphs() -> int | None:
    """How many graphs torch.compile has made in this process (a private counter: None where this
    PyTorch keeps it elsewhere)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except (ImportError, KeyError, TypeError):
        return None


def measured(run: Any, *args: Any) -> dict[str, Any]:
    """``run(*args)``'s result, with the graphs compiled during it."""
    before = compiled_graphs()
    side: dict[str, Any] = run(*args)
    after = compiled_graphs()
    side["compiled_graphs"] = None if before is None or after is None else after - before
    return side


SIDES = {"plain": plain, "trainer": trainer}


def step_ms(side: dict[str, Any], warm: int, shape: Shape) -> float:
    return 1000 * float(statistics.median(side["epoch_seconds"][warm:])) / shape.steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", choices=sorted(AUTOCAST), default="32")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--warm", type=int, default=2, help="epochs not timed")
    parser.add_argument("--epochs", type=int, default=4, help="epochs timed")
    parser.add_argument("--width", type=int, default=Shape.width, help=f"of the hidden layers ({WIDTH})")
    parser.add_argument("--batch", type=int, default=Shape.batch, help=f"samples a step ({BATCH})")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    shape = Shape(args.width, args.batch)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # as trainer_overhead.py measures the CPU
    total = args.warm + args.epochs
    sides = {
        name: measured(run, device, args.precision, args.compile, total, shape) for name, run in SIDES.items()
    }
    for side in sides.values():
        side["step_ms"] = step_ms(side, args.warm, shape)
    result = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "precision": args.precision,
        "compile": args.compile,
        "width": shape.width,
        "batch": shape.batch,
        "steps_per_epoch": shape.steps,
        "epochs": {"warm": args.warm, "timed": args.epochs},
        **sides,
        "ratio": sides["trainer"]["step_ms"] / sides["plain"]["step_ms"],
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
