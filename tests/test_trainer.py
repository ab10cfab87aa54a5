"""gl.torch.Trainer on the CPU with tiny models: in this process, as two gloo ranks it starts, as
ranks a launcher started, and across a SIGKILL and a rerun."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer as gl
from gpulayer.network import free_port
from tests.conftest import Workers, kill_machine, wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "trainer_regression" / "train.py"
#: How long a test waits for a subprocess to reach a point before failing.
WAIT = 120.0


class Regression(gl.torch.Module):
    """A linear regression; with ``dropout``, a random one (to check RNG state across a resume)."""

    def __init__(
        self, lr: float = 0.1, momentum: float = 0.0, dropout: float = 0.0, step_size: int = 0
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Dropout(dropout), torch.nn.Linear(4, 1))
        self.lr, self.momentum, self.step_size = lr, momentum, step_size
        self.autocast_dtypes: set[torch.dtype] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self(x)
        self.autocast_dtypes.add(out.dtype)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.forward(batch[0])

    def configure_optimizers(self) -> gl.torch.Optimizers:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)
        if not self.step_size:
            return optimizer
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=self.step_size, gamma=0.5)


class EpochsPerRank(gl.torch.Callback):
    """Writes the epochs each rank trained to ``<folder>/rank<r>.json``; with ``stop_on``, asks
    to stop on that rank only, at the end of that epoch."""

    def __init__(self, folder: Path, stop_on: tuple[int, int] | None = None) -> None:
        self.folder, self.stop_on = folder, stop_on
        self.epochs: list[int] = []

    def on_train_epoch_end(self, trainer: gl.torch.Trainer, module: gl.torch.Module) -> None:
        self.epochs.append(trainer.current_epoch)
        if self.stop_on == (trainer.global_rank, trainer.current_epoch):
            trainer.should_stop = True

    def on_fit_end(self, trainer: gl.torch.Trainer, module: gl.torch.Module) -> None:
        (self.folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.epochs))


def regression_data(samples: int = 64, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, 4, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.05 * torch.randn(samples, 1, generator=generator)
    return TensorDataset(x, y)


def loader(batch_size: int = 8, samples: int = 64, seed: int = 0, shuffle: bool = False) -> DataLoader[Any]:
    return DataLoader(regression_data(samples, seed), batch_size=batch_size, shuffle=shuffle)


def trainer(root: Path, **options: Any) -> gl.torch.Trainer:
    options = {"accelerator": "cpu", "enable_progress_bar": False, "default_root_dir": root, **options}
    return gl.torch.Trainer(**options)


def weights(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([parameter.detach().flatten() for parameter in module.parameters()])


def epoch_rows(root: Path) -> list[dict[str, Any]]:
    """The rows of metrics.json written at an epoch's end (those with a training loss)."""
    rows: list[dict[str, Any]] = json.loads((root / "metrics.json").read_text())
    return [row for row in rows if "train_loss" in row]


# -- the package


def test_import_gpulayer_loads_no_torch_until_gl_torch_is_used() -> None:
    code = (
        "import sys, gpulayer as gl\n"
        "assert 'torch' not in sys.modules, 'import gpulayer imported torch'\n"
        "assert gl.torch.Trainer is gl.torch.trainer.Trainer\n"
        "assert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=WAIT)


def test_without_pytorch_gl_torch_says_how_to_install_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if it were not installed\n"
        "import gpulayer as gl\n"
        "try:\n"
        "    gl.torch\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=WAIT
    )
    assert done.stdout.strip() == "gpulayer.torch needs PyTorch: pip install 'gpulayer[torch]'"


def test_gl_torch_exports_a_sorted_all_of_names_that_exist() -> None:
    assert gl.torch.__all__ == sorted(gl.torch.__all__)
    assert [name for name in gl.torch.__all__ if not hasattr(gl.torch, name)] == []


# -- in this process


