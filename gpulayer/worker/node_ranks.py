"""The ranks of one node of a gang job: each with the environment torchrun would give it (the
``direct`` launcher), or torchrun itself with a static rendezvous (the ``torchrun`` launcher)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..models import Distributed
from ..payloads import CALL

#: A node other than node 0 waits this long (s) for node 0 to say where rank 0 listens.
GANG_START_TIMEOUT = 60.0
#: Ends the name of the file a rank of a function's gang job leaves its result in.
RESULT_SUFFIX = ".result"


def direct(
    gang: Distributed, node: int, master: str, devices: Sequence[str], env: dict[str, str]
) -> list[tuple[int, dict[str, str]]]:
    """(global rank, environment) of each rank on ``node``: torchrun's variables, and each rank's GPUs."""
    host, port = master.rsplit(":", 1)
    per = gang.procs_per_node
    common = {
        "MASTER_ADDR": host,
        "MASTER_PORT": port,
        "WORLD_SIZE": str(gang.world_size),
        "LOCAL_WORLD_SIZE": str(per),
        "NODE_RANK": str(node),
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": str(gang.nodes),
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(gang.world_size),
    }
    if per > 1 and "OMP_NUM_THREADS" not in env:
        # As torchrun does: ranks sharing a machine would otherwise each start a thread per core.
        common["OMP_NUM_THREADS"] = "1"
    ranks = []
    for local in range(per):
        rank = node * per + local
        rank_env = {**common, "RANK": str(rank), "LOCAL_RANK": str(local), "ROLE_RANK": str(rank)}
        if devices:
            rank_env["CUDA_VISIBLE_DEVICES"] = ",".join(share(devices, local, per))
        ranks.append((rank, rank_env))
    return ranks


def share(devices: Sequence[str], local: int, count: int) -> list[str]:
    """The GPUs local rank ``local`` of ``count`` sees: an equal share of the node's when they divide
    evenly (one each, when there are as many GPUs as ranks), else all of them."""
    if len(devices) >= count and len(devices) % count == 0:
        per = len(devices) // count
        return list(devices[local * per : (local + 1) * per])
    return list(devices)


def torchrun(gang: Distributed, node: int, master: str, command: Sequence[str], log_dir: Path) -> list[str]:
    """torchrun starting this node's ranks, with a static rendezvous at rank 0's address; ``--tee``
    prefixes each line with its local rank, which the worker turns into the line's rank."""
    host, port = master.rsplit(":", 1)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={gang.nodes}",
        f"--nproc-per-node={gang.procs_per_node}",
        f"--node-rank={node}",
        f"--master-addr={host}",
        f"--master-port={port}",
        "--tee=3",
        f"--log-dir={log_dir}",
        "--no-python",
        *command,
    ]


def call_command(folder: Path) -> list[str]:
    """The command each rank of a function's gang job runs: the call, written to ``folder`` first."""
    return [sys.executable, "-m", "gpulayer.worker.rank_process", str(folder / CALL), str(folder)]


def call_result(folder: Path, rank: int | None) -> tuple[dict[str, Any], bytes] | None:
    """The reply header and pickled payload ``rank`` left (rank 0's value, or a rank's exception);
    with ``rank`` None, the first exception any rank here left. None if there is none."""
    paths = (
        [folder / f"{rank}{RESULT_SUFFIX}"] if rank is not None else sorted(folder.glob(f"*{RESULT_SUFFIX}"))
    )
    for path in paths:
        try:
            header, _, payload = path.read_bytes().partition(b"\n")
        except FileNotFoundError:
            continue
        reply: dict[str, Any] = json.loads(header)
        if rank is not None or not reply["ok"]:
            return reply, payload
    return None
