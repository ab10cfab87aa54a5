"""Run one Trainer call as a GPUlayer gang job: ``num_nodes`` workers with ``devices`` ranks each,
where the Trainer of every rank joins the job's process group (as it joins torchrun's). Rank 0's
outcome comes back, with its run folder (metrics files and checkpoints) unpacked into the caller's.

The call travels as a remote function does (cloudpickle, signed, with the project's code bundle),
so the module may be defined in the calling script. On the workers, rank 0 writes the run folder
in its part's checkpoint folder (``GPULAYER_CHECKPOINT_DIR``), which node 0's worker keeps in Redis
as it changes: a retry after a lost worker resumes from its ``last.ckpt`` on any machine. (Under a
worker too old to give one, the machine's temporary folder, ``gpulayer-runs/<job id>``.)
"""

from __future__ import annotations

import io
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import archive
from ..distributed import DistributedJob
from ..functions import FunctionHandle
from ..models import CHECKPOINT_VARIABLE, JOB_ID_VARIABLE
from ..settings import Settings
from ..unpacking import extract
from .ranks import leave

if TYPE_CHECKING:
    from .trainer import Trainer

#: Where rank 0 of a gang job keeps the run folder, under the machine's temporary folder.
JOB_RUNS = "gpulayer-runs"
#: How long the job may wait in the queue before the caller is told why.
QUEUED_HINT_AFTER = 5.0


def run_job(trainer: Trainer, work: Callable[[], dict[str, Any]], seed: int) -> dict[str, Any]:
    """Submit ``work`` (a call of ``trainer``) as a gang job and wait; rank 0's outcome, with its
    run folder unpacked into ``trainer``'s."""
    client = trainer.job_options.get("client")
    options: dict[str, Any] = {key: value for key, value in trainer.job_options.items() if key != "client"}
    if trainer.accelerator == "cuda":
        options.setdefault("gpus", trainer.devices)
    job = DistributedJob(
        _rank, nodes=trainer.num_nodes, procs_per_node=trainer.devices, args=(trainer, work, seed), **options
    ).submit(client)
    print(
        f"gpulayer: the Trainer's {trainer.num_nodes} x {trainer.devices} ranks run as job {job.id} "
        f"(`gpulayer logs -f {job.id}` follows them)",
        file=sys.stderr,
    )
    with job.saying_why_queued(QUEUED_HINT_AFTER, lambda line: print(f"gpulayer: {line}", file=sys.stderr)):
        outcome: dict[str, Any] = FunctionHandle(job).result()
    trainer.run_dir.mkdir(parents=True, exist_ok=True)
    run_folder = io.BytesIO(outcome.pop("run_folder"))
    extract(run_folder, trainer.run_dir, max_bytes=Settings.from_env().max_job_bytes, replace=True)
    return outcome


def _rank(trainer: Trainer, work: Callable[[], dict[str, Any]], seed: int) -> dict[str, Any]:
    """One rank of the job: the call, as a rank of the job's process group. (``work`` holds this
    same ``trainer``: they were pickled together.)"""
    rank = int(os.environ["RANK"])
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)
    kept = os.environ.get(CHECKPOINT_VARIABLE)
    folder = Path(kept) if kept else Path(tempfile.gettempdir(), JOB_RUNS, os.environ[JOB_ID_VARIABLE])
    trainer.relocate(folder)
    outcome = work()
    leave()
    if rank == 0:
        outcome["run_folder"] = _packed(folder)
        if not kept:  # the worker removes its checkpoint folder itself
            shutil.rmtree(folder, ignore_errors=True)
    return outcome


def _packed(folder: Path) -> bytes:
    buffer = io.BytesIO()
    (archive.folder_manifest(folder) if folder.is_dir() else archive.Manifest()).write(buffer)
    return buffer.getvalue()
