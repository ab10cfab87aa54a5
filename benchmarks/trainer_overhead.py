"""The Trainer's cost per training step, beside a hand-written PyTorch loop doing the same work.

The same MLP (32 -> 256 -> 256 -> 1), the same data (8,192 samples, batch 64, shuffled: 128 steps
an epoch), the same optimizer (Adam), on the CPU with one thread, in one process:

* plain: ``for x, y in loader: zero_grad; loss = mse(model(x), y); backward; step``, adding each
  detached loss to an epoch total (what logging the training loss does);
* trainer: ``gl.torch.Trainer(max_epochs=...)`` fitting a Module whose ``training_step`` computes
  the same loss and logs its epoch mean (``self.log("train_loss", loss, on_step=False,
  on_epoch=True)``: Lightning's default in ``training_step`` is per step), with checkpointing and the
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

Then, unless ``--no-ddp``, the same fit as 2 DDP ranks on the CPU (gloo, ``OMP_NUM_THREADS=1``
in every rank, the 8,192 samples split between the ranks: 64 steps of batch 64 per rank an
epoch), each side a process of its own started here:

* trainer: a script calling ``gl.torch.Trainer(devices=2, accelerator="cpu", ...)`` (no
  checkpoints or progress bar) with ``python script.py``: the Trainer spawns the two ranks;
* torchrun: ``python -m torch.distributed.run --nproc-per-node 2`` running a hand-written loop:
  ``DistributedDataParallel``, ``DistributedSampler`` (``set_epoch`` each epoch), Adam, each
  detached loss added to an epoch total that is all-reduced at the epoch's end.

Both scripts are written to a temporary folder (the model and data from this file's source) and
import nothing else of this benchmark. A step's time is rank 0's wall-clock time from the start
of the second epoch to the end of the fit (the first epoch is warm-up; the process start is not
counted), per optimizer step. The whole run's wall time, from launch to exit, is reported too,
and the parts of it outside the fit: from launch to the first epoch's start (interpreter,
imports, starting the ranks, joining the process group) and from the fit's end to the exit
(leaving the group, the ranks' exit, the Trainer bringing rank 0's outcome back). The two sides
interleave ``--ddp-repeats`` times, alternating which goes first; each figure is the median.

    python benchmarks/trainer_overhead.py [--epochs 6] [--repeats 7]
        [--ddp-epochs 6] [--ddp-repeats 4] [--no-ddp]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import median, save
from torch.utils.data import DataLoader, TensorDataset

import gpulayer as gl
from gpulayer.network import free_port

SAMPLES, BATCH, FEATURES, WIDTH = 8192, 64, 32, 256
WARM_EPOCHS = 2
RANKS = 2


def network(width: int = WIDTH) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    )  # fmt: skip


def loader(batch: int = BATCH) -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True)


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
        self.log("train_loss", loss, on_step=False, on_epoch=True)  # an epoch total, as the plain loop's
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


def interleaved(
    runners: dict[str, Callable[[int, Path], None]], epochs: int, repeats: int
) -> dict[str, list[float]]:
    """Each runner's :func:`step_time`, ``repeats`` times, the runners taking turns."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    with tempfile.TemporaryDirectory() as tmp:
        plain(1, Path(tmp))  # first-use costs (PyTorch's lazy imports) paid before any timing
        for _ in range(repeats):
            for name, run in runners.items():
                times[name].append(step_time(run, epochs, Path(tmp)))
    return times


# -- 2 DDP ranks: the Trainer's own ranks beside torchrun running a hand-written loop


def _prelude() -> str:
    """The scripts' common start: imports, the sizes, ``network`` and ``loader`` as defined above."""
    return (
        "from __future__ import annotations\n\n"
        "import json\nimport os\nimport sys\nimport time\nfrom typing import Any\n\n"
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
        f"SAMPLES, BATCH, FEATURES, WIDTH = {SAMPLES}, {BATCH}, {FEATURES}, {WIDTH}\n\n\n"
        + inspect.getsource(network)
        + "\n\n"
        + inspect.getsource(loader)
    )


