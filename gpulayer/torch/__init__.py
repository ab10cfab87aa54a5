"""``gl.torch``: a PyTorch Trainer that runs one script in this process, as data-parallel ranks on
this machine, or as the ranks of a GPUlayer gang job, and resumes a run its machine lost.

import gpulayer as gl

class Regression(gl.torch.Module): ...          # training_step, configure_optimizers, ...

trainer = gl.torch.Trainer(max_epochs=10, devices=2, callbacks=[gl.torch.EarlyStopping("val_loss")])
trainer.fit(Regression(), train_loader, val_loader)
trainer.test(Regression(), test_loader, ckpt_path="best")

def train(runtime: gl.torch.Runtime, epochs: int) -> float: ...   # a plain loop: setup, backward
loss = gl.torch.launch(train, 10, devices=2)                        # as 2 ranks; rank 0's value

Needs PyTorch: ``pip install 'gpulayer[torch]'``. See docs/trainer.md and docs/launch.md.
"""

try:
    import torch as _torch  # noqa: F401  # only to fail early, in one line, when it is missing
except ImportError as missing:
    raise ImportError("gpulayer.torch needs PyTorch: pip install 'gpulayer[torch]'") from missing

from .callbacks import Callback, EarlyStopping, LearningRateMonitor, ModelCheckpoint
from .data_module import DataModule
from .launcher import launch
from .loggers import CSVLogger, Logger, TensorBoardLogger
from .module import Module
from .optim import OptimizerConfig, Optimizers, SchedulerConfig
from .progress import ProgressBar
from .runtime import Runtime
from .summary import ModelSummary
from .trainer import Trainer
from .utilities import rank_zero_only, seed_everything

# Lightning's names, so that a script moves by one line: `import lightning.pytorch as pl` becomes
# `import gpulayer.torch as pl` (docs/trainer.md, "Coming from Lightning").
LightningModule = Module
LightningDataModule = DataModule

#: What a Lightning script may reach for that gpulayer.torch does not have, and what to use instead.
_ELSEWHERE = {
    "cli": "LightningCLI is not part of gpulayer.torch: parse the arguments with argparse or click",
    "tuner": "the tuner (lr_find, batch size scaling) is not part of gpulayer.torch: set them by hand",
    "profilers": "profilers are not part of gpulayer.torch: run torch.profiler from a Callback",
    "strategies": "gpulayer.torch runs data-parallel ranks only: Trainer(strategy='ddp')",
    "LightningApp": "Lightning apps are not part of gpulayer.torch: submit jobs with gpulayer",
}


def __getattr__(name: str) -> object:
    # A one-line answer that names the replacement, instead of Python's bare "no attribute".
    if name in _ELSEWHERE:
        raise AttributeError(f"gpulayer.torch.{name}: {_ELSEWHERE[name]}")
    raise AttributeError(f"module 'gpulayer.torch' has no attribute {name!r}")


__all__ = [
    "CSVLogger",
    "Callback",
    "DataModule",
    "EarlyStopping",
    "LearningRateMonitor",
    "LightningDataModule",
    "LightningModule",
    "Logger",
    "ModelCheckpoint",
    "ModelSummary",
    "Module",
    "OptimizerConfig",
    "Optimizers",
    "ProgressBar",
    "Runtime",
    "SchedulerConfig",
    "TensorBoardLogger",
    "Trainer",
    "launch",
    "rank_zero_only",
    "seed_everything",
]
