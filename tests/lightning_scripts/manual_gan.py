import lightning.pytorch as pl
import torch
from _suite import Mode, norm, report
from torch import nn

# Manual optimization, GAN-style: automatic_optimization = False, two optimizers from
# self.optimizers(), self.manual_backward. The noise is part of the data (no random draw in a
# step), so that every framework and rank count steps alike.


class Gan(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        real, noise = batch
        generator_optimizer, discriminator_optimizer = self.optimizers()
        bce = nn.functional.binary_cross_entropy_with_logits
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)

        fake = self.generator(noise)
        d_loss = bce(self.discriminator(real), ones) + bce(self.discriminator(fake.detach()), zeros)
        discriminator_optimizer.zero_grad()
        self.manual_backward(d_loss)
        discriminator_optimizer.step()

        g_loss = bce(self.discriminator(fake), ones)
        generator_optimizer.zero_grad()
        self.manual_backward(g_loss)
        generator_optimizer.step()
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss}, on_step=False, on_epoch=True)

    def configure_optimizers(self):
        return [
            torch.optim.Adam(self.generator.parameters(), lr=0.01),
            torch.optim.Adam(self.discriminator.parameters(), lr=0.01),
        ]


if __name__ == "__main__":
    mode = Mode()
    pl.seed_everything(3)
    generator = torch.Generator().manual_seed(3)
    real = torch.randn(32, 2, generator=generator) * 0.5 + torch.tensor([2.0, -1.0])
    noise = torch.randn(32, 2, generator=generator)
    gan = Gan()
    trainer = pl.Trainer(**mode.trainer("gan", max_epochs=4))
    trainer.fit(gan, mode.loader(real, noise))
    report(
        d_loss=float(trainer.callback_metrics["d_loss"]),
        g_loss=float(trainer.callback_metrics["g_loss"]),
        generator_norm=norm(gan.generator),
        discriminator_norm=norm(gan.discriminator),
        steps=trainer.global_step,
        epochs=trainer.current_epoch,
    )
