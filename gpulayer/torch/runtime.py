"""``gl.torch.Runtime``: what a hand-written PyTorch training loop needs to run as one of several
data-parallel ranks, in a chosen precision, without the Trainer (Lightning Fabric's role).

The loop stays the user's: ``setup`` puts the model on this rank's device, in its precision, and
wraps it in ``DistributedDataParallel`` when there are several ranks; ``backward`` replaces
``loss.backward()`` (the gradient scaler float16 needs); ``setup_dataloaders`` gives each rank its
share of the data. A Runtime belongs to the ranks it finds (``gl.torch.launch`` starts them, or
torchrun, or a GPUlayer gang job does), and joins their process group when it is made.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, cast, overload

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from . import checkpoint, data
from .precision import Precision, PrecisionName, precision_name
from .ranks import Accelerator, RankProperties, Ranks

OptimizerT = TypeVar("OptimizerT", bound=Optimizer)
T = TypeVar("T")
#: The key of a saved file that holds what ``save`` was given (``format`` holds its version).
STATE = "state"


class Runtime(RankProperties):
    """This rank's place among the run's ranks, its device and precision, and the collectives a
    training loop calls. Every rank calls ``setup``, ``setup_dataloaders``, ``barrier``,
    ``all_reduce``, ``broadcast``, ``save`` and ``load`` at the same points of its loop.

    ``accelerator``: ``"auto"`` takes CUDA, else MPS, else the CPU; with CUDA, each rank on a
    machine takes its own GPU. ``precision``: the Trainer's names (``"32-true"``, ``"bf16-mixed"``,
    ``"16-mixed"``, ``"bf16-true"``, ...).
    """

    def __init__(self, *, accelerator: Accelerator = "auto", precision: PrecisionName | int = "32") -> None:
        self.precision: PrecisionName = precision_name(precision)
        self._ranks = Ranks.current() or Ranks()
        self.device = self._ranks.device(accelerator)
        self._precision = Precision(self.precision, self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._ranks.join(self.device)

    def __repr__(self) -> str:
        return f"Runtime(rank={self.rank}, world_size={self.world_size}, device={self.device})"

    @property
    def rank(self) -> int:
        """``global_rank``: this rank's index among all the run's ranks."""
        return self._ranks.rank

    # -- the model, its optimizer, the data

    @overload
    def setup(self, model: torch.nn.Module) -> Any: ...

    @overload
    def setup(self, model: torch.nn.Module, optimizer: OptimizerT) -> tuple[Any, OptimizerT]: ...

    def setup(self, model: torch.nn.Module, optimizer: OptimizerT | None = None) -> Any:
        """``model`` on this rank's device, in its precision, its forward run in the precision's
        context, wrapped in ``DistributedDataParallel`` with several ranks; and ``optimizer``,
        whose ``step`` goes through the gradient scaler under ``"16-mixed"``. Create the optimizer
        before or after: the parameters it holds are moved in place. (The model comes back typed
        ``Any``, as Fabric's does: it is the model itself, or its DDP wrapper, which calls it.)"""
        self._precision.convert_module(model)
        model.to(self.device)
        if self._precision.has_context and not isinstance(model.__dict__.get("forward"), _InPrecision):
            model.forward = _InPrecision(model.forward, self._precision)
        ready = model
        if self._ranks.distributed:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            ready = DistributedDataParallel(model, device_ids=device_ids)
        if optimizer is None:
            return ready
        scaler = self._precision.scaler
        if scaler is not None and not isinstance(optimizer.__dict__.get("step"), _ScaledStep):
            optimizer.step = _ScaledStep(optimizer, scaler)  # type: ignore[method-assign]
        return ready, optimizer

    @overload
    def setup_dataloaders(self, loader: DataLoader[T], /) -> DeviceLoader[T]: ...

    @overload
    def setup_dataloaders(self, *loaders: DataLoader[Any]) -> list[DeviceLoader[Any]]: ...

    def setup_dataloaders(self, *loaders: DataLoader[Any]) -> DeviceLoader[Any] | list[DeviceLoader[Any]]:
        """Each loader with batches moved to this rank's device and, with several ranks, only this
        rank's share of its dataset (as ``DistributedSampler`` splits it: shuffled alike on every
        rank where the loader shuffled, differently each time it is iterated); one loader for one,
        a list for several. A loader with a sampler of its own is left to shard itself."""
        if self._ranks.distributed:
            seed = self.broadcast(int(torch.randint(2**31 - 1, ()).item()))
            loaders = tuple(
                data.for_training(loader, seed=seed, rank=self.rank, world_size=self.world_size)
                for loader in loaders
            )
        ready = [DeviceLoader(loader, self.device) for loader in loaders]
        return ready[0] if len(ready) == 1 else ready

    def to_device(self, value: T) -> T:
        """``value`` (a tensor, a module, or tensors in lists, tuples and dicts) on this rank's device."""
        if isinstance(value, torch.nn.Module):
            return value.to(self.device)
        return data.to_device(value, self.device)

    # -- a step

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, through the gradient scaler under ``"16-mixed"``."""
        scaler = self._precision.scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()  # type: ignore[no-untyped-call]

    def clip_gradients(
        self,
        model: torch.nn.Module,
        optimizer: Optimizer,
        *,
        max_norm: float | None = None,
        clip_val: float | None = None,
        norm_type: float = 2.0,
    ) -> torch.Tensor | None:
        """Clip ``model``'s gradients to a total norm of ``max_norm`` (its norm before clipping is
        returned) or each to ``[-clip_val, clip_val]``; call it between ``backward`` and
        ``optimizer.step()``. Under ``"16-mixed"``, the gradients are unscaled first."""
        if (max_norm is None) == (clip_val is None):
            raise ValueError("clip_gradients takes max_norm or clip_val, one of them")
        if self._precision.scaler is not None:
            self._precision.scaler.unscale_(optimizer)
        if max_norm is not None:
            return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)
        torch.nn.utils.clip_grad_value_(model.parameters(), clip_val)  # type: ignore[arg-type]
        return None

    def autocast(self) -> Any:
        """The precision's context, for computations outside the model's forward (which ``setup``
        already runs in it): autocast (mixed), the default type (true precision), or none."""
        return self._precision.autocast()

    # -- collectives

    def barrier(self) -> None:
        """Wait until every rank is here."""
        self._ranks.barrier()

    def all_reduce(self, value: T, op: Literal["sum", "mean"] = "mean") -> T:
        """``value`` (a tensor, a number, or tensors in lists, tuples and dicts) summed or averaged
        over the ranks: tensors in place, numbers as tensors on this rank's device."""
        if op not in ("sum", "mean"):
            raise ValueError(f"op must be 'sum' or 'mean', not {op!r}")
        if isinstance(value, int | float):
            value = torch.tensor(value, device=self.device)  # type: ignore[assignment]
        return data.apply(value, lambda tensor: self._reduced(tensor, op))

    def _reduced(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        self._ranks.sum(tensor)
        if op == "sum":
            return tensor
        if tensor.is_floating_point() or tensor.is_complex():
            return tensor.div_(self.world_size)
        return tensor / self.world_size  # a mean of whole numbers is not one

    def broadcast(self, value: T, src: int = 0) -> T:
        """Rank ``src``'s ``value`` (anything picklable), on every rank."""
        if not self._ranks.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    # -- checkpoints

    def save(self, path: str | Path, state: Mapping[str, Any]) -> None:
        """Write ``state`` to ``path`` (rank 0 writes it, atomically; every rank calls it): modules,
        optimizers and whatever else has ``state_dict()`` and ``load_state_dict()`` as their
        state, the rest (tensors, numbers, strings, lists, dicts) as it is."""
        if self.is_global_zero:
            saved = {key: _state_of(value) for key, value in state.items()}
            checkpoint.save({"format": checkpoint.FORMAT, STATE: saved}, [Path(path)])
        self.barrier()

    def load(self, path: str | Path, state: dict[str, Any] | None = None) -> dict[str, Any]:
        """Read what ``save`` wrote to ``path`` (rank 0 reads it and sends it to every rank):
        modules and optimizers in ``state`` get their saved state loaded, its other keys their
        saved value; returns what the file holds besides (all of it without ``state``)."""
        read: dict[str, Any] | None = checkpoint.load(Path(path))[STATE] if self.is_global_zero else None
        saved = cast(dict[str, Any], self.broadcast(read))  # every rank has rank 0's
        state = {} if state is None else state
        missing = sorted(set(state) - set(saved))
        if missing:
            raise KeyError(f"{path} holds no {', '.join(missing)} (it holds {', '.join(sorted(saved))})")
        for key, target in state.items():
            if _stateful(target):
                _unwrapped(target).load_state_dict(saved[key])
            else:
                state[key] = saved[key]
        return {key: value for key, value in saved.items() if key not in state}

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print``, on rank 0 only."""
        if self.is_global_zero:
            builtins.print(*args, **kwargs)


class DeviceLoader(Generic[T]):
    """A loader whose batches come on a device; each time it is iterated, its sampler (where it
    has ``set_epoch``) is told the next epoch, so a shuffled order differs from one to the next."""

    def __init__(self, loader: DataLoader[T], device: torch.device) -> None:
        self.loader = loader
        self.device = device
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[T]:
        data.start_epoch(self.loader, self.epoch, 0)
        self.epoch += 1
        if self.device.type == "cpu":
            yield from self.loader
            return
        for batch in self.loader:
            yield data.to_device(batch, self.device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _InPrecision:
    """A module's forward in a precision: floating inputs in true precision's type, the call in
    the precision's context, and outputs narrower than float32 widened to it (where losses are
    best computed)."""

    def __init__(self, forward: Any, precision: Precision) -> None:
        self.forward = forward
        self.precision = precision

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = self.precision.convert_input((args, kwargs))
        with self.precision.autocast():
            output = self.forward(*args, **kwargs)
        return data.apply(output, _widened)


def _widened(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


class _ScaledStep:
    """``optimizer.step()`` through a gradient scaler: the step is skipped where the scaled
    gradients overflowed, and the scale adjusts."""

    def __init__(self, optimizer: Optimizer, scaler: torch.amp.GradScaler) -> None:
        self.optimizer = optimizer
        self.scaler = scaler

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        optimizer = self.optimizer
        # The scaler calls optimizer.step: for that while, the optimizer's own, not this one.
        del optimizer.step
        try:
            value = self.scaler.step(optimizer, *args, **kwargs)
            self.scaler.update()
        finally:
            optimizer.step = self  # type: ignore[method-assign]
        return value


def _unwrapped(value: Any) -> Any:
    return value.module if isinstance(value, DistributedDataParallel) else value


def _stateful(value: Any) -> bool:
    """Whether ``value`` is saved as its state (a module, an optimizer, a scheduler, a scaler)."""
    return hasattr(value, "state_dict") and hasattr(value, "load_state_dict")


def _state_of(value: Any) -> Any:
    return _unwrapped(value).state_dict() if _stateful(value) else value
