"""What ``Module.configure_optimizers`` may return, and when its scheduler steps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau


class _SchedulerBase(TypedDict):
    scheduler: LRScheduler


class SchedulerConfig(_SchedulerBase, total=False):
    """``{"scheduler": s, "interval": "epoch" | "step", "frequency": n, "monitor": "val_loss"}``"""

    interval: Literal["epoch", "step"]
    frequency: int
    monitor: str


class _OptimizerBase(TypedDict):
    optimizer: Optimizer


class OptimizerConfig(_OptimizerBase, total=False):
    """``{"optimizer": o, "lr_scheduler": s or {"scheduler": s, ...}}``"""

    lr_scheduler: LRScheduler | SchedulerConfig


#: An optimizer; an optimizer and its scheduler; or a dict naming them (and when the scheduler steps);
#: or, as Lightning takes them, lists of one: ``[optimizer]``, ``([optimizer], [scheduler])``.
Optimizers = (
    Optimizer
    | tuple[Optimizer, LRScheduler | SchedulerConfig]
    | OptimizerConfig
    | list[Optimizer]
    | list[OptimizerConfig]
    | tuple[list[Optimizer], list[LRScheduler | SchedulerConfig]]
)


@dataclass
class Optimization:
    optimizer: Optimizer
    scheduler: LRScheduler | None = None
    interval: Literal["epoch", "step"] = "epoch"
    frequency: int = 1
    monitor: str | None = None

    @classmethod
    def parse(cls, config: Optimizers) -> Optimization:
        given: Any = config
        if isinstance(given, list):  # [optimizer], [{"optimizer": ...}]: Lightning's lists, of one
            given = _one(given, "optimizer")
        if isinstance(given, tuple):
            optimizer, scheduler = given
            if isinstance(optimizer, list):  # ([optimizer], [scheduler]), as Lightning takes it
                optimizer, scheduler = _one(optimizer, "optimizer"), _one(scheduler, "scheduler")
            given = {"optimizer": optimizer, "lr_scheduler": scheduler}
        if isinstance(given, Optimizer):
            return cls(given)
        if isinstance(given, Mapping) and isinstance(given.get("optimizer"), Optimizer):
            found = cls(given["optimizer"])
            scheduler = given.get("lr_scheduler")
            if isinstance(scheduler, LRScheduler):
                found.scheduler = scheduler
            elif scheduler is not None:
                found.scheduler = scheduler["scheduler"]
                found.interval = scheduler.get("interval", "epoch")
                found.frequency = scheduler.get("frequency", 1)
                found.monitor = scheduler.get("monitor")
            if isinstance(found.scheduler, ReduceLROnPlateau) and found.monitor is None:
                raise ValueError('ReduceLROnPlateau needs "monitor": the metric it watches')
            return found
        raise TypeError(
            "configure_optimizers must return an optimizer, (optimizer, scheduler), "
            '([optimizer], [scheduler]) or {"optimizer": ..., "lr_scheduler": ...}, not '
            f"{type(config).__name__}"
        )

    def step_scheduler(
        self, interval: Literal["epoch", "step"], count: int, metrics: Mapping[str, float]
    ) -> None:
        """Step the scheduler if it steps every ``frequency`` ``interval`` and ``count`` of them ended."""
        if self.scheduler is None or interval != self.interval or count % self.frequency:
            return
        if isinstance(self.scheduler, ReduceLROnPlateau):
            assert self.monitor is not None
            if self.monitor not in metrics:
                return  # no new value (no validation this epoch): nothing to judge a plateau on
            self.scheduler.step(metrics[self.monitor])
        else:
            self.scheduler.step()


def _one(items: list[Any], what: str) -> Any:
    """The one item of a list ``configure_optimizers`` returned; the Trainer steps one optimizer."""
    if len(items) != 1:
        raise ValueError(
            f"configure_optimizers returned {len(items)} {what}s; the Trainer steps one optimizer "
            f"(its parameter groups can hold several learning rates): return one {what}"
        )
    return items[0]
