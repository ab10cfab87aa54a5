"""The Trainer's Lightning options: ``limit_*_batches``, ``fast_dev_run``, ``num_sanity_val_steps``,
``logger`` (the default files, none, CSV, TensorBoard, your own), ``enable_model_summary``,
``strategy``, ``devices="auto"`` and ``accelerator="gpu"``."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch.utils.data import DataLoader, IterableDataset

import gpulayer as gl
from gpulayer.torch import loggers
from gpulayer.torch.summary import summary
from tests.test_trainer import Regression, loader, trainer, weights


class Counts(gl.torch.Callback):
    """Counts the batches of each stage, and what the sanity check saw."""

    def __init__(self) -> None:
        self.batches: dict[str, int] = {}
        self.sanity: list[tuple[str, bool]] = []

    def count(self, stage: str) -> None:
        self.batches[stage] = self.batches.get(stage, 0) + 1

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.count("train")

    def on_validation_batch_end(
        self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.count("sanity" if trainer.sanity_checking else "val")

    def on_test_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.count("test")

    def on_predict_batch_end(
        self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.count("predict")

    def on_sanity_check_start(self, trainer: Any, module: Any) -> None:
        self.sanity.append(("start", trainer.sanity_checking))

    def on_sanity_check_end(self, trainer: Any, module: Any) -> None:
        self.sanity.append(("end", "val_loss" in trainer.callback_metrics))

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self.sanity.append(("train", "val_loss" in trainer.callback_metrics))


# -- limit_*_batches


def test_limits_cap_each_stages_batches_by_count_or_fraction(tmp_path: Path) -> None:
    counts = Counts()
    run = trainer(
        tmp_path, max_epochs=2, limit_train_batches=3, limit_val_batches=0.5, limit_test_batches=2,
        limit_predict_batches=0.25, callbacks=[counts],
    )  # fmt: skip
    run.fit(Regression(), loader(), loader(seed=1))  # 8 batches each
    assert (run.global_step, run.num_training_batches) == (6, 3)
    assert counts.batches == {"sanity": 2, "train": 6, "val": 8}
    run.test(dataloaders=loader())
    assert len(run.predict(dataloaders=loader())) == 2
    assert (counts.batches["test"], counts.batches["predict"]) == (2, 2)


def test_a_limit_of_zero_skips_its_stage(tmp_path: Path) -> None:
    counts = Counts()
    run = trainer(tmp_path, max_epochs=2, limit_val_batches=0, limit_test_batches=0.0, callbacks=[counts])
    run.fit(Regression(), loader(), loader(seed=1))
    assert counts.batches == {"train": 16}
    assert "val_loss" not in run.callback_metrics
    assert run.test(dataloaders=loader()) == []

    untrained = Regression()
    before = weights(untrained)
    run = trainer(tmp_path / "none", max_epochs=2, limit_train_batches=0)
    run.fit(untrained, loader(), loader(seed=1))
    assert run.global_step == 0
    assert torch.equal(weights(untrained), before)


def test_the_limited_epoch_ends_an_accumulation_and_places_validation_by_its_length(tmp_path: Path) -> None:
    run = trainer(
        tmp_path, max_epochs=2, limit_train_batches=5, accumulate_grad_batches=2, val_check_interval=0.5
    )
    run.fit(Regression(), loader(), loader(seed=1))
    assert run.global_step == 6  # 2 + 2 + the epoch's last batch alone, twice
    rows = json.loads((tmp_path / "metrics.json").read_text())
    # Every 2 batches (half of 5, rounded down), and at each epoch's end.
    validated = [(row["epoch"], row["step"]) for row in rows if "val_loss" in row]
    assert validated == [(0, 1), (0, 2), (0, 3), (1, 4), (1, 5), (1, 6)]


def test_a_limited_fit_stopped_part_way_resumes_to_the_same_weights(tmp_path: Path) -> None:
    options: dict[str, Any] = {"lr": 0.05, "momentum": 0.9, "dropout": 0.2}
    straight, cut, resumed = Regression(**options), Regression(**options), Regression(**options)
    torch.manual_seed(7)
    trainer(tmp_path / "straight", max_epochs=3, limit_train_batches=5).fit(straight, loader(shuffle=True))
    torch.manual_seed(7)
    trainer(tmp_path / "cut", max_steps=7, limit_train_batches=5).fit(cut, loader(shuffle=True))
    run = trainer(tmp_path / "cut", max_epochs=3, limit_train_batches=5)
    run.fit(resumed, loader(shuffle=True))
    assert run.resumed_from is not None
    assert (run.current_epoch, run.global_step) == (3, 15)
    assert torch.equal(weights(resumed), weights(straight))


class Endless(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    def __iter__(self) -> Any:
        while True:
            x = torch.randn(4)
            yield x, x.sum(dim=0, keepdim=True)


def test_a_loader_without_a_length_takes_a_count_and_refuses_a_fraction(tmp_path: Path) -> None:
    endless = DataLoader(Endless(), batch_size=4)
    run = trainer(tmp_path, max_epochs=2, limit_train_batches=3)
    run.fit(Regression(), endless)
    assert run.global_step == 6
    with pytest.raises(ValueError, match=r"limit_train_batches=0.5: a fraction needs a loader with a length"):
        trainer(tmp_path, max_epochs=1, limit_train_batches=0.5, resume=False).fit(Regression(), endless)
    with pytest.raises(ValueError, match=r"limit_val_batches=0.01 of 8 batches is none; give at least 0.125"):
        trainer(tmp_path, max_epochs=1, limit_val_batches=0.01).validate(Regression(), loader())
    with pytest.raises(ValueError, match=r"limit_test_batches must be an int of at least 0 or a float"):
        trainer(tmp_path, limit_test_batches=1.5)


class Unused(Regression):
    """A parameter no step uses: DDP needs find_unused_parameters for it."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = torch.nn.Linear(1, 1)


