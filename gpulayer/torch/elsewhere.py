"""A Trainer call run in ranks started on this machine or as a GPUlayer gang job: each rank runs the
call, and the caller takes back rank 0's outcome (the fit's weights and final state, progress,
metrics, callbacks' states)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch

from . import data, remote, spawn
from .metrics import MetricsLog
from .module import Module
from .precision import Precision

if TYPE_CHECKING:
    from .trainer import Trainer


def run(
    trainer: Trainer, where: Literal["ranks", "job"], call: str, module: Module, args: tuple[Any, ...]
) -> Any:
    """Run ``trainer.<call>(module, *args)`` in ranks started here or in a gang job; take back rank
    0's outcome into ``trainer`` and ``module``, and return the call's value."""
    seed = int(torch.randint(2**31 - 1, ()).item())
    for logger in trainer.loggers:  # a new version folder is picked here, once, for rank 0 to log in
        logger.log_dir  # noqa: B018
    work = Call(trainer, call, module, args)
    if where == "ranks":
        outcome = spawn.run_ranks(trainer.devices, work, seed)
    else:
        outcome = remote.run_job(trainer, work, seed)
    if outcome["checkpoint"] is not None:  # a fit: its weights, and what save_checkpoint writes
        trainer._last_checkpoint = outcome["checkpoint"]
        # Of the type the ranks trained in (true precision), as the module of a fit here would be.
        Precision(trainer.precision, torch.device("cpu")).convert_module(module)
        module.load_state_dict(outcome["checkpoint"]["state_dict"])
    for name in ("current_epoch", "global_step", "should_stop", "callback_metrics", "resumed_from"):
        setattr(trainer, name, outcome[name])
    for callback in trainer.callbacks:
        if callback.state_key in outcome["callbacks"]:
            callback.load_state_dict(outcome["callbacks"][callback.state_key])
    trainer._metrics = MetricsLog(outcome["metrics"])
    for logger in trainer.loggers:
        logger.reload()
    return outcome["value"]


class Call:
    """One Trainer call, as a rank runs it: what it returns, and what the caller takes back of rank 0's
    state (the trained weights after ``fit``, progress, metrics and callbacks' states)."""

    def __init__(self, trainer: Trainer, call: str, module: Module, args: tuple[Any, ...]) -> None:
        self.trainer, self.call, self.module, self.args = trainer, call, module, args

    def __call__(self) -> dict[str, Any]:
        trainer = self.trainer
        value = getattr(trainer, self.call)(self.module, *self.args)
        loop = trainer._fit if self.call == "fit" else None
        return {
            "value": value,
            # On the CPU: the caller may have no GPU.
            "checkpoint": data.apply(trainer._checkpoint_state(loop), torch.Tensor.cpu) if loop else None,
            "current_epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "should_stop": trainer.should_stop,
            "callback_metrics": trainer.callback_metrics,
            "resumed_from": trainer.resumed_from,
            "callbacks": {callback.state_key: callback.state_dict() for callback in trainer.callbacks},
            "metrics": trainer.metrics_log.rows,
        }
