"""What validate_gpu.py's jobs run on the worker: each mode prints one line, ``VALIDATE {json}``,
with what it saw, and exits 0 (what is right or wrong is decided by the check that reads it).

    python _gpu_job.py see  --device cuda     # CUDA_VISIBLE_DEVICES, the devices torch sees, a matmul
    python _gpu_job.py hold --device cuda --seconds 20
    python _gpu_job.py load --device cuda --seconds 15
    python _gpu_job.py gang --device cuda --backend nccl

The file travels as the jobs' input, alone: it imports nothing of the repository. ``cuda_sum`` is
what the ``@gl.remote`` check calls (by reference, from the benchmarks folder shipped with it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

MARK = "VALIDATE "


def say(**fields: Any) -> None:
    print(MARK + json.dumps(fields), flush=True)


def _environment() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}


def see(device: str) -> None:
    import torch

    seen: dict[str, Any] = {"env": _environment(), "device_count": 0, "names": [], "uuids": []}
    if device == "cuda":
        count = torch.cuda.device_count()
        properties = [torch.cuda.get_device_properties(index) for index in range(count)]
        seen.update(
            device_count=count,
            names=[p.name for p in properties],
            # torch gives the UUID without NVML's "GPU-" prefix; None where this torch gives none.
            uuids=[f"GPU-{p.uuid}" if getattr(p, "uuid", None) else None for p in properties],
        )
    a = torch.randn(512, 512, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    product = (a.to(device) @ a.to(device).T).cpu()
    seen["matmul_max_error"] = float((product - a @ a.T).abs().max())
    say(**seen)


def hold(device: str, seconds: float) -> None:
    import torch

    # Memory on the device, so the GPU is held in fact and not only in GPUlayer's books.
    block = torch.ones(16, 2**20, device=device)
    say(env=_environment(), holding=float(block.sum()))
    time.sleep(seconds)


def load(device: str, seconds: float) -> None:
    import torch

    say(env=_environment(), loading=seconds)
    if device != "cuda":
        time.sleep(seconds)  # a rehearsal: a simulated GPU is 100% busy while held, whatever runs
        return
    a = torch.randn(8192, 8192, device=device)
    end, rounds = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        for _ in range(10):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize()
        rounds += 10
    say(matmuls=rounds)


def gang(device: str, backend: str) -> None:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(backend)
    where = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(where)
    mine = torch.full((4,), float(rank + 1), device=where) * 2.0
    # gloo reduces host tensors; NCCL device tensors.
    total = mine if backend == "nccl" else mine.cpu()
    dist.all_reduce(total)
    say(rank=rank, world=world, env=_environment(), total=float(total[0]), expected=world * (world + 1.0))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    # Skips the interpreter's teardown, where gloo now and then aborts a finished rank (docs/distributed.md).
    os._exit(0)


def devices() -> None:
    """Whether each NVIDIA GPU device node opens here: "opened", or the error's name (EPERM: the
    job's device cgroup refused it)."""
    import errno
    import glob

    opened: dict[str, str] = {}
    for node in sorted(glob.glob("/dev/nvidia[0-9]*")):
        try:
            os.close(os.open(node, os.O_RDWR))
            opened[node] = "opened"
        except OSError as exc:
            opened[node] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    say(env=_environment(), devices=opened)


def cuda_sum(n: int, device: str) -> dict[str, Any]:
    """The sum of the squares below ``n``, computed on ``device``, and what the call ran on."""
    import torch

    total = int((torch.arange(n, device=device, dtype=torch.int64) ** 2).sum().item())
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    return {"sum": total, "device": name, "env": _environment()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["see", "hold", "load", "gang", "devices"])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    args = parser.parse_args()
    if args.mode == "see":
        see(args.device)
    elif args.mode == "hold":
        hold(args.device, args.seconds)
    elif args.mode == "load":
        load(args.device, args.seconds)
    elif args.mode == "devices":
        devices()
    else:
        gang(args.device, args.backend)


if __name__ == "__main__":
    main()
