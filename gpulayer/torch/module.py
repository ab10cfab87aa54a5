"""``gl.torch.Module``: a ``torch.nn.Module`` that also says how to train, evaluate and predict."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch
from torch.optim.lr_scheduler import LRScheduler

from . import checkpoint, manual
from .data_module import DataHooks
from .loggers import Logger
from .manual import ManualOptimizer
from .metrics import Reduce, StageLog, reduce_kind
from .optim import Optimizers, clip_gradients

if TYPE_CHECKING:
    from .loops import FitLoop
    from .trainer import Trainer

M = TypeVar("M", bound="Module")


class AttributeDict(dict[str, Any]):
    """A dict whose keys read as attributes too (``self.hparams.lr``), as Lightning's."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no hyperparameter {name!r} (saved: {', '.join(self) or 'none'})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


class Module(DataHooks, torch.nn.Module):
    """Subclass it, build layers in ``__init__`` (after ``super().__init__()``), and define at least
    ``training_step`` and ``configure_optimizers``::

        class Regression(gl.torch.Module):
            def __init__(self) -> None:
                super().__init__()
                self.net = torch.nn.Linear(8, 1)

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = torch.nn.functional.mse_loss(self.net(x), y)
                self.log("train_loss", loss)
                return loss

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

    The ``*_dataloader`` methods give the data a ``Trainer`` call uses when it is passed none.
    """

    #: False: ``training_step`` runs its own backward passes and optimizer steps, through
    #: ``self.optimizers()`` and ``self.manual_backward(loss)`` (several optimizers, a GAN's).
    automatic_optimization = True

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Trainer | None = None
        self._log_sink: StageLog | None = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | dict[str, Any]:
        """The loss of one batch (or a dict holding it under ``"loss"``)."""
        raise NotImplementedError(f"{type(self).__name__} needs a training_step to be fitted")

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """Log validation metrics for one batch; runs without gradients, in eval mode."""
        raise NotImplementedError(f"{type(self).__name__} needs a validation_step to be validated")

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        """Log test metrics for one batch; runs without gradients, in eval mode."""
        raise NotImplementedError(f"{type(self).__name__} needs a test_step to be tested")

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        """The prediction for one batch: by default, the module called on it."""
        return self(batch)

    def configure_optimizers(self) -> Optimizers:
        """An optimizer; ``(optimizer, scheduler)``; or ``{"optimizer": o, "lr_scheduler": s}`` where
        ``s`` may be ``{"scheduler": s, "interval": "epoch" | "step", "frequency": 1, "monitor": name}``
        (a ``ReduceLROnPlateau`` needs ``monitor``)."""
        raise NotImplementedError(f"{type(self).__name__} needs configure_optimizers to be fitted")

    # -- hooks: each runs on every rank, after the callbacks' hook of the same name (but
    # ``on_train_epoch_end``: before the callbacks that monitor a metric, so that they see what it
    # logs). The order is Lightning's: docs/trainer.md.

    def setup(self, stage: str) -> None:
        """Before ``fit``, ``validate``, ``test`` or ``predict`` starts, on the module's device."""

    def teardown(self, stage: str) -> None:
        """After it ended, even by an exception."""

    def on_fit_start(self) -> None: ...

    def on_fit_end(self) -> None: ...

    def on_train_start(self) -> None: ...

    def on_train_end(self) -> None: ...

    def on_train_epoch_start(self) -> None: ...

    def on_train_epoch_end(self) -> None:
        """After the epoch's validation; what it logs counts in the epoch's metrics."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None: ...

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...

    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...

    def on_before_backward(self, loss: torch.Tensor) -> None: ...

    def on_after_backward(self) -> None: ...

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...

    def on_validation_start(self) -> None: ...

    def on_validation_end(self) -> None: ...

    def on_validation_epoch_start(self) -> None: ...

    def on_validation_epoch_end(self) -> None:
        """After the last batch; what it logs counts in the validation's metrics."""

    def on_validation_batch_start(self, batch: Any, batch_idx: int) -> None: ...

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...

    def on_test_start(self) -> None: ...

    def on_test_end(self) -> None: ...

    def on_test_epoch_start(self) -> None: ...

    def on_test_epoch_end(self) -> None:
        """After the last batch; what it logs counts in the test's metrics."""

    def on_test_batch_start(self, batch: Any, batch_idx: int) -> None: ...

    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...

    def on_predict_start(self) -> None: ...

    def on_predict_end(self) -> None: ...

    def on_predict_epoch_start(self) -> None: ...

    def on_predict_epoch_end(self) -> None: ...

    def on_predict_batch_start(self, batch: Any, batch_idx: int) -> None: ...

    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...

    def log(
        self,
        name: str,
        value: torch.Tensor | float,
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        logger: bool = True,
        reduce_fx: Reduce | Callable[..., Any] = "mean",
        sync_dist: bool = False,
        batch_size: int | None = None,
    ) -> None:
        """Record a scalar metric, as Lightning's ``log``.

        ``on_step``: its value every ``log_every_n_steps`` training steps (this rank's, or with
        ``sync_dist`` reduced over ranks). ``on_epoch``: its epoch's values reduced by ``reduce_fx``
        (``"mean"``, weighted by batch size, ``"sum"``, ``"max"``, ``"min"``, or torch's functions of
        those), over every rank's batches (always: ``sync_dist`` is implied). The defaults are
        Lightning's: per step inside a training batch (``training_step`` and the batch hooks), per
        epoch elsewhere. With both, it is recorded as ``<name>_step`` and ``<name>_epoch`` (and the
        callbacks see ``<name>``). ``prog_bar``: shown by the progress bar. ``logger=False``: seen by
        callbacks, left out of the metrics files. Outside a step the Trainer runs, it does nothing.
        """
        sink = self._log_sink
        if sink is not None:
            kind = reduce_fx if reduce_fx == "mean" else reduce_kind(reduce_fx)
            sink.log(name, value, on_step, on_epoch, prog_bar, batch_size, kind, sync_dist, logger)

    def log_dict(
        self,
        dictionary: Mapping[str, torch.Tensor | float],
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        logger: bool = True,
        reduce_fx: Reduce | Callable[..., Any] = "mean",
        sync_dist: bool = False,
        batch_size: int | None = None,
    ) -> None:
        """``log`` of each of ``dictionary``'s values, under its key."""
        for name, value in dictionary.items():
            self.log(name, value, on_step=on_step, on_epoch=on_epoch, prog_bar=prog_bar, logger=logger,
                     reduce_fx=reduce_fx, sync_dist=sync_dist, batch_size=batch_size)  # fmt: skip

    # -- hyperparameters

    def save_hyperparameters(self, *args: Any, ignore: Sequence[str] | str | None = None) -> None:
        """Keep the arguments of ``__init__`` (of this class and the ones it inherits from) in
        ``self.hparams``; checkpoints hold them, so ``load_from_checkpoint`` builds the module again.
        ``args``: only these names, or one dict (or ``argparse.Namespace``) to keep instead.
        ``ignore``: names to leave out (a module or tensor given to ``__init__``, for instance)."""
        if len(args) == 1 and not isinstance(args[0], str):
            given = args[0]
            found = dict(given if isinstance(given, Mapping) else vars(given))
        else:
            found = _init_arguments(self, inspect.currentframe())
            if args:
                found = {name: found[name] for name in args}
        skipped = {ignore} if isinstance(ignore, str) else set(ignore or ())
        self._hparams = AttributeDict({k: v for k, v in found.items() if k not in skipped})

    @property
    def hparams(self) -> AttributeDict:
        """What ``save_hyperparameters`` kept (empty until it is called)."""
        hparams: AttributeDict | None = self.__dict__.get("_hparams")
        if hparams is None:
            hparams = self._hparams = AttributeDict()
        return hparams

    @classmethod
    def load_from_checkpoint(
        cls: type[M],
        checkpoint_path: str | Path,
        map_location: str | torch.device | None = None,
        strict: bool = True,
        **kwargs: Any,
    ) -> M:
        """A module of this class built from a checkpoint's hyperparameters (``kwargs`` add or
        replace some: those ``save_hyperparameters`` ignored, for instance), with its weights, in
        eval mode. Reads checkpoints of ``gl.torch`` and of Lightning, without running their code."""
        saved = checkpoint.load_weights(Path(checkpoint_path))
        module = cls(**{**saved.get("hyper_parameters", {}), **kwargs})
        module.load_state_dict(saved["state_dict"], strict=strict)
        if map_location is not None:
            module.to(map_location)
        return module.eval()

    # -- where it is

    @property
    def device(self) -> torch.device:
        """Where its parameters (else its buffers) are; the CPU when it has neither."""
        for tensor in itertools.chain(self.parameters(), self.buffers()):
            return tensor.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        for tensor in itertools.chain(self.parameters(), self.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
        return torch.get_default_dtype()

    # -- manual optimization (``automatic_optimization = False``)

    def optimizers(self) -> ManualOptimizer | list[ManualOptimizer]:
        """The optimizers ``configure_optimizers`` returned (one, or a list of several), whose
        ``step`` averages gradients over ranks, runs the hooks and counts ``global_step``."""
        optimizers = self._manual().manual_optimizers
        return optimizers[0] if len(optimizers) == 1 else optimizers

    def lr_schedulers(self) -> LRScheduler | list[LRScheduler] | None:
        """Its schedulers (one, a list, or None); with manual optimization, yours to step."""
        loop = self.trainer._fit
        schedulers = loop.optim.schedulers if loop is not None else []
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``loss.backward()`` with the backward hooks and, for ``16-mixed``, the gradient scaler."""
        manual.backward(self._manual(), loss, *args, **kwargs)

    def clip_gradients(
        self,
        optimizer: torch.optim.Optimizer | ManualOptimizer,
        gradient_clip_val: float,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    ) -> None:
        """Clip the gradients of ``optimizer``'s parameters (unscaled first, for ``16-mixed``)."""
        loop = self._manual()
        bare = optimizer.optimizer if isinstance(optimizer, ManualOptimizer) else optimizer
        parameters = [p for group in bare.param_groups for p in group["params"]]
        clip_gradients(bare, parameters, gradient_clip_val, gradient_clip_algorithm, loop.scaler)

    def toggle_optimizer(self, optimizer: torch.optim.Optimizer | ManualOptimizer) -> None:
        """Only ``optimizer``'s parameters require gradients until ``untoggle_optimizer``: a backward
        pass for one optimizer's loss computes no gradients for the others' parameters."""
        bare = optimizer.optimizer if isinstance(optimizer, ManualOptimizer) else optimizer
        own = {id(p) for group in bare.param_groups for p in group["params"]}
        self._toggled = {p: p.requires_grad for p in self.parameters()}
        for parameter in self.parameters():
            parameter.requires_grad = parameter.requires_grad and id(parameter) in own

    def untoggle_optimizer(self, optimizer: torch.optim.Optimizer | ManualOptimizer) -> None:
        for parameter, required in self.__dict__.pop("_toggled", {}).items():
            parameter.requires_grad = required

    def _manual(self) -> FitLoop:
        loop = self.trainer._fit
        if loop is None or self.trainer.stage != "fit":
            raise RuntimeError("optimizers(), manual_backward() and clip_gradients() work during fit")
        return loop

    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer")
        return self._trainer

    @property
    def logger(self) -> Logger | None:
        """The trainer's first logger (None outside a call, or with ``logger=False``)."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list[Logger]:
        return self._trainer.loggers if self._trainer is not None else []

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0


def _init_arguments(module: Module, frame: FrameType | None) -> dict[str, Any]:
    """The arguments of every ``__init__`` of ``module`` being run, outermost (the subclass's) last,
    so that its values win; ``**kwargs`` are spread, ``*args`` left out."""
    found: list[dict[str, Any]] = []
    frame = frame.f_back if frame is not None else None
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is module:
        info = inspect.getargvalues(frame)
        arguments = {name: info.locals[name] for name in info.args[1:]}
        if info.keywords:
            arguments.update(info.locals[info.keywords])
        found.append(arguments)
        frame = frame.f_back
    merged: dict[str, Any] = {}
    for arguments in found:
        merged.update(arguments)
    return merged
