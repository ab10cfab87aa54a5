"""What ``Module.log`` records, reduced over ranks, and the rows of them rank 0's loggers get.

A value logged ``on_epoch`` is kept on its device, unread, until the epoch ends: then every rank's
sums (or extremes) are combined in one collective per kind, so the epoch's mean is the mean over
every sample any rank saw. A value logged ``on_step`` is read (a host sync) only on the steps that
are due, every ``log_every_n_steps``, and is this rank's own unless logged with ``sync_dist``.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

import torch

from .data import batch_size
from .loggers import Logger, MetricsFiles, Row
from .ranks import Ranks

#: Values queued per metric before they are folded into its running sum (one stack, one sum).
FOLD_EVERY = 1024

#: How an epoch's values of one metric become one: Lightning's ``reduce_fx``.
Reduce = Literal["mean", "sum", "max", "min"]
_REDUCE_CALLABLES: dict[Callable[..., Any], Reduce] = {
    torch.mean: "mean",
    torch.sum: "sum",
    torch.max: "max",
    torch.min: "min",
}


def reduce_kind(reduce_fx: str | Callable[..., Any]) -> Reduce:
    """``"mean"``, ``"sum"``, ``"max"`` or ``"min"``, given as a name or as ``torch.mean`` & co."""
    kind = _REDUCE_CALLABLES.get(reduce_fx) if callable(reduce_fx) else reduce_fx
    if kind not in ("mean", "sum", "max", "min"):
        raise ValueError(f"reduce_fx must be mean, sum, max or min (or torch's of those), not {reduce_fx!r}")
    return cast(Reduce, kind)


class Metric:
    """One metric's values over an epoch, combined as its ``kind`` says: a weighted mean, a sum or
    an extreme. Values that live on a device stay there, unread, until the end."""

    __slots__ = ("float_value", "kind", "queued", "value", "weight", "weights")

    def __init__(self, kind: Reduce = "mean") -> None:
        self.kind: Reduce = kind
        self.queued: list[torch.Tensor] = []
        self.weights: list[int] = []
        self.value: torch.Tensor | None = None
        # The extremes start where any value replaces them; sums at zero.
        self.float_value = {"max": -math.inf, "min": math.inf}.get(kind, 0.0)
        self.weight = 0

    def add(self, value: torch.Tensor | float, weight: int) -> None:
        if self.kind != "mean":
            weight = 1  # a sum or an extreme counts each value once
        if isinstance(value, torch.Tensor):
            self.queued.append(value.detach())
            self.weights.append(weight)
            if len(self.queued) >= FOLD_EVERY:
                self.fold()
        elif self.kind in ("mean", "sum"):
            self.float_value += float(value) * weight
        else:
            self.float_value = (max if self.kind == "max" else min)(self.float_value, float(value))
        self.weight += weight

    def fold(self) -> None:
        if not self.queued:
            return
        try:  # one op for the usual scalars; values of other shapes (a 1-element tensor) one by one
            values = torch.stack(self.queued).float().reshape(-1)
        except RuntimeError:
            values = torch.stack([value.float().reshape(()) for value in self.queued])
        if self.kind in ("mean", "sum"):
            weights = torch.tensor(self.weights, dtype=values.dtype, device=values.device)
            folded = (values * weights).sum()
            self.value = folded if self.value is None else self.value + folded
        else:
            folded = values.amax() if self.kind == "max" else values.amin()
            combine = torch.maximum if self.kind == "max" else torch.minimum
            self.value = folded if self.value is None else combine(self.value, folded)
        self.queued.clear()
        self.weights.clear()

    def total(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The weighted sum (or the extreme), as a tensor on ``device``."""
        self.fold()
        total = torch.tensor(self.float_value, dtype=dtype, device=device)
        if self.value is None:
            return total
        value = self.value.to(device=device, dtype=dtype)
        if self.kind in ("mean", "sum"):
            return total + value
        return torch.maximum(total, value) if self.kind == "max" else torch.minimum(total, value)


