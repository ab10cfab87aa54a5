"""Run a call as a GPUlayer gang job, ``num_nodes`` workers with ``devices`` ranks each, and take rank
0's value back: ``launch``'s function (``run_gang``), or one Trainer call (``run_job``), where the
Trainer of every rank joins the job's process group (as it joins torchrun's) and rank 0's run folder
(metrics files and checkpoints) comes back too, unpacked into the caller's.

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
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from .. import archive
from ..distributed import DistributedJob
from ..functions import FunctionHandle, RemoteKeywords
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

T = TypeVar("T")


def run_gang(
    call: Callable[[], T],
    *,
    nodes: int,
    devices: int,
    accelerator: str,
    job_options: RemoteKeywords,
    seed: int,
    what: str,
) -> T:
    """Submit ``call`` as a gang job of ``nodes`` x ``devices`` ranks, each seeded as local ranks
    are, and wait; rank 0's value (an exception a rank raised, raised here). ``what`` names whose
    ranks they are in the line that tells the caller the job's id."""
    client = job_options.get("client")
    options: dict[str, Any] = {key: value for key, value in job_options.items() if key != "client"}
    if accelerator == "cuda":
        options.setdefault("gpus", devices)
    gang = DistributedJob(_rank, nodes=nodes, procs_per_node=devices, args=(call, seed), **options)
    job = gang.submit(client)
    print(
        f"gpulayer: {what} {nodes} x {devices} ranks run as job {job.id} "
        f"(`gpulayer logs -f {job.id}` follows them)",
        file=sys.stderr,
    )
    with job.saying_why_queued(QUEUED_HINT_AFTER, lambda line: print(f"gpulayer: {line}", file=sys.stderr)):
        value: T = FunctionHandle(job).result()
    return value


def _rank(call: Callable[[], T], seed: int) -> T:
    """One rank of the job: ``call``, as a rank of the job's process group."""
    rank = int(os.environ["RANK"])
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)
    value = call()
    leave()
    return value


def run_job(trainer: Trainer, work: Callable[[], dict[str, Any]], seed: int) -> dict[str, Any]:
    """Submit ``work`` (a call of ``trainer``) as a gang job and wait; rank 0's outcome, with its
    run folder unpacked into ``trainer``'s."""
    outcome = run_gang(
        _TrainerRank(trainer, work),
        nodes=trainer.num_nodes,
        devices=trainer.devices,
        accelerator=trainer.accelerator,
        job_options=trainer.job_options,
        seed=seed,
        what="the Trainer's",
    )
    trainer.run_dir.mkdir(parents=True, exist_ok=True)
    run_folder = io.BytesIO(outcome.pop("run_folder"))
    extract(run_folder, trainer.run_dir, max_bytes=Settings.from_env().max_job_bytes, replace=True)
    return outcome


class _TrainerRank:
    """A Trainer call on one rank of the job, in a run folder of the worker's; rank 0 packs that
    folder into its outcome. (``work`` holds this same ``trainer``: they were pickled together.)"""

    def __init__(self, trainer: Trainer, work: Callable[[], dict[str, Any]]) -> None:
        self.trainer, self.work = trainer, work

    def __call__(self) -> dict[str, Any]:
        kept = os.environ.get(CHECKPOINT_VARIABLE)
        folder = Path(kept) if kept else Path(tempfile.gettempdir(), JOB_RUNS, os.environ[JOB_ID_VARIABLE])
        self.trainer.relocate(folder)
        outcome = self.work()
        if int(os.environ["RANK"]) == 0:
            outcome["run_folder"] = _packed(folder)
            if not kept:  # the worker removes its checkpoint folder itself
                shutil.rmtree(folder, ignore_errors=True)
        return outcome


def _packed(folder: Path) -> bytes:
    buffer = io.BytesIO()
    (archive.folder_manifest(folder) if folder.is_dir() else archive.Manifest()).write(buffer)
    return buffer.getvalue()
