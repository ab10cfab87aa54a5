"""``gl.torch.launch(train, ...)``: run ``train(runtime, ...)`` as the data-parallel ranks of a plain
PyTorch loop, and bring rank 0's value back.

Where it runs, as the Trainer's calls do:

* this process is already one rank of several (``torch.distributed`` is initialized, or the
  environment names its rank as torchrun and GPUlayer gang jobs do): here, as that rank;
* else ``num_nodes > 1`` or ``remote=True``: a GPUlayer gang job of ``num_nodes`` workers with
  ``devices`` ranks each (see ``remote.py``);
* else ``devices > 1``: that many ranks started on this machine (see ``spawn.py``);
* else here, in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from ..functions import RemoteKeywords
from . import remote as gang
from . import spawn
from .precision import PrecisionName, precision_name
from .ranks import ACCELERATORS, Accelerator, Ranks
from .runtime import Runtime

R = TypeVar("R")


def launch(
    function: Callable[..., R],
    *args: Any,
    devices: int = 1,
    num_nodes: int = 1,
    accelerator: Accelerator = "auto",
    precision: PrecisionName | int = "32",
    remote: bool = False,
    job_options: RemoteKeywords | None = None,
) -> R:
    """``function(runtime, *args)`` on every rank; rank 0's value (run as one rank of
    ranks that exist already: this rank's). ``devices``: ranks per machine (CUDA: one GPU each;
    CPU: processes sharing its cores). ``num_nodes`` and ``remote``: as a GPUlayer gang job of
    ``num_nodes`` workers, submitted with ``job_options`` (what ``gl.remote`` takes: ``client``,
    ``source``, ``timeout``, requirements per node; ``accelerator="cuda"`` reserves ``devices``
    GPUs per node). An exception on any rank ends every rank and is raised here.

    Rank ``r`` seeds its generators with ``s + r``, ``s`` drawn here from torch's generator: a
    script that seeds before launching is reproducible.
    """
    if accelerator not in ACCELERATORS:
        raise ValueError(f"accelerator must be one of {', '.join(ACCELERATORS)}, not {accelerator!r}")
    for name, count in (("devices", devices), ("num_nodes", num_nodes)):
        if count < 1:
            raise ValueError(f"{name} must be at least 1, not {count}")
    run = _Run(function, args, accelerator, precision_name(precision))
    if Ranks.current() is not None:
        return run()
    if num_nodes > 1 or remote:
        return gang.run_gang(
            run,
            nodes=num_nodes,
            devices=devices,
            accelerator=accelerator,
            job_options=job_options or {},
            seed=_seed(),
            what=f"{getattr(function, '__qualname__', 'the function')}'s",
        )
    if devices > 1:
        value: R = spawn.run_ranks(devices, run, _seed())
        return value
    return run()


def _seed() -> int:
    return int(torch.randint(2**31 - 1, ()).item())


class _Run(Generic[R]):
    """The call each rank makes: a Runtime of its own, then the function."""

    def __init__(
        self,
        function: Callable[..., R],
        args: tuple[Any, ...],
        accelerator: Accelerator,
        precision: PrecisionName,
    ) -> None:
        self.function, self.args = function, args
        self.accelerator, self.precision = accelerator, precision

    def __call__(self) -> R:
        runtime = Runtime(accelerator=self.accelerator, precision=self.precision)
        return self.function(runtime, *self.args)