def test_fit_validate_test_and_predict_in_this_process(tmp_path: Path) -> None:
    model = Regression()
    run = trainer(tmp_path, max_epochs=4)
    final = run.fit(model, loader(shuffle=True), loader(seed=1))

    rows = epoch_rows(tmp_path)
    assert [row["epoch"] for row in rows] == [0, 1, 2, 3]
    assert [row["step"] for row in rows] == [8, 16, 24, 32]
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] / 4
    assert final["val_loss"] == rows[-1]["val_loss"]
    assert (run.current_epoch, run.global_step) == (4, 32)

    with open(tmp_path / "metrics.csv") as file:
        table = list(csv.DictReader(file))
    assert [float(row["val_loss"]) for row in table] == pytest.approx([row["val_loss"] for row in rows])

    # validate: the mean over every sample, whatever the batch sizes (10 + 10 + 10 + 2).
    val = regression_data(32, seed=1)
    with torch.no_grad():
        expected = torch.nn.functional.mse_loss(model(val.tensors[0]), val.tensors[1]).item()
    [validated] = run.validate(model, DataLoader(val, batch_size=10))
    assert validated["val_loss"] == pytest.approx(expected, rel=1e-5)

    [tested] = run.test(model, loader(seed=2))
    assert set(tested) == {"test_loss"}
    assert json.loads((tmp_path / "metrics.json").read_text())[-1]["test_loss"] == tested["test_loss"]

    data = regression_data(20, seed=3)
    predictions = run.predict(model, DataLoader(data, batch_size=6))
    assert [len(batch) for batch in predictions] == [6, 6, 6, 2]
    with torch.no_grad():
        assert torch.allclose(torch.cat(predictions), model(data.tensors[0]))


def test_gradient_accumulation_of_two_batches_equals_one_batch_twice_as_large(tmp_path: Path) -> None:
    accumulated, whole = Regression(), Regression()
    trainer(tmp_path / "a", max_epochs=3, accumulate_grad_batches=2).fit(accumulated, loader(batch_size=4))
    trainer(tmp_path / "b", max_epochs=3).fit(whole, loader(batch_size=8))
    assert torch.allclose(weights(accumulated), weights(whole), atol=1e-6)


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16), ("16-mixed", torch.float16)])
def test_mixed_precision_runs_steps_under_autocast_on_the_cpu(
    tmp_path: Path, precision: str, dtype: torch.dtype
) -> None:
    if not torch.amp.is_autocast_available("cpu"):
        pytest.skip("this PyTorch has no CPU autocast")
    model = Regression()
    trainer(tmp_path, max_epochs=3, precision=precision).fit(model, loader(shuffle=True), loader(seed=1))
    assert model.autocast_dtypes == {dtype}
    assert next(model.parameters()).dtype == torch.float32
    rows = epoch_rows(tmp_path)
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] / 2


def test_gradients_clipped_by_value_bound_every_step(tmp_path: Path) -> None:
    model = Regression()
    before = weights(model)
    trainer(tmp_path, max_epochs=1, gradient_clip_val=0.01, gradient_clip_algorithm="value").fit(
        model, loader()
    )
    moved = (weights(model) - before).abs()
    assert moved.max() <= 8 * 0.1 * 0.01 + 1e-7  # 8 steps of at most lr x 0.01 each
    assert moved.max() > 8 * 0.1 * 0.01 * 0.9  # and the gradients were larger: they were clipped


def test_validation_runs_where_its_interval_and_epoch_cadence_say(tmp_path: Path) -> None:
    run = trainer(tmp_path, max_epochs=4, val_check_interval=0.5, check_val_every_n_epoch=2)
    run.fit(Regression(), loader(), loader(seed=1))
    rows = json.loads((tmp_path / "metrics.json").read_text())
    validated = [(row["epoch"], row["step"]) for row in rows if "val_loss" in row]
    # Half-way through every epoch; at the end of every second one, in that epoch's row.
    assert validated == [(0, 4), (1, 12), (1, 16), (2, 20), (3, 28), (3, 32)]
    assert [("val_loss" in row) for row in epoch_rows(tmp_path)] == [False, True, False, True]


