import lightning.pytorch as pl
import torch
from _suite import Mode, norm, regression, report
from torch import nn

# seed_everything, rank_zero_only, self.log with on_step and on_epoch, sync_dist, reduce_fx="max"
# and logger=False, and EarlyStopping on a metric logged on step and epoch.


class Logged(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=True)
        # The same on every rank: its maximum over ranks and steps is the largest norm of the epoch.
        self.log(
            "weight_norm",
            torch.cat([p.detach().flatten() for p in self.parameters()]).norm(),
            on_step=True,
            on_epoch=True,
            sync_dist=True,
            reduce_fx="max",
            logger=False,
        )
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log(
            "val_loss", nn.functional.mse_loss(self.net(x), y), on_step=True, on_epoch=True, sync_dist=True
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


@pl.utilities.rank_zero_only
def summary(trainer, stop) -> dict:
    return {
        "stopped_epoch": stop.stopped_epoch,
        "epochs": trainer.current_epoch,
        "metrics": {name: float(value) for name, value in sorted(trainer.callback_metrics.items())},
    }


if __name__ == "__main__":
    mode = Mode()
    seed = pl.seed_everything(6)
    first_draw = float(torch.rand(()))
    model = Logged()
    stop = pl.callbacks.EarlyStopping(monitor="val_loss", min_delta=0.05, patience=1)
    trainer = pl.Trainer(
        **mode.trainer("logging", max_epochs=40, callbacks=[stop], enable_progress_bar=False)
    )
    trainer.fit(model, mode.loader(*regression(32)), mode.loader(*regression(16, seed=1)))
    found = summary(trainer, stop)
    if found is not None:
        report(seed=seed, first_draw=first_draw, norm=norm(model), **found)
