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
import sys
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
from . import checkpoint, data, elsewhere, options
from .callbacks import Callback, Hooks, ModelCheckpoint, Stage
from .data_module import DataModule, find_loader, needed_loader
from .loggers import Logger, MetricsFiles
from .loops import FitLoop, Session, evaluate, predict
from .metrics import MetricsLog
from .module import Module
from .optim import Optimization
from .options import LoggerOption
from .precision import Precision, PrecisionName, precision_name
from .ranks import Accelerator, RankProperties, Ranks

#: Where a run's folder is when ``default_root_dir`` is not given, under the working directory.
RUNS_FOLDER = "gpulayer_runs"


class Trainer(RankProperties):
    """Runs a :class:`Module`'s steps: ``fit``, ``validate``, ``test``, ``predict``.

    ``accelerator``: ``"auto"`` takes CUDA, else MPS, else the CPU; ``"gpu"`` is CUDA (MPS on a
    Mac). ``devices``: ranks on this machine (CUDA: one GPU each; CPU: processes sharing its
    cores); ``"auto"`` or ``-1``: every CUDA GPU here, else 1. ``strategy``: Lightning's DDP names
    (``"auto"``, ``"ddp"``, ``"ddp_spawn"``, ``"ddp_find_unused_parameters_true"``, ...), all run
    as data-parallel ranks; others are refused. ``num_nodes`` and ``remote``:
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
    ``limit_train_batches`` (and ``_val_``, ``_test_``, ``_predict_``): each rank's batches per
    epoch (an int) or fraction of them (a float); 0 skips that stage. ``num_sanity_val_steps``
    validation batches (-1: all) run before a fit's first epoch, their metrics dropped.
    ``fast_dev_run`` (``True`` or n): n batches (1) of each stage, one epoch, no checkpoints,
    loggers or resume. ``enable_model_summary``: a :class:`ModelSummary` when a fit starts.

    ``default_root_dir`` is the run folder: ``metrics.json``, ``metrics.csv`` (the default
    ``logger``; ``False``: none; or a :class:`~gpulayer.torch.loggers.Logger` or a list of them)
    and ``checkpoints/``.
    By default, in a GPUlayer command job, the job's checkpoint folder (``GPULAYER_CHECKPOINT_DIR``:
    kept in Redis as it changes, and given back to a retry on any worker); else
    ``./gpulayer_runs/default``.
    Only rank 0 writes there. Unless ``enable_checkpointing=False``, a :class:`ModelCheckpoint` is
    added when none is given: after every epoch it writes ``checkpoints/last.ckpt`` and keeps the
    latest epoch's checkpoint as the best (as Lightning's default).

    ``resume``: ``"auto"`` makes ``fit`` continue from the run folder's ``last.ckpt`` when there is
    one (a rerun, or a GPUlayer job retried after its worker was lost, whose run folder survived),
    else start afresh; ``False`` always starts afresh; a path continues from that checkpoint.
    """

    def __init__(
        self,
        *,
        accelerator: Accelerator | Literal["gpu"] = "auto",
        strategy: str = "auto",
        devices: int | Literal["auto"] = 1,
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
        limit_train_batches: int | float = 1.0,
        limit_val_batches: int | float = 1.0,
        limit_test_batches: int | float = 1.0,
        limit_predict_batches: int | float = 1.0,
        fast_dev_run: bool | int = False,
        num_sanity_val_steps: int = 2,
        callbacks: Sequence[Callback] = (),
        logger: LoggerOption = True,
        default_root_dir: str | Path | None = None,
        enable_checkpointing: bool = True,
        enable_progress_bar: bool = True,
        enable_model_summary: bool = True,
        resume: Literal["auto", False] | str | Path = "auto",
        job_options: RemoteKeywords | None = None,
    ) -> None:
        if fast_dev_run < 0 or num_sanity_val_steps < -1:
            raise ValueError("fast_dev_run must be a bool or at least 0; num_sanity_val_steps at least -1")
        if fast_dev_run:  # Lightning's: n batches of each stage, one epoch, nothing written
            n = int(fast_dev_run)
            limit_train_batches = limit_val_batches = limit_test_batches = limit_predict_batches = n
            max_epochs, max_steps, val_check_interval, check_val_every_n_epoch = 1, n, 1.0, 1
            num_sanity_val_steps, logger, resume = 0, False, False
            if (Ranks.current() or Ranks()).is_zero:
                print(f"fast_dev_run: {n} batch(es) a stage; no logging or checkpoints", file=sys.stderr)
        self.accelerator: Accelerator = options.accelerator(accelerator)
        devices = options.devices(devices, self.accelerator)
        for name, value in (("num_nodes", num_nodes),
                            ("accumulate_grad_batches", accumulate_grad_batches),
                            ("check_val_every_n_epoch", check_val_every_n_epoch),
                            ("log_every_n_steps", log_every_n_steps)):  # fmt: skip
            if value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        self.strategy = options.strategy(strategy)
        self.devices = devices
        self.num_nodes = num_nodes
        self.remote = remote
        self.precision: PrecisionName = precision_name(precision)
        self.compile = compile
        self.max_epochs, self.max_steps = max_epochs, max_steps
        self.accumulate_grad_batches = accumulate_grad_batches
        self.gradient_clip_val = gradient_clip_val
        self.gradient_clip_algorithm = gradient_clip_algorithm
        self.check_val_every_n_epoch = check_val_every_n_epoch
        self.val_check_interval = val_check_interval
        self.log_every_n_steps = log_every_n_steps
        (
            self.limit_train_batches,
            self.limit_val_batches,
            self.limit_test_batches,
            self.limit_predict_batches,
        ) = options.limits(limit_train_batches, limit_val_batches, limit_test_batches, limit_predict_batches)
        self.num_sanity_val_steps = num_sanity_val_steps
        self.resume = resume
        self.job_options: RemoteKeywords = job_options or {}
        self.run_dir = Path(default_root_dir or _default_run_dir()).absolute()
        self.loggers: list[Logger] = options.loggers(logger, self.run_dir)
        #: Lightning's: ``True`` for one batch, the number n for more, ``False`` when off.
        self.fast_dev_run: bool | int = True if fast_dev_run == 1 else fast_dev_run
        self.callbacks = options.arranged(
            callbacks, self.run_dir, enable_checkpointing, enable_progress_bar, enable_model_summary
        )

        # What the last call left, and what a callback may read during one.
        self.current_epoch = self.global_step = 0
        self.should_stop = False
        #: The latest value of every metric.
        self.callback_metrics: dict[str, float] = {}
        #: This epoch's means (training, then validation); in validate and test, that stage's.
        self.epoch_metrics: dict[str, float] = {}
        #: This epoch's last value of each metric logged per step (``on_step``), as of the epoch's end.
        self.step_metrics: dict[str, float] = {}
        self.prog_bar_metrics: set[str] = set()
        self.num_training_batches: int | None = None
        self.stage: Stage | None = None
        #: Whether the sanity check's validation is running.
        self.sanity_checking = False
        #: The checkpoint the last ``fit`` resumed from, if it did.
        self.resumed_from: Path | None = None
        self._ranks = Ranks()
        self._metrics: MetricsLog | None = None
        self._fit: FitLoop | None = None
        #: The model of the last ``fit``: what ``validate``, ``test`` and ``predict`` take when given none.
        self._fitted: Module | None = None
        #: The ``datamodule`` of the current (or last) call, if it had one.
        self.datamodule: DataModule | None = None
        #: What the last fit's rank 0 would have saved at its end, when it ran in ranks started here.
        self._last_checkpoint: dict[str, Any] | None = None

    #: Whether a checkpoint already warned of hyperparameters it left out.
    _warned_hparams = False

    def __getstate__(self) -> dict[str, Any]:
        # What a gang job is submitted with (a client among it) stays with the caller: ranks get none.
        return {**self.__dict__, "job_options": {}, "_fitted": None, "_fit": None, "_last_checkpoint": None}

    def __repr__(self) -> str:
        return f"Trainer(devices={self.devices}, num_nodes={self.num_nodes}, run_dir={str(self.run_dir)!r})"

    # -- what callbacks read (and RankProperties' global_rank, local_rank, world_size, ...)

    @property
    def logger(self) -> Logger | None:
        """The first of ``loggers`` (by default, the run folder's metrics files), or None."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        """The first logger's folder, else the run folder."""
        found = self.logger.log_dir if self.logger is not None else None
        return found or str(self.run_dir)

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
            self._metrics.attach(self._rank_loggers)
        return self._metrics

    def monitored(self, name: str) -> float | None:
        """``name``'s value for a callback deciding by it at an epoch's end: the epoch's (of a metric
        logged per step and per epoch, its ``_epoch`` value), else its last step's this epoch; None
        when this epoch logged none (an epoch that skipped validation)."""
        for found in (self.epoch_metrics.get(name), self.epoch_metrics.get(f"{name}_epoch")):
            if found is not None:
                return found
        return self.step_metrics.get(name)

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
            train = find_loader(train_dataloaders, datamodule, module, "train_dataloader")
            if train is None:
                raise ValueError(
                    "fit needs train_dataloaders, a datamodule, or a model whose train_dataloader() gives one"
                )
            val = find_loader(val_dataloaders, datamodule, module, "val_dataloader")
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
        ``"last"`` name the checkpoint callback's). No model: the one fitted last, with the weights of
        its best checkpoint when no ``ckpt_path`` is given and the checkpoint callback kept one (as
        Lightning does)."""
        module, ckpt_path = self._model(model, "validate"), self._checkpoint_for(model, ckpt_path)
        return self._evaluate("validate", module, dataloaders, ckpt_path, datamodule)

    def test(
        self,
        model: Module | None = None,
        dataloaders: DataLoader[Any] | None = None,
        ckpt_path: str | Path | None = None,
        datamodule: DataModule | None = None,
    ) -> list[dict[str, float]]:
        """Run ``test_step`` over the data; the logged metrics' means over it (see ``validate``)."""
        module, ckpt_path = self._model(model, "test"), self._checkpoint_for(model, ckpt_path)
        return self._evaluate("test", module, dataloaders, ckpt_path, datamodule)

    def predict(
        self,
        model: Module | None = None,
        dataloaders: DataLoader[Any] | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | Path | None = None,
    ) -> list[Any]:
        """``predict_step``'s output for each batch, in order, moved to the CPU (from every rank)."""
        module, ckpt_path = self._model(model, "predict"), self._checkpoint_for(model, ckpt_path)
        if (where := self._where()) != "here":
            return self._elsewhere(where, "predict", module, dataloaders, datamodule, ckpt_path)  # type: ignore[no-any-return]
        with self._session(module, "predict", datamodule) as session:
            loader = needed_loader(dataloaders, datamodule, module, "predict")
            self._load_weights(module, ckpt_path)
            loader = data.for_evaluation(loader, rank=session.ranks.rank, world_size=session.ranks.world_size)
            limit = data.limited(data.length(loader), self.limit_predict_batches, "limit_predict_batches")
            return predict(self, session, module, loader, limit) if limit != 0 else []

    def _checkpoint_for(self, given: Module | None, ckpt_path: str | Path | None) -> str | Path | None:
        """The checkpoint a call loads: the one given; with no model, the fitted one's best."""
        callback = self.checkpoint_callback
        if given is None and ckpt_path is None and callback is not None and callback.best_model_path:
            return "best"
        return ckpt_path

    def _model(self, given: Module | None, call: str) -> Module:
        if given is not None:
            return given
        if self._fitted is None:
            raise ValueError(f"{call} needs a model: none was given, and this trainer has fitted none")
        return self._fitted

    def save_checkpoint(self, *paths: str | Path) -> None:
        """Write the fit's checkpoint to each of ``paths``, during ``fit`` (from a callback) or after
        it. In a fit's ranks it is a collective (every rank calls it, with the same paths, at the
        same point), since it gathers each rank's RNG state; only rank 0 writes. After ranks this
        trainer started, it writes what their rank 0 held at the fit's end."""
        targets = [Path(path) for path in paths]
        if self._fit is None:
            if self._last_checkpoint is None:
                raise RuntimeError("save_checkpoint needs a fit: this trainer has run none")
            checkpoint.save(self._last_checkpoint, targets)
            return
        state = self._checkpoint_state(self._fit)
        if state is not None:
            checkpoint.save(state, targets)

    def _checkpoint_state(self, loop: FitLoop) -> dict[str, Any] | None:
        """What a checkpoint of ``loop`` holds, on rank 0 (None on the others); a collective."""
        per_rank = self._ranks.gather(loop.rank_state())
        if not self.is_global_zero:
            return None
        hyper_parameters, left_out = checkpoint.storable(dict(loop.module.hparams))
        if left_out and not self._warned_hparams:
            self._warned_hparams = True
            warnings.warn(
                f"hyperparameters {', '.join(left_out)} are not plain values (numbers, strings, tensors, "
                "lists, dicts): checkpoints leave them out; give them to load_from_checkpoint, or "
                "save_hyperparameters(ignore=[...])",
                stacklevel=3,
            )
        return {
            "format": checkpoint.FORMAT,
            **loop.state(),
            "state_dict": loop.module.state_dict(),
            "hyper_parameters": hyper_parameters,
            "callbacks": {callback.state_key: callback.state_dict() for callback in self.callbacks},
            "ranks": per_rank,
            "metrics": self.metrics_log.rows,
            "callback_metrics": self.callback_metrics,
        }

    # -- in this process, as one rank

    def _run_fit(
        self, session: Session, module: Module, train: DataLoader[Any], val: DataLoader[Any] | None
    ) -> None:
        manual = not module.automatic_optimization
        if manual and (self.accumulate_grad_batches > 1 or self.gradient_clip_val is not None):
            raise ValueError(
                "with automatic_optimization = False, accumulate and clip in training_step "
                "(self.clip_gradients), not with accumulate_grad_batches or gradient_clip_val"
            )
        optim = Optimization.parse(module.configure_optimizers(), manual=manual)
        ranks = session.ranks
        path = self._resume_path() if ranks.is_zero else None
        found = ranks.from_zero(checkpoint.load(path) if path is not None else None)
        seed = found["seed"] if found else ranks.from_zero(int(torch.randint(2**31 - 1, ()).item()))
        loop = FitLoop(self, session, module, train, val, optim, seed)
        self.current_epoch = self.global_step = 0
        self.should_stop = False
        self.callback_metrics, self.prog_bar_metrics = {}, set()
        self._metrics = MetricsLog(found["metrics"] if found else None)
        self._metrics.attach(self._rank_loggers)
        self.resumed_from = ranks.from_zero(path)
        if found:
            self.callback_metrics = dict(found["callback_metrics"])
            for callback in self.callbacks:
                if callback.state_key in found["callbacks"]:
                    callback.load_state_dict(found["callbacks"][callback.state_key])
            loop.restore(found)  # last: it sets the random generators as they were
        for logger in self._rank_loggers:
            logger.log_hyperparams(dict(module.hparams))
        # Kept after the fit: save_checkpoint, the optimizers and schedulers are still there.
        self._fit, self._last_checkpoint = loop, None
        session.hooks.call("on_fit_start", self, module)
        loop.sanity_check()
        if self.limit_train_batches != 0:  # Lightning's fit trains nothing, not even its hooks
            session.hooks.call("on_train_start", self, module)
            loop.run()
            session.hooks.call("on_train_end", self, module)
        session.hooks.call("on_fit_end", self, module)

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
            loader = needed_loader(dataloaders, datamodule, module, stage)
            self._load_weights(module, ckpt_path)
            loader = data.for_evaluation(loader, rank=session.ranks.rank, world_size=session.ranks.world_size)
            option = "limit_val_batches" if stage == "validate" else "limit_test_batches"
            limit = data.limited(data.length(loader), getattr(self, option), option)
            if limit == 0:  # as Lightning: a stage limited to no batches runs none of its hooks
                return []
            metrics = evaluate(self, session, module, loader, stage, limit=limit)
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
        if self._metrics is not None:  # rows a caller took back from ranks it started: rank 0 logs on
            self._metrics.attach(self._rank_loggers)
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
        status = "failed"
        try:
            yield session
            status = "success"
        finally:
            if datamodule is not None:
                datamodule.teardown(stage)
            session.hooks.call("teardown", self, module, stage)
            module._trainer = None
            module._log_sink = None
            self.stage = None
            for logger in self._rank_loggers:
                logger.finalize(status)
        # Every rank ends the call together: rank 0 has written its files, none tears down early.
        ranks.barrier()

    @property
    def _rank_loggers(self) -> list[Logger]:
        """The loggers this rank logs to: every one on rank 0, none elsewhere."""
        return self.loggers if self.is_global_zero else []

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
        for logger in self.loggers:
            if isinstance(logger, MetricsFiles) and logger.folder == self.run_dir:
                logger.folder = run_dir
        self.run_dir = run_dir

    def _elsewhere(self, where: Literal["ranks", "job"], call: str, module: Module, *args: Any) -> Any:
        return elsewhere.run(self, where, call, module, args)


def _default_run_dir() -> Path:
    """A GPUlayer command job's checkpoint folder (kept in Redis while it runs, restored for a retry
    on any worker); else ``gpulayer_runs/<job id>``, or ``gpulayer_runs/default`` outside a job."""
    kept = os.environ.get(CHECKPOINT_VARIABLE)
    if kept:
        return Path(kept)
    return Path(RUNS_FOLDER) / (os.environ.get(JOB_ID_VARIABLE) or "default")
