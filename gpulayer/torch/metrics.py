"""What ``Module.log`` records, reduced over ranks, and the rows of them rank 0's loggers get.

A value logged ``on_epoch`` is kept on its device, unread, until the epoch ends: then every rank's
weighted sums are added up in one collective and divided, so the epoch's value is the mean over
every sample any rank saw. A value logged ``on_step`` is read (a host sync) only on the steps
that are due, every ``log_every_n_steps``, and is this rank's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .data import batch_size
from .loggers import Logger, MetricsFiles, Row
from .ranks import Ranks

#: Values queued per metric before they are folded into its running sum (one stack, one sum).
FOLD_EVERY = 1024


class Mean:
    """A weighted mean of values that may live on a device, read only at the end."""

    __slots__ = ("float_sum", "queued", "sum", "weight", "weights")

    def __init__(self) -> None:
        self.queued: list[torch.Tensor] = []
        self.weights: list[int] = []
        self.sum: torch.Tensor | None = None
        self.float_sum = 0.0
        self.weight = 0

    def add(self, value: torch.Tensor | float, weight: int) -> None:
        if isinstance(value, torch.Tensor):
            self.queued.append(value.detach())
            self.weights.append(weight)
            if len(self.queued) >= FOLD_EVERY:
                self.fold()
        else:
            self.float_sum += float(value) * weight
        self.weight += weight

    def fold(self) -> None:
        if not self.queued:
            return
        try:  # one op for the usual scalars; values of other shapes (a 1-element tensor) one by one
            values = torch.stack(self.queued).float().reshape(-1)
        except RuntimeError:
            values = torch.stack([value.float().reshape(()) for value in self.queued])
        weights = torch.tensor(self.weights, dtype=values.dtype, device=values.device)
        folded = (values * weights).sum()
        self.sum = folded if self.sum is None else self.sum + folded
        self.queued.clear()
        self.weights.clear()

    def total(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The weighted sum, as a tensor on ``device``."""
        self.fold()
        total = torch.tensor(self.float_sum, dtype=dtype, device=device)
        if self.sum is not None:
            total = total + self.sum.to(device=device, dtype=dtype)
        return total


class EpochMeans:
    """Every ``on_epoch`` value one stage logged this epoch, by name."""

    def __init__(self) -> None:
        self.means: dict[str, Mean] = {}

    def add(self, name: str, value: torch.Tensor | float, weight: int) -> None:
        mean = self.means.get(name)
        if mean is None:
            mean = self.means[name] = Mean()
        mean.add(value, weight)

    def reduce(self, ranks: Ranks, device: torch.device) -> dict[str, float]:
        """The means over every rank's samples; a collective every rank must call, and then reset.

        Ranks may have logged different names (a metric logged only on some batches), so the names
        are agreed first; a rank that lacks one adds zero to both its sum and its weight.
        """
        names = sorted(self.means)
        if ranks.distributed:
            names = sorted(set().union(*ranks.gather(names)))
        if not names:
            return {}
        dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        zero = torch.zeros((), dtype=dtype, device=device)
        sums = [self.means[name].total(device, dtype) if name in self.means else zero for name in names]
        weights = [float(self.means[name].weight) if name in self.means else 0.0 for name in names]
        packed = torch.cat([torch.stack(sums), torch.tensor(weights, dtype=dtype, device=device)])
        ranks.sum(packed)
        values = packed.tolist()
        count = len(names)
        self.means.clear()
        return {name: values[i] / values[count + i] for i, name in enumerate(names) if values[count + i]}

    def state(self) -> dict[str, tuple[float, int]]:
        """This rank's sums and weights so far (for a checkpoint taken part-way through an epoch)."""
        cpu = torch.device("cpu")
        return {
            name: (float(mean.total(cpu, torch.float64)), mean.weight) for name, mean in self.means.items()
        }

    def load_state(self, state: dict[str, tuple[float, int]]) -> None:
        self.means.clear()
        for name, (total, weight) in state.items():
            mean = self.means[name] = Mean()
            mean.float_sum, mean.weight = total, weight


