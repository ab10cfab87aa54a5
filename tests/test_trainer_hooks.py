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
    def hook(self: Any, *args: Any) -> None:
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
