"""``gl.torch.Trainer``: fit, validate, test and predict a :class:`Module`, in this process or as
data-parallel ranks, with metrics files and checkpoints a new run resumes from.

Where a call runs:

* this process is already one rank of several (``torch.distributed`` is initialized, or the
  environment names its rank as torchrun and GPUlayer gang jobs do): it runs as that rank;
* else ``devices > 1``: it starts that many ranks on this machine (see ``spawn.py``) and waits;
* else here, in this process.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader

from ..functions import RemoteKeywords
from ..models import CHECKPOINT_VARIABLE, JOB_ID_VARIABLE
from . import checkpoint, data, remote, spawn
from .callbacks import Callback, Hooks, ModelCheckpoint, Stage
from .data_module import DataModule
from .loops import FitLoop, Session, evaluate, predict
from .metrics import MetricsLog
from .module import Module
from .optim import Optimization
from .precision import Precision, PrecisionName, precision_name
from .progress import ProgressBar
from .ranks import ACCELERATORS, Accelerator, RankProperties, Ranks

#: Where a run's folder is when ``default_root_dir`` is not given, under the working directory.
RUNS_FOLDER = "gpulayer_runs"


class Trainer(RankProperties):
    """Runs a :class:`Module`'s steps: ``fit``, ``validate``, ``test``, ``predict``.

    ``accelerator``: ``"auto"`` takes CUDA, else MPS, else the CPU. ``devices``: ranks on this
    machine (CUDA: one GPU each; CPU: processes sharing its cores). ``num_nodes`` and ``remote``:
    run each call as a GPUlayer gang job of ``num_nodes`` workers with ``devices`` ranks each (inside
    one, or under torchrun, the Trainer joins its ranks); ``job_options`` are what that job is
    submitted with besides (``client``, ``source``, ``timeout``, ``retries``, requirements per node
    such as ``gpu_memory`` or ``labels``: what ``gl.remote`` takes; ``accelerator="cuda"``
    reserves ``devices`` GPUs per node).
    ``precision``: Lightning's names: ``"32-true"`` (or ``"32"``, ``32``), ``"bf16-mixed"``
    (bfloat16 autocast; ``"bf16"``), ``"16-mixed"`` (float16 autocast with a gradient scaler;
    ``"16"``, ``16``), or true precision, everything in one type: ``"16-true"``, ``"bf16-true"``,
    ``"64-true"`` (``"64"``, ``64``). ``compile``: ``module.compile()``.

    Fitting stops at ``max_epochs`` or ``max_steps`` (optimizer steps), whichever comes first, or
    when a callback sets ``should_stop``. ``accumulate_grad_batches`` batches make one optimizer
    step; gradients are clipped to ``gradient_clip_val`` (by total norm, or by value). Validation
    runs every ``check_val_every_n_epoch`` epochs at the epoch's end and, within an epoch, every
    ``val_check_interval`` batches (an int) or fraction of the epoch (a float below 1.0).

    ``default_root_dir`` is the run folder: ``metrics.json``, ``metrics.csv`` and ``checkpoints/``.
    By default, in a GPUlayer command job, the job's checkpoint folder (``GPULAYER_CHECKPOINT_DIR``:
    kept in Redis as it changes, and given back to a retry on any worker); else
    ``./gpulayer_runs/default``.
    Only rank 0 writes there. Unless ``enable_checkpointing=False``, a :class:`ModelCheckpoint`
    that writes only ``checkpoints/last.ckpt``, after every epoch, is added when none is given.

    ``resume``: ``"auto"`` makes ``fit`` continue from the run folder's ``last.ckpt`` when there is
    one (a rerun, or a GPUlayer job retried after its worker was lost, whose run folder survived),
    else start afresh; ``False`` always starts afresh; a path continues from that checkpoint.
    """

    def __init__(
        self,
        *,
        accelerator: Accelerator = "auto",
        devices: int = 1,
        num_nodes: int = 1,
        remote: bool = False,
        precision: PrecisionName | int = "32",
        compile: bool = False,
        max_epochs: int | None = None,
        max_steps: int | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
        check_val_every_n_epoch: int = 1,
        val_check_interval: int | float = 1.0,
        log_every_n_steps: int = 50,
        callbacks: Sequence[Callback] = (),
        default_root_dir: str | Path | None = None,
        enable_checkpointing: bool = True,
        enable_progress_bar: bool = True,
        resume: Literal["auto", False] | str | Path = "auto",
        job_options: RemoteKeywords | None = None,
    ) -> None:
        if accelerator not in ACCELERATORS:
            raise ValueError(f"accelerator must be auto, cpu, cuda or mps, not {accelerator!r}")
        for name, value in (("devices", devices), ("num_nodes", num_nodes),
                            ("accumulate_grad_batches", accumulate_grad_batches),
                            ("check_val_every_n_epoch", check_val_every_n_epoch),
                            ("log_every_n_steps", log_every_n_steps)):  # fmt: skip
            if value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        self.accelerator: Accelerator = accelerator
        self.devices = devices
        self.num_nodes = num_nodes
        self.remote = remote
        self.precision: PrecisionName = precision_name(precision)
        self.compile = compile
        self.max_epochs = max_epochs
        self.max_steps = max_steps
        self.accumulate_grad_batches = accumulate_grad_batches
        self.gradient_clip_val = gradient_clip_val
        self.gradient_clip_algorithm = gradient_clip_algorithm
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.val_check_interval = val_check_interval
        self.log_every_n_steps = log_every_n_steps
        self.resume = resume
        self.job_options: RemoteKeywords = job_options or {}
        self.run_dir = Path(default_root_dir or _default_run_dir()).absolute()
        self.callbacks = _arranged(callbacks, self.run_dir, enable_checkpointing, enable_progress_bar)

        # What the last call left, and what a callback may read during one.
        self.current_epoch = 0
        self.global_step = 0
        self.should_stop = False
        #: The latest value of every metric.
        self.callback_metrics: dict[str, float] = {}
        #: This epoch's means (training, then validation); in validate and test, that stage's.
        self.epoch_metrics: dict[str, float] = {}
        self.prog_bar_metrics: set[str] = set()
        self.num_training_batches: int | None = None
        self.stage: Stage | None = None
        #: The checkpoint the last ``fit`` resumed from, if it did.
        self.resumed_from: Path | None = None
        self._ranks = Ranks()
        self._metrics: MetricsLog | None = None
        self._fit: FitLoop | None = None
        #: The model of the last ``fit``: what ``validate``, ``test`` and ``predict`` take when given none.
        self._fitted: Module | None = None
        #: The ``datamodule`` of the current (or last) call, if it had one.
        self.datamodule: DataModule | None = None

    def __getstate__(self) -> dict[str, Any]:
        # What a gang job is submitted with (a client among it) stays with the caller: ranks get none.
        return {**self.__dict__, "job_options": {}, "_fitted": None}

    def __repr__(self) -> str:
        return f"Trainer(devices={self.devices}, num_nodes={self.num_nodes}, run_dir={str(self.run_dir)!r})"

    # -- what callbacks read (and RankProperties' global_rank, local_rank, world_size, ...)

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first :class:`ModelCheckpoint`: the one whose ``last.ckpt`` ``fit`` resumes from."""
        return next((callback for callback in self.callbacks if isinstance(callback, ModelCheckpoint)), None)

    @property
    def optimizer(self) -> Optimizer | None:
        return self._fit.optim.optimizer if self._fit is not None else None

    @property
    def lr_scheduler(self) -> LRScheduler | None:
        return self._fit.optim.scheduler if self._fit is not None else None

    @property
    def metrics_log(self) -> MetricsLog:
        """The run's metric rows: this run's, or what an earlier one left in ``metrics.json``."""
        if self._metrics is None:
            self._metrics = MetricsLog.existing(self.run_dir if self.is_global_zero else None)
        return self._metrics

    def log_value(self, name: str, value: float) -> None:
        """Record ``value`` in this epoch's row of the metrics (for callbacks; steps use ``Module.log``)."""
        self.callback_metrics[name] = float(value)
        self.metrics_log.value(name, float(value))

    # -- the four calls

    def fit(
        self,
        model: Module | None = None,
        train_dataloaders: DataLoader[Any] | None = None,
        val_dataloaders: DataLoader[Any] | None = None,
        datamodule: DataModule | None = None,
    ) -> dict[str, float]:
        """Train ``model`` on ``train_dataloaders`` (else the ``datamodule``'s, else the model's
        ``train_dataloader()``), validating on ``val_dataloaders`` (found the same way, if any); the
        final metrics. After ranks started here, ``model`` holds rank 0's trained weights; a later
        ``validate``, ``test`` or ``predict`` given no model takes it."""
        module = self._model(model, "fit")
        if self.max_epochs is None and self.max_steps is None:
            raise ValueError("fit needs Trainer(max_epochs=...) or Trainer(max_steps=...)")
        self._fitted = module
        if (where := self._where()) != "here":
            return self._elsewhere(where, "fit", module, train_dataloaders, val_dataloaders, datamodule)  # type: ignore[no-any-return]
        with self._session(module, "fit", datamodule) as session:
            train = _loader(train_dataloaders, datamodule, module, "train_dataloader")
            if train is None:
                raise ValueError(
                    "fit needs train_dataloaders, a datamodule, or a model whose train_dataloader() gives one"
                )
            val = _loader(val_dataloaders, datamodule, module, "val_dataloader")
            self._run_fit(session, module, train, val)
        return dict(self.callback_metrics)

    def validate(
        self,
        model: Module | None = None,
        dataloaders: DataLoader[Any] | None = None,
        ckpt_path: str | Path | None = None,
        datamodule: DataModule | None = None,
    ) -> list[dict[str, float]]:
        """Run ``validation_step`` over the data; the logged metrics' means over it, one dict per
        loader (as Lightning returns them). ``ckpt_path``: load these weights first (``"best"`` and
        ``"last"`` name the checkpoint callback's). No model: the one fitted last."""
        return self._evaluate("validate", self._model(model, "validate"), dataloaders, ckpt_path, datamodule)

    def test(
        self,
        model: Module | None = None,
        dataloaders: DataLoader[Any] | None = None,
        ckpt_path: str | Path | None = None,
        datamodule: DataModule | None = None,
    ) -> list[dict[str, float]]:
        """Run ``test_step`` over the data; the logged metrics' means over it (see ``validate``)."""
        return self._evaluate("test", self._model(model, "test"), dataloaders, ckpt_path, datamodule)

    def predict(
        self,
        model: Module | None = None,
        dataloaders: DataLoader[Any] | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | Path | None = None,
    ) -> list[Any]:
        """``predict_step``'s output for each batch, in order, moved to the CPU (from every rank)."""
        module = self._model(model, "predict")
        if (where := self._where()) != "here":
            return self._elsewhere(where, "predict", module, dataloaders, datamodule, ckpt_path)  # type: ignore[no-any-return]
        with self._session(module, "predict", datamodule) as session:
            loader = _needed(dataloaders, datamodule, module, "predict")
            self._load_weights(module, ckpt_path)
            loader = data.for_evaluation(loader, rank=session.ranks.rank, world_size=session.ranks.world_size)
            return predict(self, session, module, loader)

    def _model(self, given: Module | None, call: str) -> Module:
        if given is not None:
            return given
        if self._fitted is None:
            raise ValueError(f"{call} needs a model: none was given, and this trainer has fitted none")
        return self._fitted

    def save_checkpoint(self, *paths: str | Path) -> None:
        """Write the fit's checkpoint to each of ``paths``: a collective (every rank calls it, with the
        same paths, at the same point), since it gathers each rank's RNG state; only rank 0 writes."""
        loop = self._fit
        if loop is None:
            raise RuntimeError("save_checkpoint works during fit (from a callback)")
        per_rank = self._ranks.gather(loop.rank_state())
        if not self.is_global_zero:
            return
        state = {
            "format": checkpoint.FORMAT,
            **loop.state(),
            "state_dict": loop.module.state_dict(),
            "callbacks": {callback.state_key: callback.state_dict() for callback in self.callbacks},
            "ranks": per_rank,
            "metrics": self.metrics_log.rows,
            "callback_metrics": self.callback_metrics,
        }
        checkpoint.save(state, [Path(path) for path in paths])

    # -- in this process, as one rank

    def _run_fit(
        self, session: Session, module: Module, train: DataLoader[Any], val: DataLoader[Any] | None
    ) -> None:
        optim = Optimization.parse(module.configure_optimizers())
        ranks = session.ranks
        path = self._resume_path() if ranks.is_zero else None
        found = ranks.from_zero(checkpoint.load(path) if path is not None else None)
        seed = found["seed"] if found else ranks.from_zero(int(torch.randint(2**31 - 1, ()).item()))
        loop = FitLoop(self, session, module, train, val, optim, seed)
        self.current_epoch = self.global_step = 0
        self.should_stop = False
        self.callback_metrics, self.prog_bar_metrics = {}, set()
        self._metrics = MetricsLog(self.run_dir if ranks.is_zero else None)
        self.resumed_from = ranks.from_zero(path)
        if found:
            self._metrics.rows = list(found["metrics"])
            self.callback_metrics = dict(found["callback_metrics"])
            for callback in self.callbacks:
                if callback.state_key in found["callbacks"]:
                    callback.load_state_dict(found["callbacks"][callback.state_key])
            loop.restore(found)  # last: it sets the random generators as they were
        self._fit = loop
        try:
            session.hooks.call("on_fit_start", self, module)
            session.hooks.call("on_train_start", self, module)
            loop.run()
            session.hooks.call("on_train_end", self, module)
            session.hooks.call("on_fit_end", self, module)
        finally:
            self._fit = None

    def _evaluate(
        self,
        stage: Literal["validate", "test"],
        module: Module,
        dataloaders: DataLoader[Any] | None,
        ckpt_path: str | Path | None,
        datamodule: DataModule | None,
    ) -> list[dict[str, float]]:
        if (where := self._where()) != "here":
            return self._elsewhere(where, stage, module, dataloaders, ckpt_path, datamodule)  # type: ignore[no-any-return]
        with self._session(module, stage, datamodule) as session:
            loader = _needed(dataloaders, datamodule, module, stage)
            self._load_weights(module, ckpt_path)
            loader = data.for_evaluation(loader, rank=session.ranks.rank, world_size=session.ranks.world_size)
            metrics = evaluate(self, session, module, loader, stage)
            self.metrics_log.add(self.current_epoch, self.global_step, metrics)
            self.metrics_log.write()
        return [metrics]

    @contextmanager
    def _session(self, module: Module, stage: Stage, datamodule: DataModule | None) -> Iterator[Session]:
        ranks = Ranks.current() or Ranks()
        expected = self.devices * self.num_nodes
        if ranks.distributed and ranks.world_size != expected:
            warnings.warn(
                f"running as rank {ranks.rank} of {ranks.world_size} as the environment says, "
                f"not the {expected} that devices={self.devices} x num_nodes={self.num_nodes} make",
                stacklevel=3,
            )
        device = ranks.device(self.accelerator)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        ranks.join(device)
        self._ranks = ranks
        if self._metrics is not None:  # rows a caller took back from ranks it started: rank 0 writes them
            self._metrics.folder = self.run_dir if ranks.is_zero else None
        self.stage = stage
        self.epoch_metrics = {}
        session = Session(ranks, device, Precision(self.precision, device), Hooks(self.callbacks, module))
        module.to(device)
        session.precision.convert_module(module)
        if self.compile:
            module.compile()
        module._trainer = self
        self.datamodule = datamodule
        if datamodule is not None:
            # Once per machine, its first rank, while the others wait (Lightning's prepare_data).
            if not ranks.distributed or int(os.environ.get("LOCAL_RANK", "0")) == 0:
                datamodule.prepare_data()
            ranks.barrier()
            datamodule.setup(stage)
        session.hooks.call("setup", self, module, stage)
        try:
            yield session
        finally:
            if datamodule is not None:
                datamodule.teardown(stage)
            session.hooks.call("teardown", self, module, stage)
            module._trainer = None
            module._log_sink = None
            self.stage = None
        # Every rank ends the call together: rank 0 has written its files, none tears down early.
        ranks.barrier()

    def _resume_path(self) -> Path | None:
        if self.resume is False:
            return None
        if self.resume == "auto":
            callback = self.checkpoint_callback
            last = callback.last_path if callback is not None else self.run_dir / "checkpoints" / "last.ckpt"
            return last if last.exists() else None
        path = Path(self.resume)
        if not path.exists():
            raise FileNotFoundError(f"resume: no checkpoint at {path}")
        return path

    def _load_weights(self, module: Module, ckpt_path: str | Path | None) -> None:
        """Load the weights of ``ckpt_path`` (read by rank 0, sent to every rank)."""
        if ckpt_path is None:
            return
        path = Path(ckpt_path)
        callback = self.checkpoint_callback
        if ckpt_path in ("best", "last"):
            if callback is None:
                raise ValueError(f"ckpt_path={ckpt_path!r} needs a ModelCheckpoint callback")
            path = Path(callback.best_model_path) if ckpt_path == "best" else callback.last_path
            if ckpt_path == "best" and not callback.best_model_path:
                raise ValueError("ckpt_path='best': the ModelCheckpoint has kept no checkpoint yet")
        state = self._ranks.from_zero(checkpoint.load(path)["state_dict"] if self.is_global_zero else None)
        module.load_state_dict(state)

    # -- ranks started here

    def _where(self) -> Literal["here", "ranks", "job"]:
        """Where this call runs: in this process (as one rank, maybe of ranks that exist already),
        in ranks it starts here, or as a GPUlayer gang job."""
        if Ranks.current() is not None:
            return "here"
        if self.num_nodes > 1 or self.remote:
            return "job"
        return "ranks" if self.devices > 1 else "here"

    def relocate(self, run_dir: Path) -> None:
        """Use ``run_dir`` as the run folder (and its ``checkpoints/`` for checkpoint callbacks that
        had the old one's)."""
        for callback in self.callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath == self.run_dir / "checkpoints":
                callback.dirpath = run_dir / "checkpoints"
        self.run_dir = run_dir

    def _elsewhere(self, where: Literal["ranks", "job"], call: str, module: Module, *args: Any) -> Any:
        """Run ``self.<call>(module, *args)`` in ranks started here or in a gang job; take back rank
        0's outcome."""
        seed = int(torch.randint(2**31 - 1, ()).item())
        work = _Call(self, call, module, args)
        if where == "ranks":
            outcome = spawn.run_ranks(self.devices, work, seed)
        else:
            outcome = remote.run_job(self, work, seed)
        if outcome["state_dict"] is not None:
            module.load_state_dict(outcome["state_dict"])
        for name in ("current_epoch", "global_step", "should_stop", "callback_metrics", "resumed_from"):
            setattr(self, name, outcome[name])
        for callback in self.callbacks:
            if callback.state_key in outcome["callbacks"]:
                callback.load_state_dict(outcome["callbacks"][callback.state_key])
        self._metrics = MetricsLog(self.run_dir, outcome["metrics"])
        return outcome["value"]


