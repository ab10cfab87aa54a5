"""Callbacks: a base of no-op hooks the Trainer calls, and the ones it ships.

Every hook runs on every rank. A callback that decides something (stop, save) decides it from
metrics already reduced over ranks, so every rank decides the same; one that writes files lets
only rank 0 write (``trainer.save_checkpoint`` does that itself). A callback with state across
epochs returns it from ``state_dict`` (tensors, numbers, strings, lists, dicts) and it is saved
in each checkpoint and given back to ``load_state_dict`` when a fit resumes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.optim import Optimizer

from .module import Module

if TYPE_CHECKING:
    from .trainer import Trainer

Stage = Literal["fit", "validate", "test", "predict"]


class Callback:
    """Override the hooks you need; each gets the trainer and the module first. A hook runs before
    the module's hook of the same name, in Lightning's order (docs/trainer.md)."""

    #: Whether it decides from a metric at the epoch's end (stop, keep the best): its
    #: ``on_train_epoch_end`` then runs after the module's, so that it sees what that logs.
    monitoring = False

    @property
    def state_key(self) -> str:
        """Names this callback's state in a checkpoint; unique among the trainer's callbacks."""
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what ``state_dict`` returned, when a fit resumes from a checkpoint."""

    def setup(self, trainer: Trainer, module: Module, stage: Stage) -> None:
        """Before ``fit``, ``validate``, ``test`` or ``predict`` starts, on the module's device."""

    def teardown(self, trainer: Trainer, module: Module, stage: Stage) -> None:
        """After it ended, even by an exception."""

    def on_fit_start(self, trainer: Trainer, module: Module) -> None: ...

    def on_fit_end(self, trainer: Trainer, module: Module) -> None: ...

    def on_sanity_check_start(self, trainer: Trainer, module: Module) -> None:
        """Before the sanity check's validation batches (``num_sanity_val_steps``), after
        ``on_fit_start``; a callback's hook only, as in Lightning."""

    def on_sanity_check_end(self, trainer: Trainer, module: Module) -> None: ...

    def on_train_start(self, trainer: Trainer, module: Module) -> None: ...

    def on_train_end(self, trainer: Trainer, module: Module) -> None: ...

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None: ...

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        """After the epoch's validation and scheduler step: ``trainer.epoch_metrics`` holds the
        epoch's means (training and validation), reduced over ranks."""

    def on_train_batch_start(self, trainer: Trainer, module: Module, batch: Any, batch_idx: int) -> None: ...

    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After the batch's backward pass and, at the end of an accumulation, the optimizer step."""

    def on_before_zero_grad(self, trainer: Trainer, module: Module, optimizer: Optimizer) -> None:
        """At the first batch of an accumulation, after its ``training_step``, before its backward."""

    def on_before_backward(self, trainer: Trainer, module: Module, loss: torch.Tensor) -> None: ...

    def on_after_backward(self, trainer: Trainer, module: Module) -> None: ...

    def on_before_optimizer_step(self, trainer: Trainer, module: Module, optimizer: Optimizer) -> None:
        """Gradients are final (accumulated, synchronized, unscaled when clipping) and not yet applied."""

    def on_validation_start(self, trainer: Trainer, module: Module) -> None: ...

    def on_validation_epoch_start(self, trainer: Trainer, module: Module) -> None: ...

    def on_validation_epoch_end(self, trainer: Trainer, module: Module) -> None: ...

    def on_validation_batch_start(
        self, trainer: Trainer, module: Module, batch: Any, batch_idx: int
    ) -> None: ...

    def on_validation_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None: ...

    def on_validation_end(self, trainer: Trainer, module: Module) -> None: ...

    def on_test_start(self, trainer: Trainer, module: Module) -> None: ...

    def on_test_epoch_start(self, trainer: Trainer, module: Module) -> None: ...

    def on_test_epoch_end(self, trainer: Trainer, module: Module) -> None: ...

    def on_test_batch_start(self, trainer: Trainer, module: Module, batch: Any, batch_idx: int) -> None: ...

    def on_test_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None: ...

    def on_test_end(self, trainer: Trainer, module: Module) -> None: ...

    def on_predict_start(self, trainer: Trainer, module: Module) -> None: ...

    def on_predict_epoch_start(self, trainer: Trainer, module: Module) -> None: ...

    def on_predict_epoch_end(self, trainer: Trainer, module: Module) -> None: ...

    def on_predict_batch_start(
        self, trainer: Trainer, module: Module, batch: Any, batch_idx: int
    ) -> None: ...

    def on_predict_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None: ...

    def on_predict_end(self, trainer: Trainer, module: Module) -> None: ...


HOOKS = tuple(name for name in vars(Callback) if name in {"setup", "teardown"} or name.startswith("on_"))


