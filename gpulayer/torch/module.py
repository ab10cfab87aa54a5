"""``gl.torch.Module``: a ``torch.nn.Module`` that also says how to train, evaluate and predict."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .data_module import DataHooks
from .loggers import Logger
from .metrics import StageLog
from .optim import Optimizers

if TYPE_CHECKING:
    from .trainer import Trainer


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
        on_step: bool = False,
        on_epoch: bool = True,
        prog_bar: bool = False,
        batch_size: int | None = None,
    ) -> None:
        """Record a scalar metric from a step.

        ``on_epoch``: its mean over the epoch (weighted by batch size; ``batch_size`` overrides the
        size read from the batch), over every rank's batches. ``on_step``: its value every
        ``log_every_n_steps`` training steps, this rank's. With both, it is recorded as
        ``<name>_epoch`` and ``<name>_step``. ``prog_bar``: shown by the progress bar. Outside a
        step the Trainer runs, it does nothing.
        """
        sink = self._log_sink
        if sink is not None:
            sink.log(name, value, on_step, on_epoch, prog_bar, batch_size)

    def log_dict(
        self,
        values: dict[str, torch.Tensor | float],
        *,
        on_step: bool = False,
        on_epoch: bool = True,
        prog_bar: bool = False,
        batch_size: int | None = None,
    ) -> None:
        for name, value in values.items():
            self.log(
                name, value, on_step=on_step, on_epoch=on_epoch, prog_bar=prog_bar, batch_size=batch_size
            )

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
