"""What a Lightning script does that the Trainer takes as Lightning does (issue 36, the parts done):
``configure_optimizers``' list forms, ``seed_everything``, ``rank_zero_only``, a loss logged on
every step without torch's warning."""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch.utils.data import DataLoader

import gpulayer as gl
from tests.test_trainer import Regression, trainer
from tests.test_trainer_hooks import loader


class ListsOfOne(Regression):
    def configure_optimizers(self) -> gl.torch.Optimizers:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def test_configure_optimizers_may_return_lightnings_lists_of_one(tmp_path: Path) -> None:
    monitor = gl.torch.LearningRateMonitor(logging_interval="step")
    run = trainer(tmp_path, max_epochs=2, log_every_n_steps=1, callbacks=[monitor])
    run.fit(ListsOfOne(), loader(4))
    assert [row["lr-SGD"] for row in run.metrics_log.rows if "lr-SGD" in row][:3] == [0.1, 0.1, 0.05]


class TwoOptimizers(Regression):
    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.2)]


def test_two_optimizers_are_refused_in_one_line_naming_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"returned 2 optimizers; the Trainer steps one .*automatic_optimization = False"
    ):
        trainer(tmp_path, max_epochs=1).fit(TwoOptimizers(), loader(4))


def test_seed_everything_makes_the_generators_repeat() -> None:
    assert gl.torch.seed_everything(7) == 7
    first = (random.random(), torch.rand(1).item())
    gl.torch.seed_everything(7)
    assert (random.random(), torch.rand(1).item()) == first


def test_rank_zero_only_runs_on_rank_zero_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    @gl.torch.rank_zero_only
    def said(text: str) -> str:
        return text

    assert said("here") == "here"
    monkeypatch.setenv("RANK", "1")
    assert said("here") is None


class LogsItsLossEveryStep(Regression):
    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss, on_step=True, prog_bar=True)
        return loss


def test_a_loss_logged_on_every_step_reads_without_a_warning(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer(tmp_path, max_epochs=1, log_every_n_steps=1).fit(LogsItsLossEveryStep(), loader(4))


@pytest.mark.parametrize(
    ("given", "dtype"),
    [
        ("64-true", torch.float64),
        (64, torch.float64),
        ("bf16-true", torch.bfloat16),
        ("32-true", torch.float32),
    ],
)
def test_true_precision_keeps_parameters_and_batches_in_its_type(
    tmp_path: Path, given: Any, dtype: torch.dtype
) -> None:
    class Typed(Regression):
        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            assert batch[0].dtype is dtype
            assert torch.zeros(1).dtype is dtype
            return super().training_step(batch, batch_idx)

    module = Typed()
    run = trainer(tmp_path, max_epochs=1, precision=given)
    run.fit(module, loader(4))
    assert {parameter.dtype for parameter in module.parameters()} == {dtype}
    assert torch.get_default_dtype() is torch.float32  # only inside the steps


def test_lightnings_precision_names_are_taken_and_others_refused(tmp_path: Path) -> None:
    for given in (16, "16", 32, "32-true", "bf16", "bf16-mixed", "16-mixed", "16-true"):
        trainer(tmp_path, precision=given)
    with pytest.raises(ValueError, match=r"^precision must be one of .*, not 'half'$"):
        trainer(tmp_path, precision="half")


class Regressions(gl.torch.DataModule):
    """Records what the Trainer asked of it, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def prepare_data(self) -> None:
        self.calls.append("prepare_data")

    def setup(self, stage: str) -> None:
        self.calls.append(f"setup {stage}")

    def teardown(self, stage: str) -> None:
        self.calls.append(f"teardown {stage}")

    def train_dataloader(self) -> DataLoader[Any]:
        return loader(4)

    def val_dataloader(self) -> DataLoader[Any]:
        return loader(2)

    def test_dataloader(self) -> DataLoader[Any]:
        return loader(2)

    def predict_dataloader(self) -> DataLoader[Any]:
        return loader(2)


def test_a_datamodule_gives_the_data_and_the_fitted_model_is_the_default(tmp_path: Path) -> None:
    data, model = Regressions(), Regression()
    run = trainer(tmp_path, max_epochs=1)
    run.fit(model, datamodule=data)
    assert run.datamodule is data
    [validated] = run.validate(datamodule=data)  # no model: the one just fitted
    [tested] = run.test(datamodule=data)
    assert set(validated) == {"val_loss"}
    assert set(tested) == {"test_loss"}
    assert len(run.predict(datamodule=data)) == 1
    stages = ("fit", "validate", "test", "predict")
    assert data.calls == [
        call for stage in stages for call in ("prepare_data", f"setup {stage}", f"teardown {stage}")
    ]
    assert "train_loss" in run.fit(model, train_dataloaders=loader(4), val_dataloaders=loader(2))


def test_a_call_with_no_model_before_any_fit_says_so(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"^test needs a model: none was given, and this trainer has fitted none$"
    ):
        trainer(tmp_path).test(dataloaders=loader(2))


def test_what_lightning_has_and_gpulayer_does_not_is_refused_naming_what_to_use() -> None:
    import gpulayer.torch as pl

    with pytest.raises(AttributeError, match=r"^gpulayer\.torch\.cli: LightningCLI is not part .*argparse"):
        pl.cli  # noqa: B018
    with pytest.raises(AttributeError, match=r"^gpulayer\.torch\.strategies: .*strategy='ddp'"):
        pl.strategies  # noqa: B018
    with pytest.raises(AttributeError, match=r"^gpulayer\.torch\.loggers\.WandbLogger: only CSVLogger and"):
        pl.loggers.WandbLogger  # noqa: B018
    with pytest.raises(ValueError, match="fsdp"):
        gl.torch.Trainer(strategy="fsdp")
