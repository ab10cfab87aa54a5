"""Rank 0's progress on stderr: a tqdm bar per epoch when tqdm is installed, else a plain line at
each epoch's end and every ``refresh_seconds`` within one."""

from __future__ import annotations

import importlib
import sys
import time
from typing import TYPE_CHECKING, Any

from .callbacks import Callback
from .module import Module

if TYPE_CHECKING:
    from .trainer import Trainer

try:
    tqdm: Any = importlib.import_module("tqdm").tqdm
except ImportError:  # optional: the plain lines need nothing
    tqdm = None


class ProgressBar(Callback):
    def __init__(self, refresh_seconds: float = 10.0) -> None:
        self.refresh_seconds = refresh_seconds
        self._bar: Any = None
        self._next_line = 0.0

    def on_fit_start(self, trainer: Trainer, module: Module) -> None:
        if trainer.is_global_zero and trainer.resumed_from is not None:
            where = f"epoch {trainer.current_epoch + 1}, step {trainer.global_step}"
            _say(f"resumed from {trainer.resumed_from} at {where}")

    def on_train_epoch_start(self, trainer: Trainer, module: Module) -> None:
        if not trainer.is_global_zero:
            return
        if tqdm is not None:
            self._bar = tqdm(total=trainer.num_training_batches, desc=self._epoch(trainer), file=sys.stderr)
        self._next_line = time.monotonic() + self.refresh_seconds

    def on_train_batch_end(
        self, trainer: Trainer, module: Module, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._bar is not None:
            self._bar.update(1)
        elif trainer.is_global_zero and time.monotonic() >= self._next_line:
            self._next_line = time.monotonic() + self.refresh_seconds
            total = trainer.num_training_batches
            _say(f"{self._epoch(trainer)}: batch {batch_idx + 1}{f'/{total}' if total else ''}")

    def on_train_epoch_end(self, trainer: Trainer, module: Module) -> None:
        if not trainer.is_global_zero:
            return
        shown = _shown(trainer, trainer.epoch_metrics)
        if self._bar is not None:
            self._bar.set_postfix_str(shown, refresh=False)
            self._bar.close()
            self._bar = None
        else:
            _say(f"{self._epoch(trainer)}: step {trainer.global_step}{'  ' + shown if shown else ''}")

    def on_validation_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.is_global_zero and trainer.stage == "validate":
            _say(f"validate: {_shown(trainer, trainer.epoch_metrics, every=True)}")

    def on_test_end(self, trainer: Trainer, module: Module) -> None:
        if trainer.is_global_zero:
            _say(f"test: {_shown(trainer, trainer.epoch_metrics, every=True)}")

    def teardown(self, trainer: Trainer, module: Module, stage: str) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    @staticmethod
    def _epoch(trainer: Trainer) -> str:
        limit = f"/{trainer.max_epochs}" if trainer.max_epochs is not None else ""
        return f"epoch {trainer.current_epoch + 1}{limit}"


def _shown(trainer: Trainer, metrics: dict[str, float], every: bool = False) -> str:
    """The metrics logged with ``prog_bar=True`` (all of them with ``every``), as name=value."""
    names = sorted(metrics) if every else sorted(set(metrics) & trainer.prog_bar_metrics)
    return "  ".join(f"{name}={metrics[name]:.4g}" for name in names)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