class Hooks:
    """For each hook, what runs it: the callbacks that override it, then the module if it does (its
    hooks take no trainer or module). A hook nothing overrides costs the loop that calls it an empty
    list. ``on_train_epoch_end`` is split: ``by_name`` has the callbacks that do not monitor a metric
    and the module, ``monitoring_epoch_end`` the rest, run once what the module logged is counted."""

    def __init__(self, callbacks: Sequence[Callback], module: Module) -> None:
        self.by_name = {name: _overriding(callbacks, name) for name in HOOKS}
        self.by_name["on_train_epoch_end"] = _overriding(
            [c for c in callbacks if not c.monitoring], "on_train_epoch_end"
        )
        self.monitoring_epoch_end = _overriding([c for c in callbacks if c.monitoring], "on_train_epoch_end")
        for name in HOOKS:
            if hasattr(Module, name) and _overrides(module, Module, name):
                self.by_name[name].append(_of_module(getattr(module, name)))

    def call(self, name: str, *args: Any) -> None:
        for hook in self.by_name[name]:
            hook(*args)


def _overriding(callbacks: Sequence[Callback], name: str) -> list[Callable[..., None]]:
    """The hook ``name`` of each of ``callbacks`` that overrides it."""
    return [getattr(callback, name) for callback in callbacks if _overrides(callback, Callback, name)]


def _overrides(owner: object, base: type, name: str) -> bool:
    return getattr(type(owner), name) is not getattr(base, name)


def _of_module(hook: Callable[..., None]) -> Callable[..., None]:
    """A module's hook, called as a callback's is (the trainer and the module first)."""

    def call(trainer: Trainer, module: Module, *args: Any) -> None:
        hook(*args)

    return call


def _better(mode: Literal["min", "max"]) -> Callable[[float, float], bool]:
    return (lambda new, old: new < old) if mode == "min" else (lambda new, old: new > old)


