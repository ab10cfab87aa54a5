"""What ``Module.configure_optimizers`` may return, and when its scheduler steps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, cast

import torch
from torch.amp import GradScaler
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
#: or, as Lightning takes them, lists: ``[optimizer]``, ``([optimizer], [scheduler])`` (of several
#: with manual optimization).
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
    """The optimizers ``configure_optimizers`` returned and their schedulers; with automatic
    optimization one optimizer, whose scheduler the Trainer steps as its config says."""

    optimizers: list[Optimizer]
    schedulers: list[LRScheduler] = field(default_factory=list)
    interval: Literal["epoch", "step"] = "epoch"
    frequency: int = 1
    monitor: str | None = None

    @property
    def optimizer(self) -> Optimizer:
        return self.optimizers[0]

    @property
    def scheduler(self) -> LRScheduler | None:
        return self.schedulers[0] if self.schedulers else None

    @classmethod
    def parse(cls, config: Optimizers, manual: bool = False) -> Optimization:
        """What ``config`` names; several optimizers only with ``manual`` optimization (the module
        steps them itself)."""
        optimizers, schedulers = _parts(config)
        if not manual and len(optimizers) != 1:
            raise ValueError(
                f"configure_optimizers returned {len(optimizers)} optimizers; the Trainer steps one (its "
                "parameter groups can hold several learning rates): return one, or set "
                "automatic_optimization = False and step them in training_step"
            )
        found = cls(optimizers)
        for scheduler in schedulers:
            if isinstance(scheduler, LRScheduler | ReduceLROnPlateau):
                found.schedulers.append(scheduler)
            elif scheduler is not None:
                found.schedulers.append(scheduler["scheduler"])
                found.interval = scheduler.get("interval", "epoch")
                found.frequency = scheduler.get("frequency", 1)
                found.monitor = scheduler.get("monitor")
        if not manual and isinstance(found.scheduler, ReduceLROnPlateau) and found.monitor is None:
            raise ValueError('ReduceLROnPlateau needs "monitor": the metric it watches')
        return found

    def state(self) -> dict[str, Any]:
        """Every optimizer's and scheduler's state, for a checkpoint."""
        return {
            "optimizers": [optimizer.state_dict() for optimizer in self.optimizers],
            "schedulers": [scheduler.state_dict() for scheduler in self.schedulers],
        }

    def restore(self, state: dict[str, Any]) -> None:
        # Checkpoints from before several optimizers: one of each, under the singular names.
        optimizers = state.get("optimizers") or [state["optimizer"]]
        schedulers = state.get("schedulers", [state.get("scheduler")])
        for optimizer, saved in zip(self.optimizers, optimizers, strict=False):
            optimizer.load_state_dict(saved)
        for scheduler, saved in zip(self.schedulers, schedulers, strict=False):
            if saved is not None:
                scheduler.load_state_dict(saved)

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


Scheduler = LRScheduler | ReduceLROnPlateau | SchedulerConfig


def _parts(config: Any) -> tuple[list[Optimizer], list[Scheduler]]:
    """The optimizers ``config`` names, and the schedulers (or schedulers' configs) among it."""
    if isinstance(config, Optimizer):
        return [config], []
    if isinstance(config, Mapping) and isinstance(config.get("optimizer"), Optimizer):
        scheduler = config.get("lr_scheduler")
        return [config["optimizer"]], [scheduler] if scheduler is not None else []
    if isinstance(config, tuple) and len(config) == 2:
        first, second = config
        if isinstance(first, Optimizer) and isinstance(second, LRScheduler | ReduceLROnPlateau | Mapping):
            return [first], [cast(Scheduler, second)]  # (optimizer, scheduler)
        if isinstance(first, list) and isinstance(second, list):  # ([optimizers], [schedulers])
            return _parts(first)[0], list(second)
    if isinstance(config, list | tuple) and config:  # [optimizer, ...], [{"optimizer": ...}, ...]
        optimizers: list[Optimizer] = []
        schedulers: list[Scheduler] = []
        for item in config:
            more, theirs = _parts(item)
            optimizers += more
            schedulers += theirs
        return optimizers, schedulers
    raise TypeError(
        "configure_optimizers must return an optimizer, (optimizer, scheduler), "
        '([optimizers], [schedulers]), {"optimizer": ..., "lr_scheduler": ...} or a list of those, not '
        f"{type(config).__name__}"
    )


def clip_gradients(
    optimizer: Optimizer,
    parameters: list[torch.nn.Parameter],
    value: float,
    algorithm: Literal["norm", "value"],
    scaler: GradScaler | None,
) -> None:
    """Clip the gradients of ``parameters`` (``optimizer``'s) to ``value``, by total norm or by value;
    unscaled first when a gradient scaler scaled them."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    if algorithm == "value":
        torch.nn.utils.clip_grad_value_(parameters, value)
    else:
        torch.nn.utils.clip_grad_norm_(parameters, value)