class StageLog:
    """Where ``Module.log`` sends values while the Trainer runs one stage (train, validate, test)."""

    __slots__ = ("batch", "epoch", "prog_bar", "step", "step_due", "training")

    def __init__(self, training: bool) -> None:
        self.training = training
        self.epoch = EpochMeans()
        self.step: dict[str, float] = {}
        self.step_due = False
        self.prog_bar: set[str] = set()
        self.batch: Any = None

    def log(
        self,
        name: str,
        value: torch.Tensor | float,
        on_step: bool,
        on_epoch: bool,
        prog_bar: bool,
        weight: int | None,
    ) -> None:
        epoch_name = step_name = name
        if on_step and on_epoch:
            epoch_name, step_name = f"{name}_epoch", f"{name}_step"
        if on_epoch:
            self.epoch.add(epoch_name, value, weight if weight is not None else batch_size(self.batch))
        # Step values exist in training only, and are read only on the steps that are due.
        if on_step and self.training and self.step_due:
            # Detached: a loss still in its graph is read as a number, without torch's warning.
            self.step[step_name] = float(value.detach() if isinstance(value, torch.Tensor) else value)
        if prog_bar:
            self.prog_bar.add(epoch_name if on_epoch else step_name)


class MetricsLog:
    """The run's rows of metrics, each ``{"epoch", "step", name: value, ...}``, and (on rank 0) the
    loggers each row reaches once (see ``loggers.py``; the default writes ``metrics.json`` and
    ``metrics.csv`` in the run folder).

    A row is added at the end of every epoch, after a validation part-way through one, every
    ``log_every_n_steps`` steps that logged ``on_step`` values, and by ``validate`` and ``test``.
    The rows not yet logged go to the loggers at each epoch's end and after each validation.
    """

    def __init__(self, rows: list[Row] | None = None) -> None:
        self.rows: list[Row] = list(rows or [])
        #: Values given to ``Trainer.log_value`` for the next epoch's row...
        self.pending: Row = {}
        #: ...or for this one, while the epoch's end hooks run.
        self.current: Row | None = None
        self.loggers: list[Logger] = []
        #: How many of the rows the loggers have.
        self.sent = len(self.rows)

    @classmethod
    def existing(cls, folder: Path | None) -> MetricsLog:
        """The rows a previous run left in ``folder``'s metrics.json (none if it left none)."""
        rows: list[Row] = []
        if folder is not None:
            try:
                rows = json.loads((folder / "metrics.json").read_text())
            except (FileNotFoundError, ValueError):
                rows = []
        return cls(rows)

    def attach(self, loggers: list[Logger]) -> None:
        """Log the rows added from now on to ``loggers``; the default files go on from every row."""
        self.loggers = loggers
        self.sent = len(self.rows)
        for logger in loggers:
            if isinstance(logger, MetricsFiles):
                logger.rows = [dict(row) for row in self.rows]

    def add(self, epoch: int, step: int, values: dict[str, float], epoch_end: bool = False) -> Row:
        row: Row = {"epoch": epoch, "step": step, **values}
        if epoch_end:
            row.update(self.pending)
            self.pending = {}
        self.rows.append(row)
        return row

    def value(self, name: str, value: float) -> None:
        (self.current if self.current is not None else self.pending)[name] = value

    def write(self) -> None:
        """Give the loggers the rows they do not have yet."""
        if not self.loggers:
            self.sent = len(self.rows)
            return
        for row in self.rows[self.sent :]:
            values = {name: value for name, value in row.items() if name != "step"}
            for logger in self.loggers:
                logger.log_metrics(values, int(row["step"]))
        self.sent = len(self.rows)
        for logger in self.loggers:
            logger.save()