def test_two_ranks_run_the_limited_batches_one_process_runs(tmp_path: Path) -> None:
    """Two ranks of batch 4 see, at each step, the samples one process of batch 8 sees."""
    options: dict[str, Any] = {"max_epochs": 2, "limit_train_batches": 3, "accumulate_grad_batches": 2}
    one, two = Unused(), Unused()
    trainer(tmp_path / "one", **options).fit(one, loader(batch_size=8))
    run = trainer(tmp_path / "two", devices=2, strategy="ddp_find_unused_parameters_true", **options)
    run.fit(two, loader(batch_size=4))
    assert run.global_step == 4
    assert torch.allclose(weights(two), weights(one), atol=1e-6)


# -- fast_dev_run


def test_fast_dev_run_runs_one_batch_of_each_stage_and_writes_nothing(tmp_path: Path) -> None:
    trainer(tmp_path, max_epochs=1).fit(Regression(), loader())  # a last.ckpt it must not resume from
    before = sorted(tmp_path.rglob("*"))
    counts = Counts()
    stop = gl.torch.EarlyStopping("val_loss", patience=0)
    run = trainer(tmp_path, max_epochs=5, fast_dev_run=True, callbacks=[counts, stop])
    run.fit(Regression(), loader(), loader(seed=1))
    assert (run.current_epoch, run.global_step, run.resumed_from) == (1, 1, None)
    assert run.fast_dev_run is True
    assert run.logger is None
    assert stop.best is None
    assert run.test(dataloaders=loader())[0].keys() == {"test_loss"}
    assert len(run.predict(dataloaders=loader())) == 1
    assert counts.batches == {"train": 1, "val": 1, "test": 1, "predict": 1}
    assert sorted(tmp_path.rglob("*")) == before  # no checkpoint, no metrics rows

    three = trainer(tmp_path / "three", fast_dev_run=3)
    three.fit(Regression(), loader())
    assert (three.global_step, three.fast_dev_run) == (3, 3)
    assert not (tmp_path / "three").exists()


# -- num_sanity_val_steps


