"""The Module as Lightning's (issue 36): hyperparameters and ``load_from_checkpoint``, ``device``,
manual optimization, ``log``'s defaults and its ``logger``, ``sync_dist`` and ``reduce_fx``, the
default checkpoint's best, ``save_checkpoint`` after ``fit``, and EarlyStopping on a metric logged
per step and per epoch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

import gpulayer as gl
from tests.test_trainer import Regression, loader, trainer, weights


class Configured(Regression):
    def __init__(self, width: int = 4, lr: float = 0.1, note: str = "", **extra: Any) -> None:
        super().__init__(lr=lr)
        self.save_hyperparameters()
        self.width = width


def test_hyperparameters_are_kept_and_a_checkpoint_builds_the_module_again(tmp_path: Path) -> None:
    module = Configured(width=4, lr=0.05, note="first", seed=3)
    assert module.hparams == {"width": 4, "lr": 0.05, "note": "first", "seed": 3}
    assert module.hparams.lr == 0.05
    run = trainer(tmp_path, max_epochs=1)
    run.fit(module, loader())
    run.save_checkpoint(tmp_path / "after.ckpt")  # after fit, as Lightning allows

    again = Configured.load_from_checkpoint(tmp_path / "after.ckpt", note="second")
    assert again.hparams == {"width": 4, "lr": 0.05, "note": "second", "seed": 3}
    assert not again.training
    assert torch.equal(weights(again), weights(module))


def test_a_subclass_may_keep_only_some_arguments_or_a_dict() -> None:
    class Some(Regression):
        def __init__(self, lr: float = 0.1, momentum: float = 0.5, backbone: Any = None) -> None:
            super().__init__(lr=lr, momentum=momentum)
            self.save_hyperparameters(ignore=["backbone"])

    assert Some(backbone=torch.nn.Linear(1, 1)).hparams == {"lr": 0.1, "momentum": 0.5}

    class Given(Regression):
        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__()
            self.save_hyperparameters(config)

    assert Given({"depth": 2}).hparams.depth == 2
    with pytest.raises(AttributeError, match="no hyperparameter 'width' \\(saved: depth\\)"):
        Given({"depth": 2}).hparams.width  # noqa: B018


def test_hyperparameters_a_checkpoint_cannot_hold_are_left_out_with_a_warning(tmp_path: Path) -> None:
    class Holding(Regression):
        def __init__(self, backbone: torch.nn.Module, lr: float = 0.1) -> None:
            super().__init__(lr=lr)
            self.save_hyperparameters()

    run = trainer(tmp_path, max_epochs=1)
    with pytest.warns(UserWarning, match="hyperparameters backbone are not plain values"):
        run.fit(Holding(torch.nn.Linear(1, 1)), loader())
    again = Holding.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt", backbone=None)
    assert again.hparams == {"backbone": None, "lr": 0.1}


def test_save_checkpoint_after_a_fit_in_ranks_writes_what_their_rank_zero_held(tmp_path: Path) -> None:
    module = Configured(lr=0.2)
    run = trainer(tmp_path, max_epochs=1, devices=2)
    run.fit(module, loader())
    run.save_checkpoint(tmp_path / "ranks.ckpt")
    again = Configured.load_from_checkpoint(tmp_path / "ranks.ckpt")
    assert torch.equal(weights(again), weights(module))
    assert again.hparams.lr == 0.2


def test_save_checkpoint_before_any_fit_says_so(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"^save_checkpoint needs a fit: this trainer has run none$"):
        trainer(tmp_path).save_checkpoint(tmp_path / "x.ckpt")


def test_the_default_checkpoint_keeps_a_best_for_test(tmp_path: Path) -> None:
    run = trainer(tmp_path, max_epochs=2)
    module = Regression()
    run.fit(module, loader(), loader(seed=1))
    assert Path(run.checkpoint_callback.best_model_path).name == "epoch=1-step=16.ckpt"  # type: ignore[union-attr]
    [tested] = run.test(ckpt_path="best", dataloaders=loader(seed=2))
    assert set(tested) == {"test_loss"}


def test_device_and_dtype_follow_the_parameters() -> None:
    module = Regression()
    assert (module.device, module.dtype) == (torch.device("cpu"), torch.float32)
    assert module.double().dtype is torch.float64


class TwoPlayers(gl.torch.Module):
    """Two parts with an optimizer each, stepped by hand (a GAN's shape, on a regression)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        self.automatic_optimization = False
        self.backward_hooks = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))  # type: ignore[no-any-return]

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        one, two = self.optimizers()  # type: ignore[misc]
        x, y = batch
        for optimizer in (one, two):
            self.toggle_optimizer(optimizer)
            loss = torch.nn.functional.mse_loss(self(x), y)
            optimizer.zero_grad()
            self.manual_backward(loss)
            self.clip_gradients(optimizer, 10.0)
            optimizer.step()
            self.untoggle_optimizer(optimizer)
        self.log("loss", loss, on_step=False, on_epoch=True)

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.backward_hooks += 1

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.SGD(self.first.parameters(), lr=0.05),
            torch.optim.SGD(self.second.parameters(), lr=0.05),
        ]