class _Call:
    """One Trainer call, as a rank runs it: what it returns, and what the caller takes back of rank 0's
    state (the trained weights after ``fit``, progress, metrics and callbacks' states)."""

    def __init__(self, trainer: Trainer, call: str, module: Module, args: tuple[Any, ...]) -> None:
        self.trainer, self.call, self.module, self.args = trainer, call, module, args

    def __call__(self) -> dict[str, Any]:
        trainer = self.trainer
        value = getattr(trainer, self.call)(self.module, *self.args)
        fitted = self.call == "fit"
        return {
            "value": value,
            "state_dict": {k: v.cpu() for k, v in self.module.state_dict().items()} if fitted else None,
            "current_epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "should_stop": trainer.should_stop,
            "callback_metrics": trainer.callback_metrics,
            "resumed_from": trainer.resumed_from,
            "callbacks": {callback.state_key: callback.state_dict() for callback in trainer.callbacks},
            "metrics": trainer.metrics_log.rows,
        }


def _default_run_dir() -> Path:
    """A GPUlayer command job's checkpoint folder (kept in Redis while it runs, restored for a retry
    on any worker); else ``gpulayer_runs/<job id>``, or ``gpulayer_runs/default`` outside a job."""
    kept = os.environ.get(CHECKPOINT_VARIABLE)
    if kept:
        return Path(kept)
    return Path(RUNS_FOLDER) / (os.environ.get(JOB_ID_VARIABLE) or "default")


