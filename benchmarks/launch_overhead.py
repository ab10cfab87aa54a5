"""The Runtime's cost per training step, beside the same hand-written PyTorch loop without it.

``trainer_overhead.py``'s model, data and optimizer (an MLP, 8,192 samples in batches of 64,
Adam), on the CPU with one thread, in one process, each a loop of
``zero_grad; loss = mse(model(x), y); backward; step`` adding each detached loss to an epoch total:

* plain: the loop as it is (``trainer_overhead.py``'s);
* runtime: the loop given a ``gl.torch.Runtime`` (what ``gl.torch.launch`` hands a function with
  one device): ``runtime.setup(model, optimizer)``, ``runtime.setup_dataloaders(loader)`` and
  ``runtime.backward(loss)``;
* fabric (only if ``lightning`` is importable): the same loop with Lightning Fabric's
  ``setup``, ``setup_dataloaders`` and ``backward``.

A step's time is measured as ``trainer_overhead.py`` measures it: the CPU time of a run of
``--epochs`` + 2 epochs less one of 2 epochs, per step between; the runs interleave ``--repeats``
times, and each figure is the median.

    python benchmarks/launch_overhead.py [--epochs 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import median, save
from trainer_overhead import BATCH, SAMPLES, interleaved, loader, network, plain

import gpulayer as gl


def runtime(epochs: int, _: Path) -> None:
    run = gl.torch.Runtime(accelerator="cpu")
    model = network()
    model, optimizer = run.setup(model, torch.optim.Adam(model.parameters(), lr=1e-3))
    _loop(model, optimizer, run.setup_dataloaders(loader()), run.backward, epochs)


def fabric_runner() -> Callable[[int, Path], None] | None:
    if importlib.util.find_spec("lightning") is None:
        return None
    from lightning.fabric import Fabric

    def run(epochs: int, _: Path) -> None:
        fabric = Fabric(accelerator="cpu", devices=1)
        model = network()
        model, optimizer = fabric.setup(model, torch.optim.Adam(model.parameters(), lr=1e-3))
        _loop(model, optimizer, fabric.setup_dataloaders(loader()), fabric.backward, epochs)

    return run


def _loop(
    model: Any, optimizer: Any, data: Any, backward: Callable[[torch.Tensor], None], epochs: int
) -> None:
    for _epoch in range(epochs):
        total = torch.zeros(())
        for x, y in data:
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            backward(loss)
            optimizer.step()
            total += loss.detach()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core's work, less at the mercy of whatever else this machine runs

    runners: dict[str, Callable[[int, Path], None]] = {"plain": plain, "runtime": runtime}
    fabric = fabric_runner()
    if fabric is not None:
        runners["fabric"] = fabric
    times = interleaved(runners, args.epochs, args.repeats)

    per_step = {name: median(values) for name, values in times.items()}
    ratios = {name: per_step[name] / per_step["plain"] for name in per_step}
    for name, value in per_step.items():
        print(f"{name:>8}: {value * 1e6:8.1f} us/step (median), {ratios[name]:.3f}x plain")
    print(f"fabric: {'measured' if fabric else 'not importable, not measured'}")
    result: dict[str, object] = {
        "setup": {
            "as": "trainer_overhead.py's model, data, optimizer and clock (process CPU time, 1 thread)",
            "steps": {"per_epoch": SAMPLES // BATCH, "epochs_timed": args.epochs, "repeats": args.repeats},
            "versions": {
                "torch": torch.__version__,
                "lightning": importlib.metadata.version("lightning") if fabric else None,
            },
        },
        "us_per_step": {name: round(value * 1e6, 1) for name, value in per_step.items()},
        "ratio_to_plain": {name: round(value, 3) for name, value in ratios.items()},
        "runs_us_per_step": {name: [round(v * 1e6, 1) for v in values] for name, values in times.items()},
    }
    print(f"saved to {save('launch_overhead', result)}")


if __name__ == "__main__":
    main()
