import lightning.pytorch as pl
import torch
from _suite import Mode, files, norm, report
from torch import nn

# An autoencoder with its data in a LightningDataModule: EarlyStopping and a ModelCheckpoint on
# val_loss, then fit, validate, test of the best checkpoint, predict.


class Points(pl.LightningDataModule):
    """8-dimensional points near a 3-dimensional plane, "downloaded" once to a file."""

    def __init__(self, mode: Mode) -> None:
        super().__init__()
        self.mode = mode
        self.file = mode.root / "data" / "points.pt"

    def prepare_data(self) -> None:
        if not self.file.exists():
            generator = torch.Generator().manual_seed(3)
            plane = torch.randn(3, 8, generator=generator)
            points = torch.randn(48, 3, generator=generator) @ plane
            self.file.parent.mkdir(parents=True, exist_ok=True)
            torch.save(points + 0.05 * torch.randn(48, 8, generator=generator), self.file)

    def setup(self, stage: str) -> None:
        points = torch.load(self.file)
        self.splits = {
            "train": points[:32],
            "val": points[32:40],
            "test": points[40:],
            "predict": points[40:],
        }

    def train_dataloader(self):
        return self.mode.loader(self.splits["train"])

    def val_dataloader(self):
        return self.mode.loader(self.splits["val"])

    def test_dataloader(self):
        return self.mode.loader(self.splits["test"])

    def predict_dataloader(self):
        return self.mode.loader(self.splits["predict"])


class AutoEncoder(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 3))
        self.decoder = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 8))

    def forward(self, x):
        return self.encoder(x)

    def loss(self, batch):
        (x,) = batch
        return nn.functional.mse_loss(self.decoder(self.encoder(x)), x)

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch))

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self.loss(batch))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.02)


if __name__ == "__main__":
    mode = Mode()
    pl.seed_everything(1)
    model, data = AutoEncoder(), Points(mode)
    stop = pl.callbacks.EarlyStopping(monitor="val_loss", min_delta=0.02, patience=1)
    best = pl.callbacks.ModelCheckpoint(monitor="val_loss", save_top_k=1)
    trainer = pl.Trainer(**mode.trainer("autoencoder", max_epochs=30, callbacks=[stop, best]))
    trainer.fit(model, datamodule=data)
    [validated] = trainer.validate(model, datamodule=data)
    [tested] = trainer.test(model, datamodule=data, ckpt_path="best")
    codes = torch.cat(trainer.predict(model, datamodule=data))
    report(
        epochs=trainer.current_epoch,
        stopped_epoch=stop.stopped_epoch,
        best_checkpoint=best.best_model_path.rsplit("/", 1)[-1],
        best_score=float(best.best_model_score),
        val_loss=validated["val_loss"],
        test_loss=tested["test_loss"],
        predictions=list(codes.shape),
        predictions_norm=float(codes.norm()),
        norm=norm(model),
        data_files=files(mode.root / "data"),
    )