def _arranged(
    callbacks: Sequence[Callback], run_dir: Path, checkpointing: bool, progress: bool
) -> list[Callback]:
    """The callbacks a trainer runs: the given ones, a progress bar, and checkpoint callbacks last
    (so that the state they save includes what the others did at the same hook)."""
    arranged = list(callbacks)
    if progress and not any(isinstance(callback, ProgressBar) for callback in arranged):
        arranged.append(ProgressBar())
    if checkpointing and not any(isinstance(callback, ModelCheckpoint) for callback in arranged):
        arranged.append(ModelCheckpoint(save_top_k=0))  # last.ckpt alone: what a resume needs
    for callback in arranged:
        if isinstance(callback, ModelCheckpoint) and callback.dirpath is None:
            callback.dirpath = run_dir / "checkpoints"
    keys = [callback.state_key for callback in arranged]
    if len(set(keys)) != len(keys):
        raise ValueError(f"two callbacks share a state_key (give them different settings): {keys}")
    return [c for c in arranged if not isinstance(c, ModelCheckpoint)] + [
        c for c in arranged if isinstance(c, ModelCheckpoint)
    ]


def _loader(
    given: DataLoader[Any] | None, datamodule: DataModule | None, module: Module, method: str
) -> DataLoader[Any] | None:
    """The loader a call was given; else its datamodule's ``method()``; else its model's."""
    if given is not None:
        return given
    for source in (datamodule, module):
        found: DataLoader[Any] | None = getattr(source, method)() if source is not None else None
        if found is not None:
            return found
    return None


def _needed(
    given: DataLoader[Any] | None, datamodule: DataModule | None, module: Module, stage: str
) -> DataLoader[Any]:
    method = {"validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader"}[stage]
    found = _loader(given, datamodule, module, method)
    if found is None:
        raise ValueError(f"{stage} needs dataloaders, a datamodule or a model whose {method}() returns one")
    return found
