"""The loops a Trainer call runs: fitting (epochs of batches, validation between), evaluation
(validate, test) and prediction. The per-batch path of fitting stays lean: no host sync (no
``.item()``) unless a value logged ``on_step`` is due, and hooks no callback overrides cost nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from . import data
from .callbacks import Hooks
from .checkpoint import restore_rng, rng_state
from .manual import ManualOptimizer
from .metrics import StageLog
from .module import Module
from .optim import Optimization, clip_gradients
from .precision import Precision
from .ranks import Ranks

if TYPE_CHECKING:
    from .trainer import Trainer

CPU = torch.device("cpu")


@dataclass
class Session:
    """Where one Trainer call runs: this process's rank, its device, precision and callbacks."""

    ranks: Ranks
    device: torch.device
    precision: Precision
    hooks: Hooks


class _TrainingStep(torch.nn.Module):
    """Calls ``training_step`` as a forward pass: DDP arms its gradient all-reduce in ``forward``."""

    def __init__(self, module: Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: Any, batch_idx: int) -> Any:
        return self.module.training_step(batch, batch_idx)


class FitLoop:
    """Epochs of training batches, with validation and checkpoints between them; resumable at
    any optimizer step (see :meth:`state` for what a checkpoint holds of it)."""

    def __init__(
        self,
        trainer: Trainer,
        session: Session,
        module: Module,
        train: DataLoader[Any],
        val: DataLoader[Any] | None,
        optim: Optimization,
        seed: int,
    ) -> None:
        self.trainer = trainer
        self.session = session
        self.module = module
        self.optim = optim
        self.seed = seed
        ranks = session.ranks
        self.train = data.for_training(train, seed=seed, rank=ranks.rank, world_size=ranks.world_size)
        self.val = (
            data.for_evaluation(val, rank=ranks.rank, world_size=ranks.world_size)
            if val is not None and trainer.limit_val_batches != 0
            else None
        )
        #: How many of its batches each validation runs (None: all, however many).
        self.val_batches = (
            data.limited(data.length(self.val), trainer.limit_val_batches, "limit_val_batches")
            if self.val is not None
            else None
        )
        self.sink = StageLog(training=True, ranks=ranks, device=session.device)
        #: The module steps its optimizers itself (``automatic_optimization = False``).
        self.manual = not module.automatic_optimization
        self.manual_optimizers = [ManualOptimizer(self, optimizer) for optimizer in optim.optimizers]
        self.batches_done = 0  # of the current epoch
        self.epoch_finished = False
        self.accumulated = False  # gradients are waiting for the rest of their accumulation
        self.parameters = [parameter for parameter in module.parameters() if parameter.requires_grad]
        self.ddp: DistributedDataParallel | None = None
        self.step: Callable[[Any, int], Any] = module.training_step
        # Looked up once, not on every step.
        self.in_context = session.precision.has_context
        self.scaler = session.precision.scaler
        hooks = session.hooks.by_name
        self.before_zero_grad = hooks["on_before_zero_grad"]
        self.before_backward, self.after_backward = hooks["on_before_backward"], hooks["on_after_backward"]
        self.before_optimizer_step = hooks["on_before_optimizer_step"]

    # -- checkpoints

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds of the fit, besides the module, callbacks and metrics."""
        trainer, optim = self.trainer, self.optim
        epoch, batch = (
            (trainer.current_epoch + 1, 0)
            if self.epoch_finished
            else (trainer.current_epoch, self.batches_done)
        )
        scaler = self.scaler
        return {
            "epoch": epoch,
            "batch": batch,
            "global_step": trainer.global_step,
            "should_stop": trainer.should_stop,
            "seed": self.seed,
            **optim.state(),
            "scaler": scaler.state_dict() if scaler is not None else None,
        }

    def rank_state(self) -> dict[str, Any]:
        """What differs between ranks: random number generators, this epoch's sums so far."""
        return {"rng": rng_state(), "means": self.sink.epoch.state()}

    def restore(self, checkpoint: dict[str, Any]) -> None:
        trainer, optim = self.trainer, self.optim
        self.module.load_state_dict(checkpoint["state_dict"])
        optim.restore(checkpoint)
        scaler = self.scaler
        if scaler is not None and checkpoint["scaler"] is not None:
            scaler.load_state_dict(checkpoint["scaler"])
        trainer.current_epoch, self.batches_done = checkpoint["epoch"], checkpoint["batch"]
        trainer.global_step, trainer.should_stop = checkpoint["global_step"], checkpoint["should_stop"]
        ranks = checkpoint["ranks"]
        # A run resumed on fewer ranks than it was saved from gives the extra ranks' state to none;
        # on more, the new ranks start their generators afresh.
        if self.session.ranks.rank < len(ranks):
            mine = ranks[self.session.ranks.rank]
            self.sink.epoch.load_state(mine["means"])
            restore_rng(mine["rng"])

    # -- the loop

    def run(self) -> None:
        session = self.session
        if session.ranks.distributed and not self.manual:  # manual: ManualOptimizer averages gradients
            device_ids = [session.device.index] if session.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(
                _TrainingStep(self.module),
                device_ids=device_ids,
                find_unused_parameters=self.trainer.strategy == "ddp_find_unused_parameters_true",
            )
            self.step = self.ddp
        try:
            while not self.done():
                self.epoch()
        finally:
            # The trainer keeps its loop for checkpoints; a DDP wrapper that outlives the fit holds
            # the process group into the interpreter's teardown, where gloo's threads abort it.
            self.ddp = None
            self.step = self.module.training_step

    def done(self) -> bool:
        trainer = self.trainer
        return (
            trainer.should_stop
            or (trainer.max_steps is not None and trainer.global_step >= trainer.max_steps)
            or (trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs)
        )

    def epoch(self) -> None:
        trainer, module = self.trainer, self.module
        first = self.batches_done
        to_draw = data.start_epoch(self.train, trainer.current_epoch, first)
        remaining = data.length(self.train)
        # Our sampler already leaves out the batches done; another loader still counts them.
        whole = None if remaining is None else remaining + first - to_draw
        total = data.limited(whole, trainer.limit_train_batches, "limit_train_batches")
        trainer.num_training_batches = total
        trainer.epoch_metrics = {}
        self.session.hooks.call("on_train_epoch_start", trainer, module)
        module.train()
        module._log_sink = self.sink
        self.sink.in_batches = True
        self.batches(first, to_draw, total, cut=total != whole)
        self.sink.in_batches = False
        self.end_epoch()

    def batches(self, first: int, to_draw: int, total: int | None, cut: bool) -> None:
        trainer, module, sink, device = self.trainer, self.module, self.sink, self.session.device
        batch_start = self.session.hooks.by_name["on_train_batch_start"]
        batch_end = self.session.hooks.by_name["on_train_batch_end"]
        accumulate, log_every, max_steps = (
            trainer.accumulate_grad_batches,
            trainer.log_every_n_steps,
            trainer.max_steps,
        )
        val_every = self._val_every(total) if self.val is not None else None
        move = device.type != "cpu"
        convert = self.session.precision.true_dtype is not None
        self.epoch_finished = False
        batches: Iterator[Any] = iter(self.train)
        for _ in range(to_draw):
            next(batches)
        if cut and total is not None:  # limit_train_batches: the epoch ends early
            batches = islice(batches, max(0, total - first))
        for batch_idx, loaded in enumerate(batches, start=first):
            batch = data.to_device(loaded, device) if move else loaded
            if convert:
                batch = self.session.precision.convert_input(batch)
            sink.batch = batch
            sink.step_due = (batch_idx + 1) % log_every == 0
            for hook in batch_start:
                hook(trainer, module, batch, batch_idx)
            if self.manual:  # the module steps its optimizers itself
                output = self.forward(batch, batch_idx)
            else:
                output = self.automatic(batch, batch_idx, accumulate, total)
            self.batches_done = batch_idx + 1
            if sink.step:
                trainer.metrics_log.hidden |= sink.hidden
                trainer.callback_metrics.update(sink.step)
                trainer.metrics_log.add(trainer.current_epoch, trainer.global_step, sink.step)
                sink.step = {}
            for hook in batch_end:
                hook(trainer, module, output, batch, batch_idx)
            if val_every is not None and self.batches_done % val_every == 0 and self.batches_done != total:
                self.validate(mid_epoch=True)
            if max_steps is not None and trainer.global_step >= max_steps:
                self.epoch_finished = self.batches_done == total  # at its last batch, the epoch is done
                return
        self.epoch_finished = True

    def automatic(self, batch: Any, batch_idx: int, accumulate: int, total: int | None) -> Any:
        """One batch's forward and backward, and the optimizer step at an accumulation's end."""
        boundary = (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == total
        if self.ddp is not None and not boundary:
            # Gradients stay local until the accumulation's last micro-batch: one all-reduce.
            with self.ddp.no_sync():
                output = self.forward_backward(batch, batch_idx, accumulate)
        else:
            output = self.forward_backward(batch, batch_idx, accumulate)
        self.accumulated = not boundary
        if boundary:
            self.optimizer_step()
        return output

    def forward(self, batch: Any, batch_idx: int) -> Any:
        if self.in_context:
            with self.session.precision.autocast():
                return self.step(batch, batch_idx)
        return self.step(batch, batch_idx)

    def forward_backward(self, batch: Any, batch_idx: int, accumulate: int) -> Any:
        output = self.forward(batch, batch_idx)
        loss = output if isinstance(output, torch.Tensor) else _loss_of(output)
        if accumulate > 1:
            loss = loss / accumulate
        trainer, module = self.trainer, self.module
        if not self.accumulated:  # the first batch of an accumulation: the last step's gradients go
            optimizer = self.optim.optimizer
            for hook in self.before_zero_grad:
                hook(trainer, module, optimizer)
            optimizer.zero_grad(set_to_none=True)
        for hook in self.before_backward:
            hook(trainer, module, loss)
        scaler = self.scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()  # type: ignore[no-untyped-call]
        for hook in self.after_backward:
            hook(trainer, module)
        return output

    def optimizer_step(self) -> None:
        trainer, optim = self.trainer, self.optim
        optimizer, scaler = optim.optimizer, self.scaler
        if trainer.gradient_clip_val is not None:
            clip_gradients(
                optimizer, self.parameters, trainer.gradient_clip_val, trainer.gradient_clip_algorithm, scaler
            )
        for hook in self.before_optimizer_step:
            hook(trainer, self.module, optimizer)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        self.accumulated = False
        trainer.global_step += 1
        if optim.scheduler is not None:
            optim.step_scheduler("step", trainer.global_step, trainer.callback_metrics)

    def end_epoch(self) -> None:
        trainer, module, session = self.trainer, self.module, self.session
        if self.accumulated:  # a loader with no length ended part-way through an accumulation
            self.optimizer_step()
        sink = self.sink
        means = sink.epoch.reduce(session.ranks, session.device)
        trainer.prog_bar_metrics |= sink.prog_bar
        trainer.metrics_log.hidden |= sink.hidden
        trainer.epoch_metrics.update(means)
        trainer.step_metrics = sink.take_latest()
        trainer.callback_metrics.update(trainer.step_metrics)
        trainer.callback_metrics.update(means)
        trainer.callback_metrics.update(sink.aliases(means))
        stopping = trainer.max_steps is not None and trainer.global_step >= trainer.max_steps
        due = (trainer.current_epoch + 1) % trainer.check_val_every_n_epoch == 0
        if self.val is not None and ((self.epoch_finished and due) or stopping):
            self.validate()
        if self.epoch_finished:
            self.optim.step_scheduler("epoch", trainer.current_epoch + 1, trainer.epoch_metrics)
        log = trainer.metrics_log
        # The row is in the log while the hooks run, so a checkpoint saved by one includes it,
        # and values they log (Trainer.log_value) land in it.
        log.current = log.add(
            trainer.current_epoch, trainer.global_step, trainer.epoch_metrics, epoch_end=True
        )
        hooks = session.hooks
        hooks.call("on_train_epoch_end", trainer, module)
        if hooks.by_name["on_train_epoch_end"]:  # on every rank alike: the same callbacks and module
            # What they logged counts in the epoch's metrics, before the callbacks that monitor one.
            late = sink.epoch.reduce(session.ranks, session.device)
            log.hidden |= sink.hidden
            for metrics in (trainer.epoch_metrics, trainer.callback_metrics):
                metrics.update(late)
            log.current.update((name, value) for name, value in late.items() if name not in log.hidden)
            trainer.callback_metrics.update(sink.aliases(late))
        for hook in hooks.monitoring_epoch_end:
            hook(trainer, module)
        log.current = None
        log.write()
        # Every rank stops after the same epoch, whichever rank asked.
        trainer.should_stop = session.ranks.any(trainer.should_stop, session.device)
        if self.epoch_finished:
            trainer.current_epoch += 1
            self.batches_done = 0
            self.epoch_finished = False

    def validate(self, mid_epoch: bool = False) -> None:
        assert self.val is not None
        trainer = self.trainer
        # A validation part-way through the epoch has a row of its own; the epoch's end sees only
        # what was validated at that end.
        limit = self.val_batches
        metrics = evaluate(trainer, self.session, self.module, self.val, "validate", not mid_epoch, limit)
        self.module.train()
        self.module._log_sink = self.sink
        if mid_epoch:
            trainer.metrics_log.add(trainer.current_epoch, trainer.global_step, metrics)
            trainer.metrics_log.write()

    def sanity_check(self) -> None:
        """Lightning's sanity check before the first epoch: ``num_sanity_val_steps`` validation
        batches (-1: every one), between ``on_sanity_check_start`` and ``_end``, whose metrics are
        dropped and which leave the random generators as they were."""
        trainer, module, hooks = self.trainer, self.module, self.session.hooks
        steps, limit = trainer.num_sanity_val_steps, self.val_batches
        if self.val is None or steps == 0:
            return
        count = limit if steps < 0 else steps if limit is None else min(steps, limit)
        generators, metrics, prog_bar = rng_state(), trainer.callback_metrics, trainer.prog_bar_metrics
        trainer.callback_metrics, trainer.prog_bar_metrics = dict(metrics), set(prog_bar)
        trainer.sanity_checking = True
        try:
            hooks.call("on_sanity_check_start", trainer, module)
            evaluate(trainer, self.session, module, self.val, "validate", of_epoch=False, limit=count)
            hooks.call("on_sanity_check_end", trainer, module)
        finally:
            trainer.sanity_checking = False
            trainer.callback_metrics, trainer.prog_bar_metrics = metrics, prog_bar
            restore_rng(generators)

    def _val_every(self, total: int | None) -> int | None:
        """Validate every this many batches within an epoch (None: only at its end)."""
        interval = self.trainer.val_check_interval
        if isinstance(interval, float):
            if interval >= 1.0:
                return None
            if total is None:
                raise ValueError("val_check_interval as a fraction of an epoch needs a loader with a length")
            return max(1, int(total * interval))
        return interval


def _loss_of(output: Any) -> torch.Tensor:
    loss = output.get("loss") if isinstance(output, dict) else None
    if isinstance(loss, torch.Tensor):
        return loss
    raise TypeError(f'training_step must return the loss, or a dict holding it as "loss", not {output!r}')


def evaluate(
    trainer: Trainer,
    session: Session,
    module: Module,
    loader: DataLoader[Any],
    stage: Literal["validate", "test"],
    of_epoch: bool = True,
    limit: int | None = None,
) -> dict[str, float]:
    """Run ``validation_step`` or ``test_step`` over ``loader`` (its first ``limit`` batches); the
    logged means, over every rank, also in ``trainer.epoch_metrics`` when ``of_epoch``."""
    hook = "validation" if stage == "validate" else "test"
    step = module.validation_step if stage == "validate" else module.test_step
    sink = StageLog(training=False, ranks=session.ranks, device=session.device)
    previous, module._log_sink = module._log_sink, sink
    training = module.training
    module.eval()
    device, hooks = session.device, session.hooks
    batch_start, batch_end = hooks.by_name[f"on_{hook}_batch_start"], hooks.by_name[f"on_{hook}_batch_end"]
    hooks.call(f"on_{hook}_start", trainer, module)
    hooks.call(f"on_{hook}_epoch_start", trainer, module)
    with torch.no_grad():
        for batch_idx, loaded in enumerate(_first(loader, limit)):
            batch = data.to_device(loaded, device) if device.type != "cpu" else loaded
            batch = session.precision.convert_input(batch)
            sink.batch = batch
            for callback in batch_start:
                callback(trainer, module, batch, batch_idx)
            with session.precision.autocast():
                output = step(batch, batch_idx)
            for callback in batch_end:
                callback(trainer, module, output, batch, batch_idx)
        hooks.call(f"on_{hook}_epoch_end", trainer, module)  # what it logs counts in the means
    metrics = sink.epoch.reduce(session.ranks, device)
    module.train(training)
    module._log_sink = previous
    trainer.prog_bar_metrics |= sink.prog_bar
    trainer.metrics_log.hidden |= sink.hidden
    if of_epoch:
        trainer.epoch_metrics.update(metrics)
    trainer.callback_metrics.update(metrics)
    trainer.callback_metrics.update(sink.aliases(metrics))
    hooks.call(f"on_{hook}_end", trainer, module)
    return metrics


def predict(
    trainer: Trainer, session: Session, module: Module, loader: DataLoader[Any], limit: int | None = None
) -> list[Any]:
    """``predict_step`` of every batch (the first ``limit``), on the CPU, in the loader's order
    (gathered from every rank)."""
    outputs: list[Any] = []
    training = module.training
    module.eval()
    device, hooks = session.device, session.hooks
    batch_start, batch_end = hooks.by_name["on_predict_batch_start"], hooks.by_name["on_predict_batch_end"]
    hooks.call("on_predict_start", trainer, module)
    hooks.call("on_predict_epoch_start", trainer, module)
    with torch.no_grad():
        for batch_idx, loaded in enumerate(_first(loader, limit)):
            batch = data.to_device(loaded, device) if device.type != "cpu" else loaded
            batch = session.precision.convert_input(batch)
            for callback in batch_start:
                callback(trainer, module, batch, batch_idx)
            with session.precision.autocast():
                output = module.predict_step(batch, batch_idx)
            for callback in batch_end:
                callback(trainer, module, output, batch, batch_idx)
            outputs.append(data.to_device(output, CPU))
        hooks.call("on_predict_epoch_end", trainer, module)
    module.train(training)
    hooks.call("on_predict_end", trainer, module)
    if session.ranks.distributed:
        # Each rank predicted a contiguous slice, so rank order is the loader's order.
        outputs = [output for part in session.ranks.gather(outputs) for output in part]
    return outputs


def _first(loader: Iterable[Any], limit: int | None) -> Iterable[Any]:
    return loader if limit is None else islice(loader, limit)