class EarlyStopping(Callback):
    """Stop fitting when ``monitor`` (an epoch metric) has not improved by more than ``min_delta``
    for ``patience`` epochs in a row (epochs without a value, such as those that skip validation,
    do not count), or is not finite. Every rank stops after the same epoch. Off in a
    ``fast_dev_run``."""

    monitoring = True

    def __init__(
        self,
        monitor: str,
        *,
        mode: Literal["min", "max"] = "min",
        patience: int = 3,
        min_delta: float = 0.0,
        check_finite: bool = True,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', not {mode!r}")
        self.monitor = monitor
        self.mode: Literal["min", "max"] = mode
        self.patience = patience
        self.min_delta = abs(min_delta)
        self.check_finite = check_finite
        self.best: float | None = None
        self.wait = 0
        self.stopped_epoch: int | None = None
        self._warned = False

    @property
    def state_key(self) -> str:
        return f"EarlyStopping[{self.monitor},{self.mode}]"

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "stopped_epoch": self.stopped_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.wait, self.stopped_epoch = state["best"], state["wait"], state["stopped_epoch"]

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.fast_dev_run:
            return
        value = trainer.monitored(self.monitor)
        if value is None:
            self._warned = self._warned or _warn_missing(self, self.monitor, trainer)
            return
        shift = -self.min_delta if self.mode == "min" else self.min_delta
        if self.check_finite and not math.isfinite(value):
            self.wait = self.patience
        elif self.best is None or _better(self.mode)(value, self.best + shift):
            self.best, self.wait = value, 0
            return
        else:
            self.wait += 1
        if self.wait >= self.patience:
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch


def _warn_missing(callback: Callback, monitor: str, trainer: Trainer) -> bool:
    """Warn once that ``monitor`` was never logged (likely a misspelling); True if it warned."""
    if monitor in trainer.callback_metrics:
        return False
    names = ", ".join(sorted(trainer.callback_metrics)) or "none"
    warnings.warn(
        f"{type(callback).__name__}: no metric {monitor!r} was logged (logged: {names})", stacklevel=2
    )
    return True


class ModelCheckpoint(Callback):
    """Save checkpoints in ``dirpath`` (default: ``<run folder>/checkpoints``).

    Every ``every_n_epochs`` epochs (at the epoch's end, after its validation) and, if set, every
    ``every_n_train_steps`` optimizer steps, it keeps the ``save_top_k`` best by ``monitor`` (all
    with -1, none with 0; with no ``monitor``, the most recent), named by ``filename`` (a format
    string given ``epoch``, ``step`` and the metrics) plus ``.ckpt``, deleting the ones that fall
    out. With ``save_last`` it also writes ``last.ckpt`` each time, and once more when the fit
    ends: what a fit resumes from. Only rank 0 writes; every write is atomic. A ``fast_dev_run``
    writes nothing.
    """

    monitoring = True

    def __init__(
        self,
        dirpath: str | Path | None = None,
        *,
        filename: str = "epoch={epoch}-step={step}",
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        save_top_k: int = 1,
        save_last: bool = True,
        every_n_epochs: int | None = 1,
        every_n_train_steps: int | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', not {mode!r}")
        if save_top_k < -1:
            raise ValueError(f"save_top_k must be -1 (all), 0 (none) or more, not {save_top_k}")
        self.dirpath = Path(dirpath) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.mode: Literal["min", "max"] = mode if monitor else "max"
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.every_n_epochs = every_n_epochs
        self.every_n_train_steps = every_n_train_steps
        #: path -> score of the checkpoints kept, best first.
        self.best_k_models: dict[str, float] = {}
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self._saved_step = -1
        self._warned = False

    @property
    def state_key(self) -> str:
        return f"ModelCheckpoint[{self.monitor},{self.mode},{self.filename}]"

    @property
    def last_path(self) -> Path:
        return self._folder / "last.ckpt"

    @property
    def _folder(self) -> Path:
        if self.dirpath is None:
            raise RuntimeError("ModelCheckpoint has no folder until it is given to a Trainer")
        return self.dirpath

    def state_dict(self) -> dict[str, Any]:
        # File names, not paths: the run folder may be mounted elsewhere when the fit resumes.
        return {
            "best_k_models": {Path(path).name: score for path, score in self.best_k_models.items()},
            "best_model_path": Path(self.best_model_path).name if self.best_model_path else "",
            "best_model_score": self.best_model_score,
            "saved_step": self._saved_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        folder = self._folder
        self.best_k_models = {str(folder / name): score for name, score in state["best_k_models"].items()}
        self.best_model_path = str(folder / state["best_model_path"]) if state["best_model_path"] else ""
        self.best_model_score = state["best_model_score"]
        self._saved_step = state["saved_step"]

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        if self.every_n_epochs and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self._save(trainer, {**trainer.step_metrics, **trainer.epoch_metrics}, at_epoch_end=True)

    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        every = self.every_n_train_steps
        # The step stays the same over the micro-batches of one accumulation: save it once.
        if every and step and step % every == 0 and step != self._saved_step:
            self._save(trainer, trainer.callback_metrics)

    def on_fit_end(self, trainer: Trainer, module: Module) -> None:
        if self.save_last and not trainer.fast_dev_run:
            trainer.save_checkpoint(self.last_path)

    def _save(self, trainer: Trainer, metrics: dict[str, float], at_epoch_end: bool = False) -> None:
        if trainer.fast_dev_run:
            return
        self._saved_step = trainer.global_step
        paths, dropped = [], []
        if not self.monitor:
            score: float | None = float(trainer.global_step)
        else:
            score = trainer.monitored(self.monitor) if at_epoch_end else metrics.get(self.monitor)
        if score is None:
            self._warned = self._warned or _warn_missing(self, str(self.monitor), trainer)
        elif self.save_top_k:
            name = self.filename.format(
                **{**metrics, "epoch": trainer.current_epoch, "step": trainer.global_step}
            )
            path = str(self._folder / f"{name}.ckpt")
            kept = {**self.best_k_models, path: score}
            ranked = sorted(kept, key=kept.__getitem__, reverse=self.mode == "max")
            keep = ranked if self.save_top_k == -1 else ranked[: self.save_top_k]
            if path in keep:
                paths.append(Path(path))
                dropped = [old for old in self.best_k_models if old not in keep]
                self.best_k_models = {name: kept[name] for name in keep}
                self.best_model_path = keep[0]
                self.best_model_score = kept[keep[0]]
        if self.save_last:
            paths.append(self.last_path)
        if paths:
            # The state saved with the checkpoint already counts it among the kept ones.
            trainer.save_checkpoint(*paths)
        if trainer.is_global_zero:
            for old in dropped:
                Path(old).unlink(missing_ok=True)


class LearningRateMonitor(Callback):
    """Record each parameter group's learning rate: ``lr-<Optimizer>`` (``lr-<Optimizer>/pg<i>``
    with several groups), once per epoch in its row, or every ``log_every_n_steps`` steps."""

    def __init__(self, logging_interval: Literal["epoch", "step"] = "epoch") -> None:
        if logging_interval not in ("epoch", "step"):
            raise ValueError(f"logging_interval must be 'epoch' or 'step', not {logging_interval!r}")
        self.logging_interval = logging_interval

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        if self.logging_interval == "epoch":
            for name, rate in self._rates(trainer.optimizer):
                trainer.log_value(name, rate)

    def on_train_batch_start(self, trainer: Trainer, module: Module, batch: Any, batch_idx: int) -> None:
        if self.logging_interval == "step":
            for name, rate in self._rates(trainer.optimizer):
                module.log(name, rate, on_step=True, on_epoch=False)

    @staticmethod
    def _rates(optimizer: Optimizer | None) -> list[tuple[str, float]]:
        if optimizer is None:
            return []
        groups = optimizer.param_groups
        name = f"lr-{type(optimizer).__name__}"
        rates = [float(group["lr"].item() if isinstance(group["lr"], torch.Tensor) else group["lr"])
                 for group in groups]  # fmt: skip
        if len(rates) == 1:
            return [(name, rates[0])]
        return [(f"{name}/pg{index}", rate) for index, rate in enumerate(rates)]
