"""The Trainer's Lightning options that take more than one spelling (``accelerator``, ``devices``,
``strategy``, ``logger``, the ``limit_*_batches``), each checked and turned into one value; and the
callbacks the ``enable_*`` options add."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from .callbacks import Callback, ModelCheckpoint
from .loggers import Logger, MetricsFiles
from .progress import ProgressBar
from .ranks import ACCELERATORS, Accelerator
from .summary import ModelSummary

#: Lightning's data-parallel strategies, all run the one way the Trainer runs ranks (see spawn.py).
STRATEGIES = (
    "auto",
    "ddp",
    "ddp_spawn",
    "ddp_find_unused_parameters_true",
    "ddp_find_unused_parameters_false",
)
LoggerOption = bool | Logger | Iterable[Logger] | None


def accelerator(name: str) -> Accelerator:
    """``"gpu"`` is Lightning's CUDA, or MPS on a Mac."""
    if name == "gpu":
        return "mps" if torch.backends.mps.is_available() else "cuda"
    if name not in ACCELERATORS:
        raise ValueError(f"accelerator must be auto, cpu, gpu, cuda or mps, not {name!r}")
    return name  # type: ignore[return-value]


def devices(count: int | str, kind: Accelerator) -> int:
    """``"auto"`` and ``-1``: every CUDA GPU here when the run is on CUDA, else 1."""
    if count in ("auto", -1):
        on_cuda = kind == "cuda" or (kind == "auto" and torch.cuda.is_available())
        return max(1, torch.cuda.device_count()) if on_cuda else 1
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"devices must be a number of ranks (at least 1), 'auto' or -1, not {count!r}")
    return count


def strategy(name: object) -> str:
    if name not in STRATEGIES:
        raise ValueError(
            f"strategy={name!r} is not supported: the Trainer runs data-parallel ranks (DDP) only; "
            f"use one of {', '.join(STRATEGIES)}"
        )
    return str(name)


def loggers(option: LoggerOption, run_dir: Path) -> list[Logger]:
    """``True`` or None: the run folder's metrics files; ``False``: none; else the logger(s) given."""
    if option is None or option is True:
        return [MetricsFiles(run_dir)]
    if option is False:
        return []
    given = [option] if isinstance(option, Logger) else list(option)
    for logger in given:
        if not isinstance(logger, Logger):
            raise TypeError(f"logger must be a gl.torch Logger (or a list of them), not {logger!r}")
    return given


def limits(*values: int | float) -> tuple[int | float, ...]:
    """``limit_{train,val,test,predict}_batches``: each a number of batches (an int) or a fraction
    of the loader (0.0 to 1.0)."""
    for stage, value in zip(("train", "val", "test", "predict"), values, strict=True):
        name = f"limit_{stage}_batches"
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(
                f"{name} must be a number of batches (an int) or a fraction (a float), not {value!r}"
            )
        if value < 0 or (isinstance(value, float) and value > 1.0):
            raise ValueError(f"{name} must be an int of at least 0 or a float from 0.0 to 1.0, not {value!r}")
    return values


def arranged(
    callbacks: Sequence[Callback], run_dir: Path, checkpointing: bool, progress: bool, summary: bool
) -> list[Callback]:
    """The callbacks a trainer runs: the given ones, a model summary, a progress bar, and checkpoint
    callbacks last (so that the state they save includes what the others did at the same hook)."""
    arranged = list(callbacks)
    if summary and not any(isinstance(callback, ModelSummary) for callback in arranged):
        arranged.insert(0, ModelSummary())
    if progress and not any(isinstance(callback, ProgressBar) for callback in arranged):
        arranged.append(ProgressBar())
    if checkpointing and not any(isinstance(callback, ModelCheckpoint) for callback in arranged):
        # As Lightning's default, it keeps the latest epoch's checkpoint as the "best" (test(ckpt_path=
        # "best") finds it); and last.ckpt, what a resume needs.
        arranged.append(ModelCheckpoint())
    for callback in arranged:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is None:
            callback.dirpath = run_dir / "checkpoints"
    keys = [callback.state_key for callback in arranged]
    if len(set(keys)) != len(keys):
        raise ValueError(f"two callbacks share a state_key (give them different settings): {keys}")
    return [c for c in arranged if not isinstance(c, ModelCheckpoint)] + [
        c for c in arranged if isinstance(c, ModelCheckpoint)
    ]