def test_the_sanity_check_runs_its_batches_before_training_and_leaves_no_trace(tmp_path: Path) -> None:
    counts = Counts()
    run = trainer(tmp_path, max_epochs=1, callbacks=[counts])
    options: dict[str, Any] = {"dropout": 0.3}
    checked, unchecked = Regression(**options), Regression(**options)
    torch.manual_seed(3)
    run.fit(checked, loader(shuffle=True), loader(seed=1))
    # Its metrics are there for its own hooks (as in Lightning), dropped before training starts.
    assert counts.sanity == [("start", True), ("end", True), ("train", False)]
    assert counts.batches["sanity"] == 2
    assert not run.sanity_checking
    # Its validation left the random generators as they were: same weights as without it.
    torch.manual_seed(3)
    trainer(tmp_path / "none", max_epochs=1, num_sanity_val_steps=0).fit(
        unchecked, loader(shuffle=True), loader(seed=1)
    )
    assert torch.equal(weights(checked), weights(unchecked))
    assert [("val_loss" in row) for row in json.loads((tmp_path / "metrics.json").read_text())] == [True]

    every = Counts()
    trainer(tmp_path / "all", max_epochs=1, num_sanity_val_steps=-1, callbacks=[every]).fit(
        Regression(), loader(), loader(seed=1)
    )
    assert every.batches["sanity"] == 8


def test_a_resumed_fit_runs_the_sanity_check_again(tmp_path: Path) -> None:
    trainer(tmp_path, max_epochs=1).fit(Regression(), loader(), loader(seed=1))
    counts = Counts()
    run = trainer(tmp_path, max_epochs=2, callbacks=[counts])
    run.fit(Regression(), loader(), loader(seed=1))
    assert run.resumed_from is not None
    assert counts.batches["sanity"] == 2


# -- loggers


class Remembers(gl.torch.Logger):
    def __init__(self) -> None:
        self.rows: list[tuple[dict[str, float], int]] = []
        self.params: list[dict[str, Any]] = []
        self.statuses: list[str] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append((metrics, step))

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        self.params.append(params)

    def finalize(self, status: str) -> None:
        self.statuses.append(status)


class WithHparams(Regression):
    def __init__(self, lr: float = 0.1, layers: list[int] | None = None) -> None:
        super().__init__(lr=lr)
        self.save_hyperparameters({"lr": lr, "layers": layers or [4, 1]})


def test_logger_false_writes_no_metrics_files_but_keeps_the_metrics(tmp_path: Path) -> None:
    run = trainer(tmp_path, max_epochs=2, logger=False)
    final = run.fit(Regression(), loader(), loader(seed=1))
    assert "val_loss" in final
    assert run.logger is None
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoints"]
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert [row["epoch"] for row in saved["metrics"]] == [0, 1]


