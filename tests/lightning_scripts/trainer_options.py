import lightning.pytorch as pl
import torch
from _suite import Mode, columns, files, norm, regression, report
from torch import nn

# The Trainer's options that bound a run: limit_train_batches and limit_val_batches,
# fast_dev_run, num_sanity_val_steps, logger=CSVLogger(...) and logger=False,
# enable_model_summary. The module counts the steps it runs.


class Counted(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.steps = {"train": 0, "val": 0, "test": 0}

    def training_step(self, batch, batch_idx):
        self.steps["train"] += 1
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)  # Lightning's default in a training step: each step's value
        return loss

    def validation_step(self, batch, batch_idx):
        self.steps["val"] += 1
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def test_step(self, batch, batch_idx):
        self.steps["test"] += 1
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def run(mode: Mode, name: str, **options):
    """Fit (and test) a new model with ``options``; the steps it ran and its trainer."""
    pl.seed_everything(4)
    model = Counted()
    train, val = mode.loader(*regression(48)), mode.loader(*regression(24, seed=1))
    trainer = pl.Trainer(**mode.trainer(name, enable_progress_bar=False, **options))
    trainer.fit(model, train, val)
    trainer.test(model, val)
    return model, trainer


if __name__ == "__main__":
    mode = Mode()
    logs = mode.root / "logs"
    limited, limited_run = run(
        mode,
        "limited",
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        logger=pl.loggers.CSVLogger(save_dir=str(logs), name="csv"),
        enable_model_summary=False,
    )
    quick, quick_run = run(mode, "quick", fast_dev_run=True)
    sane, sane_run = run(
        mode, "sane", max_epochs=1, limit_train_batches=1, num_sanity_val_steps=2, logger=False
    )
    table = logs / "csv" / "version_0" / "metrics.csv"
    report(
        limited_steps=limited.steps,
        limited_global_step=limited_run.global_step,
        limited_norm=norm(limited),
        csv_files=[name for name in files(logs) if not name.endswith(".ckpt")],  # checkpoints aside
        csv_columns=columns(table),
        fast_dev_run_steps=quick.steps,
        fast_dev_run_global_step=quick_run.global_step,
        sanity_steps=sane.steps,
        logger_false=sane_run.logger is None,
    )