def test_save_top_k_keeps_exactly_the_k_best_checkpoints(tmp_path: Path) -> None:
    keep = gl.torch.ModelCheckpoint(monitor="val_loss", save_top_k=2, filename="{epoch}")
    # A high learning rate makes the validation loss go up and down, so the best are not the last.
    trainer(tmp_path, max_epochs=6, callbacks=[keep]).fit(Regression(lr=0.45), loader(), loader(seed=1))
    losses = {row["epoch"]: row["val_loss"] for row in epoch_rows(tmp_path)}
    best_two = sorted(losses, key=losses.__getitem__)[:2]
    saved = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert saved == sorted([f"{epoch}.ckpt" for epoch in best_two] + ["last.ckpt"])
    assert keep.best_model_path == str(tmp_path / "checkpoints" / f"{best_two[0]}.ckpt")
    assert keep.best_model_score == losses[best_two[0]]


def test_checkpoints_every_n_steps_record_where_in_the_epoch_they_were_taken(tmp_path: Path) -> None:
    every = gl.torch.ModelCheckpoint(
        filename="{step}", save_top_k=-1, every_n_epochs=None, every_n_train_steps=5
    )
    trainer(tmp_path, max_steps=12, callbacks=[every]).fit(Regression(), loader())  # 8 steps an epoch
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == [
        "10.ckpt",
        "5.ckpt",
        "last.ckpt",
    ]
    positions = {}
    for name in ("5", "10", "last"):
        saved = torch.load(tmp_path / "checkpoints" / f"{name}.ckpt", weights_only=True)
        positions[name] = (saved["epoch"], saved["batch"], saved["global_step"])
    assert positions == {"5": (0, 5, 5), "10": (1, 2, 10), "last": (1, 4, 12)}


def test_early_stopping_ends_the_fit_once_the_metric_stops_improving(tmp_path: Path) -> None:
    stop = gl.torch.EarlyStopping("val_loss", patience=2)
    run = trainer(tmp_path, max_epochs=20, callbacks=[stop])
    run.fit(Regression(lr=0.0), loader(), loader(seed=1))  # nothing learns: no epoch beats the first
    assert (stop.stopped_epoch, run.current_epoch) == (2, 3)
    assert len(epoch_rows(tmp_path)) == 3


def test_the_learning_rate_monitor_records_each_epochs_rate(tmp_path: Path) -> None:
    callbacks = [gl.torch.LearningRateMonitor()]
    trainer(tmp_path, max_epochs=3, callbacks=callbacks).fit(Regression(step_size=1), loader())
    assert [row["lr-SGD"] for row in epoch_rows(tmp_path)] == [0.1, 0.05, 0.025]


def test_a_fit_stopped_part_way_through_an_epoch_resumes_to_the_same_weights(tmp_path: Path) -> None:
    """Shuffled data, dropout, momentum and a scheduler: a resumed fit only matches one that ran
    straight through if it restored the batch order, the RNG, the optimizer and the scheduler."""
    options: dict[str, Any] = {"lr": 0.05, "momentum": 0.9, "dropout": 0.2, "step_size": 2}
    straight, cut, resumed = Regression(**options), Regression(**options), Regression(**options)
    torch.manual_seed(7)
    trainer(tmp_path / "straight", max_epochs=4).fit(straight, loader(shuffle=True), loader(seed=1))

    torch.manual_seed(7)
    trainer(tmp_path / "cut", max_steps=13).fit(cut, loader(shuffle=True), loader(seed=1))
    run = trainer(tmp_path / "cut", max_epochs=4)
    run.fit(resumed, loader(shuffle=True), loader(seed=1))

    assert run.resumed_from == tmp_path / "cut" / "checkpoints" / "last.ckpt"
    assert (run.current_epoch, run.global_step) == (4, 32)
    assert torch.equal(weights(resumed), weights(straight))
    # The epoch that was cut has a row for its first part (with a validation) and one at its end.
    assert [row["epoch"] for row in epoch_rows(tmp_path / "cut")] == [0, 1, 1, 2, 3]