# Each script's rank 0 writes {"epoch_starts": [wall time at each epoch's start], "end": ...} to
# the file named by its second argument; the first is the number of epochs.
DDP_PLAIN = """
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler


def main() -> None:
    epochs, out = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    dataset = loader().dataset
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    data = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    model = DistributedDataParallel(network())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    starts = []
    for epoch in range(epochs):
        starts.append(time.time())
        sampler.set_epoch(epoch)
        total = torch.zeros(())
        for x, y in data:
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.detach()
        dist.all_reduce(total)
    end = time.time()
    if dist.get_rank() == 0:
        with open(out, "w") as file:
            json.dump({"epoch_starts": starts, "end": end}, file)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as examples/distributed/ddp.py: gloo may abort in the interpreter's teardown
"""

DDP_TRAINER = """
import gpulayer as gl


{regression}

class Clock(gl.torch.Callback):
    # Wall time at each epoch's start and at the fit's end; rank 0's comes back with the fit.

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.end = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch_starts": self.starts, "end": self.end}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.starts, self.end = state["epoch_starts"], state["end"]

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        self.starts.append(time.time())

    def on_fit_end(self, trainer: Any, module: Any) -> None:
        self.end = time.time()


if __name__ == "__main__":
    epochs, out, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    clock = Clock()
    gl.torch.Trainer(
        devices={ranks},
        accelerator="cpu",
        max_epochs=epochs,
        default_root_dir=folder,
        enable_checkpointing=False,
        enable_progress_bar=False,
        resume=False,
        callbacks=[clock],
    ).fit(Regression(), loader())
    with open(out, "w") as file:
        json.dump(clock.state_dict(), file)
""".replace("{ranks}", str(RANKS))


def ddp_scripts(folder: Path) -> dict[str, Path]:
    scripts = {"trainer": folder / "ddp_trainer.py", "torchrun": folder / "ddp_plain.py"}
    # The same module the single-process part times, by its source.
    trainer = DDP_TRAINER.replace("{regression}", inspect.getsource(Regression))
    scripts["trainer"].write_text(_prelude() + trainer)
    scripts["torchrun"].write_text(_prelude() + DDP_PLAIN)
    return scripts


