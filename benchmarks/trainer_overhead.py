"""The Trainer's cost per training step, beside a hand-written PyTorch loop doing the same work.

The same MLP (32 -> 256 -> 256 -> 1), the same data (8,192 samples, batch 64, shuffled: 128 steps
an epoch), the same optimizer (Adam), on the CPU with one thread, in one process:

* plain: ``for x, y in loader: zero_grad; loss = mse(model(x), y); backward; step``, adding each
  detached loss to an epoch total (what logging the training loss does);
* trainer: ``gl.torch.Trainer(max_epochs=...)`` fitting a Module whose ``training_step`` computes
  the same loss and logs it (``self.log("train_loss", loss)``), with checkpointing and the
  progress bar off; its per-epoch work (one metrics reduction, metrics.json and metrics.csv
  written) is included;
* trainer, defaults: the same with a ``last.ckpt`` saved after every epoch and the progress line;
* lightning (only if ``lightning`` is importable): ``L.Trainer`` with checkpointing, logger,
  progress bar and model summary off, ``self.log("train_loss", loss, on_epoch=True)``.

A step's time is the difference between a fit of ``--epochs`` + 2 epochs and one of 2 epochs,
divided by the steps between: what a fit costs once started. It is CPU time (this process's,
with one thread), not wall-clock time, so that other programs on this shared machine count less;
the files the Trainer writes at each epoch's end are not synced to disk, and cost CPU time only
(the defaults' checkpoint is synced: its wait is not counted). The runs interleave (plain,
trainer, ...) ``--repeats`` times; each figure is the median, and the best run is kept too.

    python benchmarks/trainer_overhead.py [--epochs 6] [--repeats 5]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import median, save
from torch.utils.data import DataLoader, TensorDataset

import gpulayer as gl

SAMPLES, BATCH, FEATURES = 8192, 64, 32
WARM_EPOCHS = 2


def network() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 1),
    )  # fmt: skip


def loader() -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=True)


def plain(epochs: int, _: Path) -> None:
    model, data = network(), loader()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _epoch in range(epochs):
        total = torch.zeros(())
        for x, y in data:
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.detach()


class Regression(gl.torch.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = network()

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> gl.torch.Optimizers:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def trainer(epochs: int, folder: Path) -> None:
    gl.torch.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        default_root_dir=folder / "lean",
        enable_checkpointing=False,
        enable_progress_bar=False,
        resume=False,
    ).fit(Regression(), loader())


def trainer_defaults(epochs: int, folder: Path) -> None:
    gl.torch.Trainer(
        accelerator="cpu", max_epochs=epochs, default_root_dir=folder / "defaults", resume=False
    ).fit(Regression(), loader())


def lightning_runner() -> Callable[[int, Path], None] | None:
    if importlib.util.find_spec("lightning") is None:
        return None
    import lightning as L  # its documented name

    class LightningRegression(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = network()

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    def run(epochs: int, folder: Path) -> None:
        L.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=epochs,
            default_root_dir=folder / "lightning",
            enable_checkpointing=False,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        ).fit(LightningRegression(), loader())

    return run


def step_time(run: Callable[[int, Path], None], epochs: int, folder: Path) -> float:
    """CPU seconds per step once a fit is under way: (fit of warm + epochs) - (fit of warm), per step."""
    started = time.process_time()
    run(WARM_EPOCHS, folder)
    warm = time.process_time() - started
    started = time.process_time()
    run(WARM_EPOCHS + epochs, folder)
    full = time.process_time() - started
    return (full - warm) / (epochs * SAMPLES // BATCH)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core's work, less at the mercy of whatever else this machine runs

    runners: dict[str, Callable[[int, Path], None]] = {
        "plain": plain,
        "trainer": trainer,
        "trainer_defaults": trainer_defaults,
    }
    lightning = lightning_runner()
    if lightning is not None:
        runners["lightning"] = lightning
    times: dict[str, list[float]] = {name: [] for name in runners}
    with tempfile.TemporaryDirectory() as tmp:
        plain(1, Path(tmp))  # first-use costs (PyTorch's lazy imports) paid before any timing
        for _ in range(args.repeats):
            for name, run in runners.items():
                times[name].append(step_time(run, args.epochs, Path(tmp)))

    per_step = {name: median(values) for name, values in times.items()}
    best = {name: min(values) for name, values in times.items()}
    ratios = {name: per_step[name] / per_step["plain"] for name in per_step}
    best_ratios = {name: best[name] / best["plain"] for name in best}
    for name, value in per_step.items():
        print(f"{name:>18}: {value * 1e6:8.1f} us/step (median), {ratios[name]:.3f}x plain; "
              f"best run {best[name] * 1e6:8.1f} us/step, {best_ratios[name]:.3f}x")  # fmt: skip
    print(f"lightning: {'measured' if lightning else 'not importable, not measured'}")
    result: dict[str, object] = {
        "setup": {
            "model": f"MLP {FEATURES}-256-256-1, Adam",
            "samples": SAMPLES,
            "batch": BATCH,
            "steps_per_epoch": SAMPLES // BATCH,
            "epochs_timed": args.epochs,
            "repeats": args.repeats,
            "threads": 1,
            "clock": "process CPU time",
            "torch": torch.__version__,
            "lightning": importlib.metadata.version("lightning") if lightning else None,
        },
        "us_per_step": {name: round(value * 1e6, 1) for name, value in per_step.items()},
        "ratio_to_plain": {name: round(value, 3) for name, value in ratios.items()},
        "best_us_per_step": {name: round(value * 1e6, 1) for name, value in best.items()},
        "best_ratio_to_plain": {name: round(value, 3) for name, value in best_ratios.items()},
        "runs_us_per_step": {name: [round(v * 1e6, 1) for v in values] for name, values in times.items()},
    }
    print(f"saved to {save('trainer_overhead', result)}")


if __name__ == "__main__":
    main()
