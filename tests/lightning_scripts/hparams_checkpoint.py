import lightning.pytorch as pl
import torch
from _suite import Mode, norm, regression, report
from torch import nn

# save_hyperparameters() and hparams, self.device, trainer.save_checkpoint after fit, and
# load_from_checkpoint of what it wrote.


class Regressor(pl.LightningModule):
    def __init__(self, hidden: int = 6, lr: float = 0.05, name: str = "regressor") -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(4, self.hparams.hidden), nn.ReLU(), nn.Linear(self.hparams.hidden, 1)
        )
        self.devices_seen: set[str] = set()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.devices_seen.add(f"{self.device.type} {x.device.type}")
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.5)


if __name__ == "__main__":
    mode = Mode()
    pl.seed_everything(2)
    model = Regressor(hidden=5, lr=0.03)
    train, test = mode.loader(*regression(32)), mode.loader(*regression(16, seed=1))
    trainer = pl.Trainer(**mode.trainer("hparams", max_epochs=3))
    trainer.fit(model, train)
    path = mode.root / "final.ckpt"
    trainer.save_checkpoint(path)
    loaded = Regressor.load_from_checkpoint(path)
    [tested] = pl.Trainer(**mode.trainer("hparams-test")).test(loaded, test)
    report(
        hparams=dict(model.hparams),
        loaded_hparams=dict(loaded.hparams),
        devices_seen=sorted(model.devices_seen),
        same_weights=all(
            torch.equal(a, b)
            for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True)
        ),
        loaded_device=str(loaded.device),
        test_loss=tested["test_loss"],
        norm=norm(model),
        steps=trainer.global_step,
    )
