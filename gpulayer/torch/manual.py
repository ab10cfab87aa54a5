"""Manual optimization (``automatic_optimization = False``): the module runs its own backward passes
and optimizer steps in ``training_step``, through what the Trainer hands it, so that mixed precision,
hooks, step counting and data parallelism still hold."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

if TYPE_CHECKING:
    from .loops import FitLoop


class ManualOptimizer:
    """An optimizer as ``Module.optimizers()`` gives it: ``step`` runs the ``on_before_optimizer_step``
    hooks, applies the gradient scaler, and counts a step in ``trainer.global_step``; everything
    else is the optimizer's own."""

    def __init__(self, loop: FitLoop, optimizer: Optimizer) -> None:
        self._loop = loop
        self.optimizer = optimizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"ManualOptimizer({self.optimizer!r})"

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        loop, optimizer = self._loop, self.optimizer
        if closure is not None:
            closure()  # as Lightning's: the closure runs the forward and backward, once, before the step
        trainer = loop.trainer
        for hook in loop.before_optimizer_step:
            hook(trainer, loop.module, optimizer)
        scaler = loop.scaler
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        trainer.global_step += 1


def backward(loop: FitLoop, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """``Module.manual_backward``: the backward hooks around ``loss.backward``, scaled for 16-mixed,
    and with several ranks the gradients averaged over them."""
    trainer, module = loop.trainer, loop.module
    for hook in loop.before_backward:
        hook(trainer, module, loss)
    scaler = loop.scaler
    (scaler.scale(loss) if scaler is not None else loss).backward(*args, **kwargs)  # type: ignore[no-untyped-call]
    ranks = loop.session.ranks
    if ranks.distributed:
        # No DDP wrapper with manual optimization (a step may run several backward passes, which
        # DDP's reducer refuses): each backward's gradients are averaged here, in one all-reduce.
        # Averaging the sum is right even when gradients accumulate over several backward passes:
        # what an earlier one left is the same on every rank.
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        if grads:
            flat = torch.cat([grad.reshape(-1) for grad in grads])
            ranks.sum(flat).div_(ranks.world_size)
            offset = 0
            for grad in grads:
                grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()
    for hook in loop.after_backward:
        hook(trainer, module)