def test_resume_false_starts_afresh_in_a_folder_with_a_checkpoint(tmp_path: Path) -> None:
    trainer(tmp_path, max_epochs=2).fit(Regression(), loader())
    run = trainer(tmp_path, max_epochs=1, resume=False)
    run.fit(Regression(), loader())
    assert (run.resumed_from, run.current_epoch) == (None, 1)
    assert [row["epoch"] for row in epoch_rows(tmp_path)] == [0]


# -- ranks on this machine


def test_two_ranks_reach_the_loss_one_process_reaches_on_the_same_data(tmp_path: Path) -> None:
    """Two ranks of batch 4 see, at each step, the same 8 samples as one process of batch 8."""
    one, two = Regression(), Regression()
    alone = trainer(tmp_path / "one", max_epochs=3).fit(one, loader(batch_size=8), loader(seed=1, samples=30))
    run = trainer(tmp_path / "two", max_epochs=3, devices=2)
    ranked = run.fit(two, loader(batch_size=4), loader(seed=1, samples=30))

    assert ranked["val_loss"] == pytest.approx(alone["val_loss"], rel=1e-5)
    assert ranked["train_loss"] == pytest.approx(alone["train_loss"], rel=1e-5)
    assert torch.allclose(weights(two), weights(one), atol=1e-6)  # rank 0's weights came back
    assert (run.current_epoch, run.global_step) == (3, 24)
    # Rank 0 wrote the run's files, and nothing else did.
    files = sorted(str(path.relative_to(tmp_path / "two")) for path in (tmp_path / "two").rglob("*"))
    assert files == [
        "checkpoints",
        "checkpoints/epoch=2-step=24.ckpt",
        "checkpoints/last.ckpt",
        "metrics.csv",
        "metrics.json",
    ]


