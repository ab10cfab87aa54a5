import lightning.pytorch as pl
import torch
from _suite import Mode, regression, report
from torch import nn

# Which hooks run, and in which order, through fit, validate, test and predict: a callback and the
# module record each call of the hooks below into one list.

HOOKS = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_train_start", "on_train_end",
    "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start", "on_train_batch_end",
    "on_before_zero_grad", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
    "on_validation_start", "on_validation_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_validation_batch_start", "on_validation_batch_end", "on_test_start", "on_test_end",
    "on_test_epoch_start", "on_test_epoch_end", "on_test_batch_start", "on_test_batch_end",
    "on_predict_start", "on_predict_end", "on_predict_epoch_start", "on_predict_epoch_end",
    "on_predict_batch_start", "on_predict_batch_end",
)  # fmt: skip
CALLS: list[str] = []


def recording(who: str, name: str):
    def hook(self, *args, **kwargs):
        CALLS.append(f"{who}.{name}")

    return hook


class Recorder(pl.Callback):
    """Records every hook of HOOKS (set below)."""


class Model(pl.LightningModule):
    """Records every hook of HOOKS (set below) too."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


for name in HOOKS:
    setattr(Recorder, name, recording("callback", name))
    setattr(Model, name, recording("module", name))


if __name__ == "__main__":
    mode = Mode()
    pl.seed_everything(7)
    model = Model()
    train, val = mode.loader(*regression(16)), mode.loader(*regression(8, seed=1))
    trainer = pl.Trainer(
        **mode.trainer("hooks", max_epochs=2, callbacks=[Recorder()], enable_progress_bar=False)
    )
    calls = {}
    trainer.fit(model, train, val)
    calls["fit"], CALLS[:] = list(CALLS), []
    trainer.validate(model, val)
    calls["validate"], CALLS[:] = list(CALLS), []
    trainer.test(model, val)
    calls["test"], CALLS[:] = list(CALLS), []
    trainer.predict(model, val)
    calls["predict"] = list(CALLS)
    report(**calls)
