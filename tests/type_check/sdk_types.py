"""Checked by mypy (see pyproject.toml), never run: the decorator keeps the function's signature."""

from __future__ import annotations

from collections.abc import Iterator

import gpulayer as gl


@gl.remote
def scale(x: float, factor: int = 2) -> float:
    return x * factor


@gl.remote(gpus=1, gpu_memory="24GB", frameworks={"torch": ">=2.1"}, timeout=600)
def train(lr: float) -> dict[str, float]:
    return {"loss": lr}


@gl.remote(nodes=2, procs_per_node=2, launcher="direct")
def ddp(epochs: int) -> float:
    return float(epochs)


gang: gl.FunctionHandle[float] = ddp.remote(3)
job: gl.Job = gl.DistributedJob(["python", "train.py"], nodes=2, gpus_per_node=4).submit()

local: float = scale(1.5)
handle: gl.FunctionHandle[float] = scale.remote(1.5, factor=3)
value: float = handle.result(timeout=10)
metrics: dict[str, float] = train.remote(0.1).result()
values: Iterator[dict[str, float]] = train.map([0.1, 0.01], ordered=False)
bigger: gl.RemoteFunction[[float, int], float] = scale.options(gpus=2)

# What the decorated function would not accept, a type checker refuses too (the ignores must be used:
# mypy's strict mode reports an unused one).
scale.remote("1.5")  # type: ignore[arg-type]
scale.remote(1.5, factor=2, extra=1)  # type: ignore[call-arg]
train("fast")  # type: ignore[arg-type]
wrong: str = handle.result()  # type: ignore[assignment]
gl.remote(launcher="mpirun")  # type: ignore[call-overload]
