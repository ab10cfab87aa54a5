"""Each rank's share of the data, batches moved to the device, and a batch's size.

A plain ``DataLoader`` over a map-style dataset with its default sampler (``shuffle=True`` or not)
is rebuilt with a sampler of ours: for training, :class:`EpochSampler` (every rank's order comes
from one seed and the epoch, so a resumed run sees the same order, and it can start part-way
through an epoch); for evaluation, :class:`ShardSampler` (contiguous, in order, no padding, so
metrics reduced over ranks equal one process's and predictions come back in order). Each rebuilt
loader also gets a generator of its own: a ``DataLoader`` draws from its generator (the global
one if it has none) each time it starts an epoch, and that draw would otherwise shift the global
generator a resumed fit restores. Any other loader (a custom sampler, an ``IterableDataset``, a
``DataLoader`` subclass) is used as it is: sharding it over ranks is then its owner's job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

T = TypeVar("T")


class EpochSampler(Sampler[int]):
    """A rank's indices for one epoch, as ``DistributedSampler`` splits them: one order on every rank
    (shuffled from ``seed + epoch``), padded by repeating its start to divide evenly, and every
    ``world_size``-th index from ``rank`` on; ``skip`` drops this rank's first indices, to resume."""

    def __init__(self, size: int, *, shuffle: bool, seed: int, rank: int, world_size: int) -> None:
        self.size = size
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.skip = 0
        self.per_rank = math.ceil(size / world_size) if size else 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order: list[int] = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(range(self.size))
        total = self.per_rank * self.world_size
        while len(order) < total:
            order += order[: total - len(order)]
        return iter(order[self.rank : total : self.world_size][self.skip :])

    def __len__(self) -> int:
        return max(0, self.per_rank - self.skip)


class ShardSampler(Sampler[int]):
    """A rank's contiguous slice of the dataset, in order, with no padding (ranks may differ by one)."""

    def __init__(self, size: int, *, rank: int, world_size: int) -> None:
        self.start = size * rank // world_size
        self.stop = size * (rank + 1) // world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.stop))

    def __len__(self) -> int:
        return self.stop - self.start


def ours_to_rebuild(loader: DataLoader[Any]) -> bool:
    """Whether ``loader`` is a plain one whose sampler we may replace without changing what it means."""
    return (
        type(loader) is DataLoader
        and not isinstance(loader.dataset, IterableDataset)
        and isinstance(loader.sampler, RandomSampler | SequentialSampler)
        and type(loader.batch_sampler) is BatchSampler
        and hasattr(loader.dataset, "__len__")
    )


def with_sampler(loader: DataLoader[T], sampler: Sampler[int], seed: int) -> DataLoader[T]:
    """``loader`` with ``sampler`` and a generator seeded with ``seed``, everything else kept."""
    return DataLoader(
        loader.dataset,
        batch_size=loader.batch_size,
        sampler=sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=torch.Generator().manual_seed(seed),
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
    )


def for_training(loader: DataLoader[T], *, seed: int, rank: int, world_size: int) -> DataLoader[T]:
    if not ours_to_rebuild(loader):
        return loader
    sampler = EpochSampler(
        len(loader.dataset),  # type: ignore[arg-type]  # ours_to_rebuild checked it has a length
        shuffle=isinstance(loader.sampler, RandomSampler),
        seed=seed,
        rank=rank,
        world_size=world_size,
    )
    return with_sampler(loader, sampler, seed)


def for_evaluation(loader: DataLoader[T], *, rank: int, world_size: int) -> DataLoader[T]:
    if not ours_to_rebuild(loader):
        return loader
    size = len(loader.dataset)  # type: ignore[arg-type]  # ours_to_rebuild checked it has a length
    return with_sampler(loader, ShardSampler(size, rank=rank, world_size=world_size), seed=0)


def start_epoch(loader: DataLoader[Any], epoch: int, skip_batches: int) -> int:
    """Point the loader's sampler at ``epoch`` and, where it is ours, past ``skip_batches`` batches;
    returns how many batches the caller must still skip by drawing them (a sampler not ours)."""
    sampler = getattr(loader, "sampler", None)  # any iterable of batches will do
    set_epoch = getattr(sampler, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)
    if isinstance(sampler, EpochSampler):
        sampler.skip = skip_batches * (loader.batch_size or 1)
        if loader.generator is not None:  # ours: what DataLoader draws from is a function of the epoch
            loader.generator.manual_seed(sampler.seed + epoch)
        return 0
    return skip_batches


def length(loader: Any) -> int | None:
    """How many batches ``loader`` gives (None when it cannot say, as over an ``IterableDataset``)."""
    try:
        return len(loader)
    except TypeError:
        return None


def limited(count: int | None, limit: int | float, option: str) -> int | None:
    """How many of a loader's ``count`` batches (None: unknown) a stage runs under ``option``, a
    ``limit_*_batches`` as Lightning reads it: an int caps the count, a float is a fraction of it."""
    if isinstance(limit, int):
        return limit if count is None else min(count, limit)
    if count is None:
        if limit == 1.0:
            return None
        raise ValueError(f"{option}={limit}: a fraction needs a loader with a length; give a batch count")
    batches = int(count * limit)
    if batches == 0 and limit > 0 and count:
        raise ValueError(f"{option}={limit} of {count} batches is none; give at least {1 / count:.4g}")
    return batches


def to_device(batch: T, device: torch.device) -> T:
    """``batch`` with every tensor in it on ``device``."""
    return apply(batch, lambda tensor: tensor.to(device, non_blocking=True))


def apply(batch: T, change: Callable[[torch.Tensor], torch.Tensor]) -> T:
    """``batch`` with ``change`` made to every tensor in it (in lists, tuples, named tuples and
    mappings, which come back as dicts)."""
    changed: Any
    if isinstance(batch, torch.Tensor):
        changed = change(batch)
    elif isinstance(batch, Mapping):
        changed = {key: apply(value, change) for key, value in batch.items()}
    elif isinstance(batch, tuple) and hasattr(batch, "_fields"):
        changed = type(batch)(*(apply(value, change) for value in batch))
    elif isinstance(batch, list | tuple):
        changed = type(batch)(apply(value, change) for value in batch)
    else:
        changed = batch
    return changed  # type: ignore[no-any-return]


def batch_size(batch: Any) -> int:
    """The length of the first tensor found in ``batch`` (1 if it holds none): the weight of the
    values logged for it in an epoch's mean."""
    if isinstance(batch, list | tuple) and batch and isinstance(batch[0], torch.Tensor) and batch[0].dim():
        return int(batch[0].shape[0])  # (inputs, targets): the common case, on every logged step
    return _first_length(batch) or 1


def _first_length(batch: Any) -> int | None:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, list | tuple):
        for value in batch:
            length = _first_length(value)
            if length is not None:
                return length
    return None
