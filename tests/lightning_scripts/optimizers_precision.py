import lightning.pytorch as pl
import torch
from _suite import Mode, column, norm, regression, report
from torch import nn

# configure_optimizers returning ([optimizer], [scheduler]), a LearningRateMonitor logging every
# step into a CSVLogger, and the same fit in "32-true", "bf16-mixed" and "64-true".


class Scheduled(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.dtypes: set[str] = set()

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        self.dtypes.add(f"{x.dtype} {out.dtype}")
        loss = nn.functional.mse_loss(out.float(), y.float())
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x).float(), y.float()))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)]


def fit(mode: Mode, precision: str) -> tuple[Scheduled, dict]:
    pl.seed_everything(5)
    model = Scheduled()
    name = f"precision-{precision}"
    logger = pl.loggers.CSVLogger(save_dir=str(mode.root / name), name="lr")
    monitor = pl.callbacks.LearningRateMonitor(logging_interval="step")
    trainer = pl.Trainer(
        **mode.trainer(
            name,
            max_epochs=3,
            precision=precision,
            logger=logger,
            callbacks=[monitor],
            log_every_n_steps=1,
            enable_progress_bar=False,
        ),
    )
    trainer.fit(model, mode.loader(*regression(24)))
    [tested] = trainer.test(model, mode.loader(*regression(16, seed=1)))
    rates = column(mode.root / name / "lr" / "version_0" / "metrics.csv", "lr-SGD")
    return model, {"test_loss": tested["test_loss"], "norm": norm(model), "rates": rates}


if __name__ == "__main__":
    mode = Mode()
    found: dict[str, dict] = {"test_loss": {}, "norm": {}, "rates": {}, "dtypes": {}, "parameters": {}}
    for precision in ("32-true", "bf16-mixed", "64-true"):
        model, numbers = fit(mode, precision)
        numbers["dtypes"] = sorted(model.dtypes)
        numbers["parameters"] = sorted({str(p.dtype) for p in model.parameters()})
        for name, value in numbers.items():
            found[name][precision] = value
    report(**found)