def test_num_nodes_runs_the_fit_as_a_gang_job_and_brings_its_run_folder_back(
    client: gl.Client, workers: Workers, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two workers, one rank each: the same loss as two local ranks, rank 0's weights and its run
    folder here, the job's parts on both workers."""
    workers.start("node-a", 1)
    workers.start("node-b", 1)
    local, gang = Regression(), Regression()
    here = trainer(tmp_path / "local", max_epochs=2, devices=2).fit(
        local, loader(batch_size=4), loader(seed=1)
    )
    run = trainer(
        tmp_path / "gang", max_epochs=2, num_nodes=2, job_options={"client": client, "source": ROOT}
    )
    there = run.fit(gang, loader(batch_size=4), loader(seed=1))

    assert there["val_loss"] == pytest.approx(here["val_loss"], rel=1e-5)
    assert torch.allclose(weights(gang), weights(local), atol=1e-6)
    assert (run.current_epoch, run.global_step) == (2, 16)
    files = sorted(str(path.relative_to(tmp_path / "gang")) for path in (tmp_path / "gang").rglob("*"))
    assert files == [
        "checkpoints",
        "checkpoints/epoch=1-step=16.ckpt",
        "checkpoints/last.ckpt",
        "metrics.csv",
        "metrics.json",
    ]
    assert len(epoch_rows(tmp_path / "gang")) == 2
    (job,) = client.jobs()
    assert job.state is gl.JobState.SUCCEEDED
    assert sorted(part.worker for part in job.parts) == ["node-a", "node-b"]
    # The caller hears of the job at once, not only when it ends.
    assert (
        f"gpulayer: the Trainer's 2 x 1 ranks run as job {job.id} (`gpulayer logs -f {job.id}` follows them)"
        in capsys.readouterr().err.splitlines()
    )


def test_early_stopping_stops_every_rank_after_the_same_epoch(tmp_path: Path) -> None:
    stop = gl.torch.EarlyStopping("val_loss", patience=2)
    run = trainer(tmp_path, max_epochs=20, devices=2, callbacks=[stop, EpochsPerRank(tmp_path)])
    run.fit(Regression(lr=0.0), loader(), loader(seed=1))
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks == [[0, 1, 2], [0, 1, 2]]
    assert (stop.stopped_epoch, run.current_epoch) == (2, 3)  # its state came back from rank 0


def test_a_stop_asked_by_one_rank_stops_every_rank_after_that_epoch(tmp_path: Path) -> None:
    callbacks = [EpochsPerRank(tmp_path, stop_on=(1, 1))]
    trainer(tmp_path, max_epochs=20, devices=2, callbacks=callbacks).fit(Regression(), loader())
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks == [[0, 1], [0, 1]]


def test_two_ranks_predict_in_the_datasets_order(tmp_path: Path) -> None:
    model = Regression()
    data = regression_data(21, seed=3)  # odd: the ranks' shares differ by one
    predictions = trainer(tmp_path, devices=2).predict(model, DataLoader(data, batch_size=4))
    with torch.no_grad():
        assert torch.allclose(torch.cat(predictions), model(data.tensors[0]))


# -- the example, as a program


def example(root: Path, *args: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--accelerator", "cpu", "--root", str(root), *args]


def run_until_epochs(root: Path, epochs: int) -> subprocess.Popen[str]:
    """The example, with room for many more epochs, once its metrics.json shows ``epochs`` done."""
    command = example(root, "--max-epochs", "100000", "--samples", "4096", "--patience", "1000")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if len(epoch_rows(root)) >= epochs:  # the file always parses: never half-written
                return process
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    process.kill()
    raise AssertionError(f"the example did not reach {epochs} epochs: {process.communicate()[1][-2000:]}")


def kill(process: subprocess.Popen[str]) -> None:
    assert process.poll() is None, "it ended before it was killed"
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=WAIT)


def test_a_killed_run_keeps_its_metrics_and_a_rerun_continues_from_its_last_checkpoint(
    tmp_path: Path,
) -> None:
    kill(run_until_epochs(tmp_path, 3))
    rows = epoch_rows(tmp_path)
    assert len(rows) >= 3
    assert [row["epoch"] for row in rows] == list(range(len(rows)))
    with open(tmp_path / "metrics.csv") as file:
        table = list(csv.DictReader(file))
    assert [int(row["epoch"]) for row in table if row["train_loss"]] == [row["epoch"] for row in rows]
    assert [float(row["val_loss"]) for row in table] == pytest.approx([row["val_loss"] for row in rows])

    last = tmp_path / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    done = saved["epoch"]  # epochs finished when it was saved
    assert done >= 3

    again = example(tmp_path, "--max-epochs", str(done + 2), "--samples", "4096", "--patience", "1000")
    finished = subprocess.run(again, capture_output=True, text=True, check=True, timeout=WAIT)
    summary = json.loads(finished.stdout.splitlines()[-1])
    assert summary["resumed_from"] == str(last)
    assert (summary["epochs"], summary["steps"]) == (done + 2, (done + 2) * 128)
    assert f"resumed from {last} at epoch {done + 1}" in finished.stderr
    rows = epoch_rows(tmp_path)
    assert [row["epoch"] for row in rows] == list(range(done + 2))
    assert rows[:done] == saved["metrics"][:done]


def test_ranks_a_launcher_started_join_its_process_group(tmp_path: Path) -> None:
    """As torchrun and GPUlayer's gang jobs start them: every rank runs the script, with RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; the Trainer joins rather than start ranks."""
    port = str(free_port())
    ranks = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "OMP_NUM_THREADS": "1"}  # fmt: skip
        command = example(tmp_path, "--devices", "2", "--max-epochs", "3")
        ranks.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    outputs = [process.communicate(timeout=WAIT) for process in ranks]
    assert [process.returncode for process in ranks] == [0, 0], outputs
    summary = json.loads(outputs[0][0].splitlines()[-1])
    assert outputs[1][0] == ""  # only rank 0 reports
    assert (summary["epochs"], summary["steps"], summary["predictions"]) == (3, 24, 128)
    assert [row["epoch"] for row in epoch_rows(tmp_path)] == [0, 1, 2]


# -- as a GPUlayer job whose worker dies

FAST = ("--lease-ttl", "1.5", "--heartbeat", "0.3")