def ddp_run(side: str, script: Path, epochs: int, folder: Path) -> dict[str, float]:
    """One run of ``side``: seconds per step of the epochs after the first (rank 0's wall clock),
    seconds from launch to the first epoch's start and from the fit's end (rank 0) to the
    launched process's exit, and the whole run's wall time."""
    out = folder / f"{side}.json"
    out.unlink(missing_ok=True)
    if side == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS),
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                   str(script), str(epochs), str(out)]  # fmt: skip
    else:
        command = [sys.executable, str(script), str(epochs), str(out), str(folder / "runs")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread per rank, on both sides
    launched = time.time()
    done = subprocess.run(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600, check=False
    )
    finished = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"{side} failed ({done.returncode}):\n{done.stderr.decode()[-4000:]}")
    record = json.loads(out.read_text())
    starts = record["epoch_starts"]
    assert len(starts) == epochs, (side, starts)
    steps = (epochs - 1) * (SAMPLES // RANKS // BATCH)
    return {
        "per_step": (record["end"] - starts[1]) / steps,
        "to_first_epoch": starts[0] - launched,
        "fit_end_to_exit": finished - record["end"],
        "wall": finished - launched,
    }


def _rounded(run: dict[str, float]) -> dict[str, float]:
    """A run's figures as saved: microseconds per step, seconds for the rest."""
    return {key: round(v * 1e6, 1) if key == "per_step" else round(v, 3) for key, v in run.items()}


def ddp_compare(epochs: int, repeats: int) -> dict[str, object]:
    if epochs < 2:
        raise SystemExit("--ddp-epochs needs 2 or more: the first is warm-up")
    runs: dict[str, list[dict[str, float]]] = {"trainer": [], "torchrun": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        scripts = ddp_scripts(folder)
        for repeat in range(repeats):
            order = ["trainer", "torchrun"] if repeat % 2 == 0 else ["torchrun", "trainer"]
            for side in order:
                runs[side].append(ddp_run(side, scripts[side], epochs, folder))
    medians = {
        side: {key: median([run[key] for run in side_runs]) for key in side_runs[0]}
        for side, side_runs in runs.items()
    }
    best = {side: min(run["per_step"] for run in values) for side, values in runs.items()}
    ratio = medians["trainer"]["per_step"] / medians["torchrun"]["per_step"]
    wall_ratio = medians["trainer"]["wall"] / medians["torchrun"]["wall"]
    print(f"DDP, {RANKS} ranks (OMP_NUM_THREADS=1), {epochs - 1} timed epochs of "
          f"{SAMPLES // RANKS // BATCH} steps per rank, medians of {repeats}:")  # fmt: skip
    for side, values in medians.items():
        print(f"{side:>18}: {values['per_step'] * 1e6:8.1f} us/step (best {best[side] * 1e6:8.1f}); "
              f"launch to first epoch {values['to_first_epoch']:.2f} s, fit's end to exit "
              f"{values['fit_end_to_exit']:.2f} s, whole run {values['wall']:.2f} s")  # fmt: skip
    print(f"{'trainer/torchrun':>18}: {ratio:.3f}x per step, {wall_ratio:.3f}x whole run")
    return {
        "setup": {
            "ranks": RANKS,
            "backend": "gloo",
            "omp_num_threads": 1,
            "steps_per_epoch_per_rank": SAMPLES // RANKS // BATCH,
            "epochs": epochs,
            "epochs_timed": epochs - 1,
            "repeats": repeats,
            "clock": "wall time, rank 0, second epoch's start to the fit's end",
            "trainer": f'python script.py: gl.torch.Trainer(devices={RANKS}, accelerator="cpu"), '
            "no checkpoints or progress bar",
            "torchrun": f"python -m torch.distributed.run --nproc-per-node {RANKS} script.py: "
            "DistributedDataParallel, DistributedSampler, Adam",
        },
        "us_per_step": {side: round(values["per_step"] * 1e6, 1) for side, values in medians.items()},
        "best_us_per_step": {side: round(value * 1e6, 1) for side, value in best.items()},
        "ratio_trainer_to_torchrun": round(ratio, 3),
        "launch_to_first_epoch_s": {side: round(v["to_first_epoch"], 3) for side, v in medians.items()},
        "fit_end_to_exit_s": {side: round(v["fit_end_to_exit"], 3) for side, v in medians.items()},
        "wall_s": {side: round(v["wall"], 3) for side, v in medians.items()},
        "wall_ratio_trainer_to_torchrun": round(wall_ratio, 3),
        "runs": {side: [_rounded(run) for run in values] for side, values in runs.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ddp-epochs", type=int, default=6, help="per DDP run, the first one warm-up")
    parser.add_argument("--ddp-repeats", type=int, default=4)
    parser.add_argument("--no-ddp", action="store_true", help="skip the 2-rank DDP comparison")
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
    times = interleaved(runners, args.epochs, args.repeats)

    per_step = {name: median(values) for name, values in times.items()}
    best = {name: min(values) for name, values in times.items()}
    ratios = {name: per_step[name] / per_step["plain"] for name in per_step}
    best_ratios = {name: best[name] / best["plain"] for name in best}
    for name, value in per_step.items():
        print(f"{name:>18}: {value * 1e6:8.1f} us/step (median), {ratios[name]:.3f}x plain; "
              f"best run {best[name] * 1e6:8.1f} us/step, {best_ratios[name]:.3f}x")  # fmt: skip
    if lightning is not None:
        print(f"trainer against lightning: {per_step['trainer'] / per_step['lightning']:.3f}x its step time "
              f"(defaults: {per_step['trainer_defaults'] / per_step['lightning']:.3f}x)")  # fmt: skip
    else:
        print("lightning: not importable, not measured (pip install -r benchmarks/requirements.txt)")
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
    if lightning is not None:
        result["ratio_to_lightning"] = {
            name: round(per_step[name] / per_step["lightning"], 3) for name in ("trainer", "trainer_defaults")
        }
    if not args.no_ddp:
        result["ddp_2_ranks"] = ddp_compare(args.ddp_epochs, args.ddp_repeats)
    print(f"saved to {save('trainer_overhead', result)}")


if __name__ == "__main__":
    main()
