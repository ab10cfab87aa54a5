"""Start ``devices`` ranks on this machine, run one Trainer call in each, and bring rank 0's outcome back.

The ranks are new Python processes started with ``spawn`` (``torch.multiprocessing``): the script
that called the Trainer is imported in each, not run, so its ``if __name__ == "__main__":`` block
starts nothing there. The call (the trainer, the module, the data) reaches them through
cloudpickle, which carries classes defined in that script or in a notebook by value. Each rank
gets the environment torchrun would give it, so the Trainer inside joins the process group as
it would under torchrun or in a GPUlayer gang job. A rank that raises ends them all, and its
exception is raised here, caused by torch's ``ProcessRaisedException``, which holds the rank's
traceback (that alone where the exception does not pickle). A rank whose parent dies is sent SIGINT.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import torch
from torch.multiprocessing.spawn import ProcessRaisedException, start_processes

from ..network import free_port
from .ranks import leave

#: The file the first rank to fail claims, in the ranks' shared folder.
FIRST = "first.error"


def run_ranks(count: int, call: Callable[[], Any], seed: int) -> Any:
    """Run ``call`` in ``count`` local ranks; rank 0's value. Rank ``r`` seeds its generators with
    ``seed + r``, so a script that seeds before calling the Trainer is reproducible."""
    payload = cloudpickle.dumps(call)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gpulayer-ranks-") as folder:
        result = Path(folder) / "rank0.pt"
        try:
            start_processes(  # type: ignore[no-untyped-call]
                _rank,
                args=(count, port, seed, payload, folder),
                nprocs=count,
                join=True,
                start_method="spawn",
            )
        except ProcessRaisedException as failed:
            # The exception of the rank that failed first (torch names whichever it saw end first,
            # maybe one whose peer's exit broke its collective), caused by torch's, which holds the
            # rank's traceback.
            raise _raised(Path(folder), _first(Path(folder), failed.error_index)) or failed from failed
        # Our own file, just written by our own rank 0: not data from elsewhere.
        return torch.load(result, weights_only=False)


def _first(folder: Path, otherwise: int) -> int:
    """The rank that failed first, as it claimed (``otherwise`` where none could)."""
    try:
        return int((folder / FIRST).read_text())
    except (OSError, ValueError):
        return otherwise


def _raised(folder: Path, rank: int) -> BaseException | None:
    """The exception rank ``rank`` raised, if it pickled."""
    try:
        # Our own file, written by our own rank: not data from elsewhere.
        error: BaseException = cloudpickle.loads((folder / f"rank{rank}.error").read_bytes())
    except Exception:
        return None
    return error


def _rank(rank: int, count: int, port: int, seed: int, payload: bytes, folder: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(count),
        LOCAL_WORLD_SIZE=str(count),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    if "OMP_NUM_THREADS" not in os.environ:
        # As torchrun does: ranks sharing a machine would otherwise each start a thread per core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // count))
    torch.manual_seed(seed + rank)
    random.seed(seed + rank)
    call: Callable[[], Any] = cloudpickle.loads(payload)
    try:
        value = call()
    except Exception as error:
        _keep(error, Path(folder) / f"rank{rank}.error")
        _claim_first(Path(folder), rank)
        raise  # torch's wrapper reports it, and ends the other ranks
    if rank == 0:
        torch.save(value, Path(folder) / "rank0.pt")
    leave()
    sys.stdout.flush()
    sys.stderr.flush()
    # Done, and rank 0's outcome is on disk: skip the interpreter's teardown, which takes seconds
    # with torch loaded and where gloo's threads now and then abort a finished rank.
    os._exit(0)


def _claim_first(folder: Path, rank: int) -> None:
    """Say this rank failed first, unless one already did. A rank whose collective breaks because a
    peer failed and left does so after that peer's claim: its exit came after the claim."""
    try:
        with open(folder / FIRST, "x") as file:
            file.write(str(rank))
    except FileExistsError:
        pass


def _keep(error: Exception, path: Path) -> None:
    """Write ``error`` for the parent, where it pickles."""
    try:
        kept = cloudpickle.dumps(error)
    except Exception:
        return  # the parent raises torch's exception alone, which holds the traceback's text
    path.write_bytes(kept)
