"""Which rank this process is among a run's processes, and the few collectives the Trainer needs.

A process is one of several ranks when ``torch.distributed`` is already initialized, or when its
environment names its rank the way torchrun does (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``): a GPUlayer gang job, torchrun, or the Trainer's own local launch. With one rank,
every collective here returns at once without touching ``torch.distributed``.
"""

from __future__ import annotations

import atexit
import gc
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.distributed as dist

#: The variables that together say "this process is one rank of a process group".
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

Accelerator = Literal["auto", "cpu", "cuda", "mps"]
ACCELERATORS: tuple[str, ...] = get_args(Accelerator)


@dataclass(frozen=True)
class Ranks:
    """This process's place among the run's ranks."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Ranks | None:
        """The rank a launcher described in the environment, or None if it described none."""
        if not all(name in environ for name in RANK_VARIABLES):
            return None
        rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
        return cls(
            rank=rank,
            local_rank=int(environ.get("LOCAL_RANK", rank)),
            world_size=world,
            local_world_size=int(environ.get("LOCAL_WORLD_SIZE", world)),
        )

    @classmethod
    def current(cls) -> Ranks | None:
        """The process group this process already belongs to, else what its environment says."""
        if dist.is_available() and dist.is_initialized():
            local = int(os.environ.get("LOCAL_RANK", "0"))
            world = dist.get_world_size()
            return cls(dist.get_rank(), local, world, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
        return cls.from_environ()

    @property
    def is_zero(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def node_rank(self) -> int:
        """Which machine of the run this is (every machine runs ``local_world_size`` ranks)."""
        return self.rank // self.local_world_size

    def device(self, accelerator: Accelerator) -> torch.device:
        """This rank's device: ``"auto"`` takes CUDA, else MPS, else the CPU; on CUDA, one GPU a rank."""
        kind = accelerator
        if kind == "auto":
            kind = (
                "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
            )
        if kind == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("accelerator='cuda', but PyTorch sees no CUDA GPU here")
            # A gang job gives each rank its own GPUs (it sees them from index 0); several ranks
            # started here share the machine's, one each.
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        if kind == "mps":
            if not torch.backends.mps.is_available():
                raise RuntimeError("accelerator='mps', but PyTorch sees no MPS device here")
            if self.distributed:
                raise RuntimeError("MPS runs one rank: use devices=1")
        return torch.device(kind)

    def join(self, device: torch.device) -> None:
        """Join the process group (NCCL for CUDA, else gloo) unless this process is already in one.

        The group lives until the process exits: a script may call ``fit`` then ``test``, and a new
        group per call would need a new rendezvous each time.
        """
        if not self.distributed or dist.is_initialized():
            return
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method="env://", rank=self.rank, world_size=self.world_size)
        atexit.register(leave)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over ranks, in place."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def max(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``'s elementwise maximum over ranks, in place."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def any(self, flag: bool, device: torch.device) -> bool:
        """Whether ``flag`` is true on any rank."""
        if not self.distributed:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        if not self.distributed:
            return [value]
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def from_zero(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]


class RankProperties:
    """Where this process is among the run's ranks, by Lightning's names: what the Trainer and the
    Runtime both tell."""

    _ranks: Ranks

    @property
    def global_rank(self) -> int:
        """This rank's index among all the run's ranks (0 to ``world_size - 1``)."""
        return self._ranks.rank

    @property
    def local_rank(self) -> int:
        """This rank's index among its machine's ranks."""
        return self._ranks.local_rank

    @property
    def node_rank(self) -> int:
        return self._ranks.node_rank

    @property
    def world_size(self) -> int:
        return self._ranks.world_size

    @property
    def is_global_zero(self) -> bool:
        return self._ranks.is_zero


def leave() -> None:
    """Leave the process group. No barrier here: each Trainer call ends with one, and after a rank
    failed a barrier at exit would pair with whatever collective its peers are stuck in."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()  # what still holds the group (a DDP reducer in a cycle) lets go before it goes
        dist.destroy_process_group()