class EpochMeans:
    """Every ``on_epoch`` value one stage logged this epoch, by name."""

    def __init__(self) -> None:
        self.means: dict[str, Metric] = {}

    def add(self, name: str, value: torch.Tensor | float, weight: int, kind: Reduce = "mean") -> None:
        metric = self.means.get(name)
        if metric is None:
            metric = self.means[name] = Metric(kind)
        metric.add(value, weight)

    def reduce(self, ranks: Ranks, device: torch.device) -> dict[str, float]:
        """The values over every rank's samples; a collective every rank must call, and then reset.

        Ranks may have logged different names (a metric logged only on some batches), so the names
        are agreed first; a rank that lacks one adds nothing to it. Sums and weights travel in one
        all-reduce; extremes (``max``, ``min``: as a max of negated values) in a second, if any.
        """
        kinds = {name: metric.kind for name, metric in self.means.items()}
        if ranks.distributed:
            kinds = {name: kind for part in ranks.gather(kinds) for name, kind in part.items()}
        if not kinds:
            return {}
        names = sorted(kinds)
        dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64
        summed = [name for name in names if kinds[name] in ("mean", "sum")]
        extreme = [name for name in names if kinds[name] in ("max", "min")]
        totals = {name: self._total(name, kinds[name], device, dtype) for name in names}
        weights = [float(self.means[name].weight) if name in self.means else 0.0 for name in names]
        parts = [totals[name].reshape(1) for name in summed]
        packed = ranks.sum(torch.cat([*parts, torch.tensor(weights, dtype=dtype, device=device)])).tolist()
        values = dict(zip(summed, packed, strict=False))
        weight = dict(zip(names, packed[len(summed) :], strict=True))
        if extreme:
            signed = torch.stack([totals[name] * (1 if kinds[name] == "max" else -1) for name in extreme])
            ranks.max(signed)
            for name, value in zip(extreme, signed.tolist(), strict=True):
                values[name] = value if kinds[name] == "max" else -value
        self.means.clear()
        return {
            name: values[name] / weight[name] if kinds[name] == "mean" else values[name]
            for name in names
            if weight[name]
        }

    def _total(self, name: str, kind: Reduce, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """This rank's part of ``name``: what it logged, or what leaves the others' as they are."""
        metric = self.means.get(name)
        if metric is not None:
            return metric.total(device, dtype)
        return torch.tensor(Metric(kind).float_value, dtype=dtype, device=device)

    def state(self) -> dict[str, tuple[float, int, str]]:
        """This rank's sums and weights so far (for a checkpoint taken part-way through an epoch)."""
        cpu = torch.device("cpu")
        return {
            name: (float(metric.total(cpu, torch.float64)), metric.weight, metric.kind)
            for name, metric in self.means.items()
        }

    def load_state(self, state: dict[str, tuple[Any, ...]]) -> None:
        self.means.clear()
        for name, (total, weight, *kind) in state.items():
            metric = self.means[name] = Metric(kind[0] if kind else "mean")  # older checkpoints: means
            metric.float_value, metric.weight = total, weight


class StageLog:
    """Where ``Module.log`` sends values while the Trainer runs one stage (train, validate, test)."""

    __slots__ = (
        "batch", "device", "epoch", "forked", "hidden", "in_batches", "latest", "prog_bar", "ranks", "step",
        "step_due", "synced", "training", "warned",
    )  # fmt: skip

    def __init__(
        self, training: bool, ranks: Ranks | None = None, device: torch.device | None = None
    ) -> None:
        self.training = training
        self.ranks = ranks or Ranks()
        self.device = device or torch.device("cpu")
        self.epoch = EpochMeans()
        self.step: dict[str, float] = {}
        self.step_due = False
        #: Whether a training epoch's batches run (Lightning's defaults differ there from elsewhere).
        self.in_batches = False
        #: This epoch's last ``on_step`` value of each metric, unread until the epoch ends.
        self.latest: dict[str, torch.Tensor | float] = {}
        self.prog_bar: set[str] = set()
        #: Names logged with ``logger=False``: the callbacks see them, the metrics rows do not.
        self.hidden: set[str] = set()
        #: Names logged both per step and per epoch (``<name>_step``, ``<name>_epoch``).
        self.forked: set[str] = set()
        self.warned: set[str] = set()
        #: How each step value logged with ``sync_dist`` is reduced over ranks.
        self.synced: dict[str, Reduce] = {}
        self.batch: Any = None

    def log(
        self,
        name: str,
        value: torch.Tensor | float,
        on_step: bool | None,
        on_epoch: bool | None,
        prog_bar: bool,
        weight: int | None,
        reduce: Reduce = "mean",
        sync_dist: bool = False,
        logger: bool = True,
    ) -> None:
        # Lightning's defaults: a value per step inside a training batch, a value per epoch elsewhere.
        per_batch = self.training and self.in_batches
        on_step = per_batch if on_step is None else on_step
        on_epoch = (not per_batch) if on_epoch is None else on_epoch
        epoch_name = step_name = name
        if on_step and on_epoch:
            epoch_name, step_name = f"{name}_epoch", f"{name}_step"
            self.forked.add(name)
        if on_epoch:
            weight = weight if weight is not None else batch_size(self.batch)
            self.epoch.add(epoch_name, value, weight, reduce)
        if on_step and not per_batch and name not in self.warned:
            self.warned.add(name)
            warnings.warn(
                f"log({name!r}, on_step=True) outside a training batch: gl.torch records values per step "
                "only in training_step and the training batch hooks; here, per epoch (on_epoch=True)",
                stacklevel=3,
            )
        if on_step and per_batch:
            # Detached: nothing keeps the step's graph alive, and a loss is read without torch's warning.
            kept = value.detach() if isinstance(value, torch.Tensor) else value
            self.latest[step_name] = kept
            if step_name != name:
                self.latest[name] = kept
            if sync_dist:
                self.synced[step_name] = self.synced[name] = reduce
            if self.step_due:  # read only on the steps that are due
                self.step[step_name] = self._synced(kept, reduce) if sync_dist else float(kept)
        if prog_bar:
            self.prog_bar.add(epoch_name if on_epoch else step_name)
        if not logger:
            self.hidden.update((epoch_name, step_name))

    def _synced(self, value: torch.Tensor | float, reduce: Reduce) -> float:
        """A step value over every rank (``sync_dist``): a collective that every rank logging it joins."""
        ranks = self.ranks
        if not ranks.distributed:
            return float(value)
        dtype = torch.float32 if self.device.type == "mps" else torch.float64
        tensor = torch.as_tensor(value).to(device=self.device, dtype=dtype).reshape(1)
        if reduce in ("mean", "sum"):
            ranks.sum(tensor)
            return float(tensor.item()) / (ranks.world_size if reduce == "mean" else 1)
        signed = tensor if reduce == "max" else -tensor
        ranks.max(signed)
        return float(signed.item()) * (1 if reduce == "max" else -1)

    def aliases(self, means: dict[str, float]) -> dict[str, float]:
        """Each forked name's epoch value under its own name too, as Lightning's callback metrics hold it."""
        return {name: means[f"{name}_epoch"] for name in self.forked if f"{name}_epoch" in means}

    def take_latest(self) -> dict[str, float]:
        """The epoch's last ``on_step`` values (one host sync each; those logged with ``sync_dist``
        reduced over ranks, a collective), and forget them."""
        synced = self.synced
        latest = {
            name: self._synced(value, synced[name]) if name in synced else float(value)
            for name, value in sorted(self.latest.items())  # in one order on every rank
        }
        self.latest.clear()
        return latest


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
        #: Names logged with ``logger=False``: left out of the rows.
        self.hidden: set[str] = set()
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
        hidden = self.hidden
        row: Row = {"epoch": epoch, "step": step}
        row.update((name, value) for name, value in values.items() if name not in hidden)
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
