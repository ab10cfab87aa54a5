"""The Trainer calls every hook of its module and callbacks, in Lightning's documented order: the
callbacks' first, then the module's; at an epoch's end the callbacks that monitor a metric after
the module, so that they see what it logged there. The sanity check's two hooks are a callback's
only, as in Lightning."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer as gl
from tests.test_trainer import Regression, trainer


def hooks(owner: type) -> list[str]:
    return [name for name in vars(owner) if name in {"setup", "teardown"} or name.startswith("on_")]


Calls = list[tuple[str, str]]


def recorder(who: str, name: str) -> Callable[..., None]:
    def hook(self: Any, *args: Any, **kwargs: Any) -> None:
        self.calls.append((who, name))

    return hook


RecordedModule = type(
    "RecordedModule", (Regression,), {name: recorder("module", name) for name in hooks(gl.torch.Module)}
)
RecordingCallback = type(
    "RecordingCallback",
    (gl.torch.Callback,),
    {name: recorder("callback", name) for name in hooks(gl.torch.Callback)},
)


def both(*names: str) -> Calls:
    return [(who, name) for name in names for who in ("callback", "module")]


def loader(samples: int) -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=2)


def test_every_hook_runs_in_lightnings_order(tmp_path: Path) -> None:
    calls: Calls = []
    module, callback = RecordedModule(), RecordingCallback()
    module.calls = callback.calls = calls  # type: ignore[attr-defined]
    run = trainer(tmp_path, max_epochs=2, callbacks=[callback])

    run.fit(module, loader(4), loader(2))
    batch = both(
        "on_train_batch_start",
        "on_before_zero_grad",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_train_batch_end",
    )
    validation = (
        both("on_validation_start", "on_validation_epoch_start")
        + both("on_validation_batch_start", "on_validation_batch_end")
        + both("on_validation_epoch_end", "on_validation_end")
    )
    epoch = both("on_train_epoch_start") + batch * 2 + validation + both("on_train_epoch_end")
    sanity_check = [("callback", "on_sanity_check_start"), *validation, ("callback", "on_sanity_check_end")]
    assert calls == (
        both("setup", "on_fit_start")
        + sanity_check
        + both("on_train_start")
        + epoch * 2
        + both("on_train_end", "on_fit_end", "teardown")
    )
    for stage, run_it in (("validation", run.validate), ("test", run.test)):
        calls.clear()
        run_it(module, loader(2))
        assert calls == both("setup", f"on_{stage}_start", f"on_{stage}_epoch_start") + both(
            f"on_{stage}_batch_start", f"on_{stage}_batch_end"
        ) + both(f"on_{stage}_epoch_end", f"on_{stage}_end", "teardown")
    calls.clear()
    run.predict(module, loader(2))
    assert calls == both("setup", "on_predict_start", "on_predict_epoch_start") + both(
        "on_predict_batch_start", "on_predict_batch_end"
    ) + both("on_predict_epoch_end", "on_predict_end", "teardown")


class LogsAtEpochEnds(Regression):
    def on_train_epoch_end(self) -> None:
        self.log("epoch_mark", float(self.current_epoch) + 10)

    def on_validation_epoch_end(self) -> None:
        self.log("val_mark", 7.0)


class Watches(gl.torch.Callback):
    """Sees the epoch's metrics at its end: after the module's hook if it monitors one."""

    def __init__(self, monitoring: bool) -> None:
        self.monitoring = monitoring
        self.seen: list[float | None] = []

    @property
    def state_key(self) -> str:
        return f"Watches[{self.monitoring}]"

    def on_train_epoch_end(self, trainer: gl.torch.Trainer, module: gl.torch.Module) -> None:
        self.seen.append(trainer.callback_metrics.get("epoch_mark"))


def test_what_a_module_logs_at_an_epochs_end_counts_and_monitoring_callbacks_see_it(tmp_path: Path) -> None:
    plain, monitoring = Watches(monitoring=False), Watches(monitoring=True)
    run = trainer(tmp_path, max_epochs=2, callbacks=[monitoring, plain])
    run.fit(LogsAtEpochEnds(), loader(4), loader(2))
    assert monitoring.seen == [10.0, 11.0]
    assert plain.seen == [None, 10.0]  # before the module's hook: last epoch's value
    assert run.epoch_metrics["epoch_mark"] == 11.0
    assert run.epoch_metrics["val_mark"] == 7.0
    assert run.validate(LogsAtEpochEnds(), loader(2))[0]["val_mark"] == 7.0


# -- beside Lightning itself

#: Where GPUlayer's order deliberately differs from Lightning's, as (call, Lightning's, ours): none.
DIFFERENCES: list[tuple[str, Calls, Calls]] = []


def through_every_call(run: Any, module: Any, calls: Calls) -> dict[str, Calls]:
    """The hooks ``module`` and its recording callback saw in fit, validate, test and predict."""
    seen: dict[str, Calls] = {}
    for call, given in (("fit", (loader(4), loader(2))), ("validate", (loader(2),)),
                        ("test", (loader(2),)), ("predict", (loader(2),))):  # fmt: skip
        calls.clear()
        getattr(run, call)(module, *given)
        seen[call] = list(calls)
    return seen


def test_the_hooks_run_as_they_do_under_lightning_itself(tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning.pytorch")

    class LightningRegression(lightning.LightningModule):  # type: ignore[misc]
        """Regression's steps, on Lightning's module."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Dropout(0.0), torch.nn.Linear(4, 1))
            self.lr, self.momentum, self.step_size = 0.1, 0.0, 0
            self.autocast_dtypes: set[torch.dtype] = set()

        forward = Regression.forward
        training_step = Regression.training_step
        validation_step = Regression.validation_step
        test_step = Regression.test_step
        predict_step = Regression.predict_step
        configure_optimizers = Regression.configure_optimizers

    module_hooks = {name: recorder("module", name) for name in hooks(gl.torch.Module)}
    theirs_module = type("RecordedModule", (LightningRegression,), module_hooks)()
    theirs_callback = type(
        "RecordingCallback",
        (lightning.Callback,),
        {name: recorder("callback", name) for name in hooks(gl.torch.Callback)},
    )()
    ours_module, ours_callback = RecordedModule(), RecordingCallback()
    theirs_calls: Calls = []
    ours_calls: Calls = []
    theirs_module.calls = theirs_callback.calls = theirs_calls
    ours_module.calls = ours_callback.calls = ours_calls  # type: ignore[attr-defined]
    # Each at its defaults (a sanity check of the validation included), but for what prints or logs.
    theirs = lightning.Trainer(
        accelerator="cpu", max_epochs=2, callbacks=[theirs_callback], default_root_dir=tmp_path / "lightning",
        logger=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    ours = trainer(tmp_path / "ours", max_epochs=2, callbacks=[ours_callback])

    expected = through_every_call(theirs, theirs_module, theirs_calls)
    for call, lightnings, differing in DIFFERENCES:
        assert expected[call] == lightnings
        expected[call] = differing
    found = through_every_call(ours, ours_module, ours_calls)
    for call in expected:
        assert found[call] == expected[call], call