def test_a_job_whose_worker_dies_mid_fit_resumes_on_another_worker_from_its_kept_checkpoint(
    client: gl.Client, workers: Workers, env: dict[str, str]
) -> None:
    """The example as a command job: its run folder is the job's checkpoint folder, kept in Redis
    as it changes; the worker is killed mid-fit, and the retry, on another worker, starts from it."""
    workers.env = {**env, "GPULAYER_CHECKPOINT_INTERVAL": "0.2"}
    doomed = workers.start("doomed", 1, "--label", "pool=fit", *FAST)
    # The run folder is the checkpoint folder; its metrics file comes home as an output.
    train = "python3 train.py --accelerator cpu --max-epochs 20 --samples 4096 --patience 1000"
    job = client.submit(
        ["sh", "-c", f'{train} && cp "$GPULAYER_CHECKPOINT_DIR/metrics.json" .'],
        source=EXAMPLE.parent,
        env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        labels={"pool": "fit"},
        retries=1,
        outputs=["metrics.json"],
    )
    kept = client.keys.checkpoint(job.id)
    wait_for(lambda: client.redis.exists(kept), timeout=WAIT, what="a kept checkpoint")
    assert job.status().state is gl.JobState.RUNNING
    kill_machine(doomed.pid)
    workers.start("spare", 1, "--label", "pool=fit", *FAST)

    record = job.wait(WAIT)
    lines = [(line.attempt, line.stream, line.text) for line in job.logs()]
    assert record.state is gl.JobState.SUCCEEDED, lines[-20:]
    assert [(a.attempt, a.worker, a.outcome) for a in record.attempts] == [
        (1, "doomed", "lost"),
        (2, "spare", "succeeded"),
    ]
    assert any(
        attempt == 2 and stream == "system" and text.startswith("restored the checkpoint folder")
        for attempt, stream, text in lines
    )
    summary = json.loads(next(text for attempt, stream, text in reversed(lines) if text.startswith("{")))
    assert summary["resumed_from"].endswith("last.ckpt")
    assert summary["epochs"] == 20
    # One row per epoch, 0 to 19: the retry went on from the first attempt's epochs, not from 0.
    job.download_outputs(Path(env["GPULAYER_HOME"]) / "out")
    rows = epoch_rows(Path(env["GPULAYER_HOME"]) / "out")
    assert [row["epoch"] for row in rows] == list(range(20))
    assert not client.redis.exists(kept)  # gone with the job's end


def test_a_remote_fit_whose_worker_dies_resumes_on_another_worker(
    client: gl.Client, workers: Workers, env: dict[str, str], home: Path, tmp_path: Path
) -> None:
    """remote=True: rank 0's run folder is its part's checkpoint folder, kept in Redis; the retry,
    on another worker, resumes from it, and the caller gets the whole run back."""
    workers.env = {**env, "GPULAYER_CHECKPOINT_INTERVAL": "0.2"}
    doomed = workers.start("doomed", 1, "--label", "pool=remote", *FAST)
    options = {"client": client, "source": ROOT, "labels": {"pool": "remote"}, "retries": 1}
    run = trainer(tmp_path / "run", max_epochs=12, remote=True, job_options=options)
    model = Regression()
    outcome: dict[str, Any] = {}
    fitting = threading.Thread(target=lambda: outcome.update(run.fit(model, loader(samples=2048))))
    fitting.start()
    wait_for(client.jobs, what="the job")
    kept = client.keys.checkpoint(client.jobs()[0].id)
    wait_for(lambda: client.redis.exists(kept), timeout=WAIT, what="a kept checkpoint")
    kill_machine(doomed.pid)
    workers.start("spare", 1, "--label", "pool=remote", *FAST)
    fitting.join(WAIT)

    assert not fitting.is_alive()
    assert "train_loss" in outcome
    assert run.resumed_from is not None  # rank 0 on the spare worker went on from the kept run
    assert run.current_epoch == 12
    assert [row["epoch"] for row in epoch_rows(tmp_path / "run")] == list(range(12))
    (record,) = client.jobs()
    assert [(a.worker, a.outcome) for a in record.attempts] == [("doomed", "lost"), ("spare", "succeeded")]
