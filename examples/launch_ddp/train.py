"""A plain PyTorch training loop run by ``gl.torch.launch``: the loop is yours, the Runtime puts it on
the device, in the precision, and across data-parallel ranks. The same script runs anywhere; only
its arguments change:

    python train.py                          # in this process (on a GPU if there is one)
    python train.py --devices 2              # two DDP ranks on this machine
    python train.py --nodes 2 --devices 2    # ranks on two machines, a GPUlayer gang job
    torchrun --nproc-per-node 2 train.py     # under torchrun: each rank runs the loop as itself

It saves a checkpoint after every epoch to --checkpoint and resumes from it when it is there; it
ends by printing a JSON summary (rank 0's).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer as gl


def dataset(samples: int, seed: int, features: int = 8) -> TensorDataset:
    """y = x . w + noise, the same for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator)
    w = torch.linspace(-1, 1, features).unsqueeze(1)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(samples, 1, generator=generator))


def train(runtime: gl.torch.Runtime, args: argparse.Namespace) -> dict[str, Any]:
    """Every rank runs this; the caller gets rank 0's value."""
    torch.manual_seed(0)  # the same initial weights on every rank (DDP would send rank 0's anyway)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer = runtime.setup(model, optimizer)
    train_loader, val_loader = runtime.setup_dataloaders(
        DataLoader(dataset(args.samples, seed=0), batch_size=args.batch_size, shuffle=True),
        DataLoader(dataset(args.samples // 4, seed=1), batch_size=args.batch_size),
    )
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "epoch": 0}
    checkpoint = Path(args.checkpoint)
    if checkpoint.exists():  # every rank calls load: rank 0 reads the file, the others get its state
        runtime.load(checkpoint, state)
        runtime.print(f"resumed from {checkpoint} after epoch {state['epoch']}")
    started = time.perf_counter()
    val_loss = torch.tensor(float("nan"))
    for epoch in range(state["epoch"], args.epochs):
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            runtime.backward(torch.nn.functional.mse_loss(model(x), y))
            runtime.clip_gradients(model, optimizer, max_norm=1.0)
            optimizer.step()
        model.eval()
        total, count = torch.zeros((), device=runtime.device), torch.zeros((), device=runtime.device)
        with torch.no_grad():
            for x, y in val_loader:
                total += torch.nn.functional.mse_loss(model(x), y, reduction="sum")
                count += len(y)
        runtime.all_reduce([total, count], op="sum")
        val_loss = total / count
        runtime.print(f"epoch {epoch}: val_loss {val_loss.item():.4f}")
        state["epoch"] = epoch + 1
        runtime.save(checkpoint, state)  # rank 0 writes it
    return {
        "world_size": runtime.world_size,
        "epochs": state["epoch"],
        "val_loss": val_loss.item(),
        "seconds": round(time.perf_counter() - started, 3),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--accelerator", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--precision", default="32", choices=["32", "bf16-mixed", "16-mixed"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--checkpoint", default="launch_ddp.ckpt", help="on rank 0's machine")
    args = parser.parse_args(argv)
    summary = gl.torch.launch(
        train,
        args,
        devices=args.devices,
        num_nodes=args.nodes,
        accelerator=args.accelerator,
        precision=args.precision,
    )
    # Under torchrun every rank runs this script, and launch returns each its own summary.
    gl.torch.rank_zero_only(print)(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
