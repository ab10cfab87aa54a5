"""Checked by mypy (see pyproject.toml), never run: a loop launched with ``gl.torch.launch``, as a
user writes it, type-checks, and launch returns what the function returns."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer as gl


def train(runtime: gl.torch.Runtime, epochs: int) -> float:
    model = torch.nn.Linear(4, 1)
    model, optimizer = runtime.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    loader = runtime.setup_dataloaders(DataLoader(data, batch_size=4))
    train_loader, val_loader = runtime.setup_dataloaders(DataLoader(data), DataLoader(data))
    loss = torch.zeros(())
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            runtime.backward(loss)
            optimizer.step()
    runtime.save("run.ckpt", {"model": model, "optimizer": optimizer, "epochs": epochs})
    rest: dict[str, object] = runtime.load("run.ckpt", {"model": model})
    total: torch.Tensor = runtime.all_reduce(loss.detach(), op="sum")
    runtime.print(rest, total, len(train_loader), len(val_loader), runtime.rank, runtime.is_global_zero)
    return float(total)


final: float = gl.torch.launch(train, 3, devices=2, precision="bf16-mixed")
