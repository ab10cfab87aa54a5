"""Fit a small regression with ``gl.torch.Trainer``. The same script runs anywhere; only its
arguments change:

    python train.py                                    # in this process (on a GPU if there is one)
    python train.py --devices 2                        # two data-parallel ranks on this machine
    python train.py --nodes 2 --devices 2              # ranks on two machines, a GPUlayer gang job
    python train.py --remote                           # on a GPUlayer worker
    torchrun --nproc-per-node 2 train.py --devices 2   # under torchrun: the Trainer joins its ranks

Metrics and checkpoints go to --root. Kill it and run it again with the same --root: fit continues
from the last checkpoint. It ends by printing a JSON summary.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer as gl


class Regression(gl.torch.Module):
    def __init__(self, features: int = 8, hidden: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # type: ignore[no-any-return]

    def loss(self, batch: list[torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.loss(batch), prog_bar=True)

    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("test_loss", self.loss(batch))

    def predict_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.forward(batch[0])

    def configure_optimizers(self) -> gl.torch.Optimizers:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)


def dataset(samples: int, seed: int, features: int = 8) -> TensorDataset:
    """y = x . w + noise, the same for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=generator)
    w = torch.linspace(-1, 1, features).unsqueeze(1)
    return TensorDataset(x, x @ w + 0.1 * torch.randn(samples, 1, generator=generator))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--accelerator", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--remote", action="store_true")
    parser.add_argument("--precision", default="32", choices=["32", "bf16", "16-mixed"])
    parser.add_argument("--max-epochs", type=int, default=20)
    parser.add_argument("--patience", type=int, default=5, help="epochs without a better val_loss")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--root", default=None, help="the run folder (default: ./gpulayer_runs/...)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    train = DataLoader(dataset(args.samples, args.seed), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(dataset(args.samples // 4, args.seed + 1), batch_size=args.batch_size)
    test = DataLoader(dataset(args.samples // 4, args.seed + 2), batch_size=args.batch_size)
    trainer = gl.torch.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.nodes,
        remote=args.remote,
        precision=args.precision,
        max_epochs=args.max_epochs,
        default_root_dir=args.root,
        callbacks=[
            gl.torch.ModelCheckpoint(monitor="val_loss", save_top_k=2),
            gl.torch.EarlyStopping("val_loss", patience=args.patience),
            gl.torch.LearningRateMonitor(),
        ],
    )
    model = Regression()
    trainer.fit(model, train, val)
    summary = {
        "resumed_from": str(trainer.resumed_from) if trainer.resumed_from else None,
        "epochs": trainer.current_epoch,
        "steps": trainer.global_step,
        "best": trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else None,
        **trainer.test(model, test, ckpt_path="best")[0],
        "predictions": len(torch.cat(trainer.predict(model, test))),
    }
    if trainer.is_global_zero:  # under a launcher every rank runs this script; one summary is enough
        print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