def test_manual_optimization_steps_each_optimizer_and_counts_every_step(tmp_path: Path) -> None:
    module = TwoPlayers()
    run = trainer(tmp_path, max_epochs=3)
    run.fit(module, loader())
    assert run.global_step == 3 * 8 * 2
    assert module.backward_hooks == 3 * 8 * 2
    rows = [row for row in run.metrics_log.rows if "loss" in row]
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert all(parameter.requires_grad for parameter in module.parameters())  # untoggled


def test_manual_optimization_as_two_ranks_averages_their_gradients(tmp_path: Path) -> None:
    """Each rank's half of a batch of 8 gives half the samples; averaged, their gradients are the
    whole batch's, so two ranks on batches of 4 train as one process on batches of 8."""
    alone, ranked = TwoPlayers(), TwoPlayers()
    trainer(tmp_path / "one", max_epochs=2).fit(alone, loader(batch_size=8))
    trainer(tmp_path / "two", max_epochs=2, devices=2).fit(ranked, loader(batch_size=4))
    assert torch.allclose(weights(ranked), weights(alone), atol=1e-5)


def test_manual_optimization_refuses_the_trainers_accumulation_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^with automatic_optimization = False, accumulate and clip in"):
        trainer(tmp_path, max_epochs=1, accumulate_grad_batches=2).fit(TwoPlayers(), loader())


class Logs(Regression):
    """Logs as a Lightning module would, leaving the defaults to say when."""

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)  # Lightning's default here: per step
        self.log("both", loss, on_step=True, on_epoch=True)
        self.log("peak", float(batch_idx), reduce_fx="max")
        self.log("total", 1.0, on_step=False, on_epoch=True, reduce_fx=torch.sum)
        self.log("hidden", 5.0, on_step=False, on_epoch=True, logger=False)
        self.log("synced", float(self.trainer.global_rank), sync_dist=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))  # per epoch
        self.log("val_low", float(batch_idx), reduce_fx="min")


def test_log_takes_lightnings_defaults_and_options(tmp_path: Path) -> None:
    run = trainer(tmp_path, max_epochs=1, log_every_n_steps=4)
    run.fit(Logs(), loader(), loader(seed=1))
    rows = json.loads((tmp_path / "metrics.json").read_text())
    steps = [row for row in rows if "loss" in row]
    assert [row["step"] for row in steps] == [4, 8]  # every log_every_n_steps, per step
    assert {"both_step", "peak"} <= set(steps[0])
    assert "both_epoch" not in steps[0]
    [epoch] = [row for row in rows if "both_epoch" in row]
    assert (epoch["total"], epoch["val_low"]) == (8.0, 0.0)
    assert "hidden" not in epoch
    assert run.callback_metrics["hidden"] == 5.0
    assert "val_loss" in epoch
    assert "val_loss_step" not in epoch
    # The callbacks see a forked metric under its own name too: its epoch value.
    assert run.callback_metrics["both"] == epoch["both_epoch"]
    assert run.callback_metrics["peak"] == 7.0  # the last step's


def test_two_ranks_reduce_by_reduce_fx_and_sync_step_values(tmp_path: Path) -> None:
    run = trainer(tmp_path, max_epochs=1, devices=2, log_every_n_steps=1)
    run.fit(Logs(), loader(), loader(seed=1))
    rows = run.metrics_log.rows
    assert {row["synced"] for row in rows if "synced" in row} == {0.5}  # the mean of ranks 0 and 1
    [epoch] = [row for row in rows if "both_epoch" in row]
    assert epoch["total"] == 8.0  # 4 batches on each rank, summed over both


class StepAndEpoch(Regression):
    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("watched", 1.0, on_step=True, on_epoch=True)  # never improves
        return loss


def test_early_stopping_watches_a_metric_logged_per_step_and_per_epoch(tmp_path: Path) -> None:
    stop = gl.torch.EarlyStopping("watched", patience=2)
    run = trainer(tmp_path, max_epochs=10, callbacks=[stop])
    run.fit(StepAndEpoch(), loader())
    assert (run.current_epoch, stop.stopped_epoch) == (3, 2)


def test_a_value_logged_per_step_outside_training_batches_says_where_it_went(tmp_path: Path) -> None:
    class PerStepValidation(Regression):
        def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self(x), y), on_step=True)

    run = trainer(tmp_path, max_epochs=1)
    with pytest.warns(
        UserWarning, match=r"log\('val_loss', on_step=True\) outside a training batch: .*per epoch"
    ):
        run.fit(PerStepValidation(), loader(), loader(seed=1))
    assert "val_loss" in run.callback_metrics


def test_a_call_given_no_model_takes_the_fitted_ones_best_checkpoint(tmp_path: Path) -> None:
    run = trainer(tmp_path, max_epochs=2)
    module = Regression()
    run.fit(module, loader(), loader(seed=1))
    [best] = run.test(dataloaders=loader(seed=2))
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.zero_()
    [given] = run.test(module, loader(seed=2))  # a model given: its weights as they are
    [again] = run.test(dataloaders=loader(seed=2))  # none: the best checkpoint's, as Lightning
    assert given["test_loss"] != best["test_loss"]
    assert again["test_loss"] == best["test_loss"]
