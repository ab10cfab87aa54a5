"""A data-parallel training loop with torch.distributed: run it as a gang job and every rank trains
on its own shard, gradients averaged across ranks. NCCL on CUDA GPUs, gloo on CPU.

    gpulayer submit --nodes 2 --procs-per-node 2 --source examples/distributed --wait -- python3 ddp.py
    gpulayer submit --nodes 2 --gpus-per-node 4 --source examples/distributed -- python3 ddp.py
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")  # each rank sees its own GPU as 0
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1).to(device), device_ids=[0] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(rank)
    inputs = torch.randn(256, 8, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True)
    for _ in range(50):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    print(f"rank {rank}/{world} on {os.environ.get('NODE_RANK', '?')}: loss {loss.item():.4f}", flush=True)
    if rank == 0:
        print(f"mean loss over {world} ranks: {total.item() / world:.4f}", flush=True)
    # No rank tears its connections down while another still uses them (gloo aborts if one does).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Skip the interpreter's teardown: gloo's threads can still be unwinding there, and torch 2.x
    # now and then aborts the process at that point ("terminate called without an active
    # exception") after the work is done. Nothing is left to flush but stdio.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