def test_the_csv_logger_writes_lightnings_layout_a_new_version_each_run(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    first = gl.torch.CSVLogger(logs)
    run = trainer(tmp_path / "run", max_epochs=2, logger=first)
    seen: list[Any] = []

    class Sees(gl.torch.Callback):
        def on_fit_start(self, trainer: Any, module: Any) -> None:
            seen.append(module.logger)

    run.callbacks.append(Sees())
    run.fit(WithHparams(), loader(), loader(seed=1))
    assert run.logger is first
    assert seen == [first]
    assert (first.version, first.log_dir) == (0, str(logs / "lightning_logs" / "version_0"))
    with open(logs / "lightning_logs" / "version_0" / "metrics.csv") as file:
        table = list(csv.DictReader(file))
    assert [row["epoch"] for row in table] == ["0", "1"]
    assert list(table[0])[-1] == "step"
    assert float(table[-1]["val_loss"]) == pytest.approx(run.callback_metrics["val_loss"])
    hparams = (logs / "lightning_logs" / "version_0" / "hparams.yaml").read_text()
    assert hparams == "lr: 0.1\nlayers: [4, 1]\n"
    assert not (tmp_path / "run" / "metrics.json").exists()  # not the default files: not asked for

    second = gl.torch.CSVLogger(logs, name="other")
    trainer(tmp_path / "again", max_epochs=1, logger=[second, gl.torch.CSVLogger(logs)]).fit(
        Regression(), loader()
    )
    assert sorted(path.name for path in (logs / "lightning_logs").iterdir()) == ["version_0", "version_1"]
    assert second.log_dir == str(logs / "other" / "version_0")


def test_a_logger_of_your_own_gets_each_row_once_and_the_hparams(tmp_path: Path) -> None:
    mine = Remembers()
    run = trainer(tmp_path, max_epochs=2, logger=[mine], log_every_n_steps=4)
    run.fit(WithHparams(), loader(), loader(seed=1))
    run.test(dataloaders=loader())
    assert mine.params == [{"lr": 0.1, "layers": [4, 1]}]
    assert [(metrics["epoch"], step) for metrics, step in mine.rows] == [(0, 8), (1, 16), (2, 16)]
    assert "test_loss" in mine.rows[-1][0]
    assert mine.statuses == ["success", "success"]
    assert run.metrics_log.rows[-1]["test_loss"] == mine.rows[-1][0]["test_loss"]


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs tensorboard")
def test_the_tensorboard_logger_writes_event_files(tmp_path: Path) -> None:
    board = gl.torch.TensorBoardLogger(tmp_path / "tb", version="run")
    trainer(tmp_path / "run", max_epochs=1, logger=board).fit(WithHparams(), loader(), loader(seed=1))
    folder = tmp_path / "tb" / "lightning_logs" / "run"
    assert board.log_dir == str(folder)
    assert any(path.name.startswith("events.out.tfevents") for path in folder.iterdir())
    assert (folder / "hparams.yaml").exists()


def test_the_tensorboard_logger_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loggers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"^TensorBoardLogger needs TensorBoard: pip install tensorboard$"):
        gl.torch.TensorBoardLogger("logs")


# -- the model summary


def test_the_model_summary_prints_the_layers_and_parameter_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer(tmp_path, max_epochs=1).fit(Regression(), loader())
    printed = capsys.readouterr().err
    assert "0 | net  | Sequential | 5" in printed
    assert "5         Total params" in printed
    trainer(tmp_path / "quiet", max_epochs=1, enable_model_summary=False).fit(Regression(), loader())
    assert "Total params" not in capsys.readouterr().err

    frozen = torch.nn.Sequential(torch.nn.Linear(100, 20), torch.nn.ReLU())
    frozen[0].weight.requires_grad_(False)
    lines = summary(frozen).splitlines()
    assert lines[0].split("|") == ["  ", " Name ", " Type   ", " Params"]
    assert lines[2:4] == ["0 | 0    | Linear | 2.0 K", "1 | 1    | ReLU   | 0"]
    assert lines[-4:] == [
        "20        Trainable params",
        "2.0 K     Non-trainable params",
        "2.0 K     Total params",
        "0.008     Total estimated model params size (MB)",
    ]


# -- strategy, devices, accelerator


def test_lightnings_ddp_strategies_are_taken_and_others_refused_in_one_line(tmp_path: Path) -> None:
    for name in ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true"):
        assert trainer(tmp_path, strategy=name).strategy == name
    for refused in ("fsdp", "deepspeed", "xla", object()):
        with pytest.raises(
            ValueError,
            match=r"not supported: the Trainer runs data-parallel ranks \(DDP\) only; use one of auto, ddp, ",
        ):
            trainer(tmp_path, strategy=refused)


def test_devices_auto_and_accelerator_gpu_mean_what_lightnings_do(tmp_path: Path) -> None:
    gpus = torch.cuda.device_count()
    assert gl.torch.Trainer(devices="auto", default_root_dir=tmp_path).devices == (gpus or 1)
    assert gl.torch.Trainer(accelerator="cpu", devices=-1, default_root_dir=tmp_path).devices == 1
    expected = "mps" if torch.backends.mps.is_available() else "cuda"
    assert gl.torch.Trainer(accelerator="gpu", default_root_dir=tmp_path).accelerator == expected
    with pytest.raises(ValueError, match="devices must be a number of ranks"):
        trainer(tmp_path, devices=0)
