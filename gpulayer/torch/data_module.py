"""``gl.torch.DataModule``: a dataset's preparation, splits and loaders in one object, as
Lightning's ``LightningDataModule`` is."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader


class DataHooks:
    """The loaders a Trainer call takes when it is given none: a datamodule's, else its model's
    (None: it has none of that kind). Lightning's ``DataHooks``, which both share."""

    def train_dataloader(self) -> DataLoader[Any] | None:
        return None

    def val_dataloader(self) -> DataLoader[Any] | None:
        return None

    def test_dataloader(self) -> DataLoader[Any] | None:
        return None

    def predict_dataloader(self) -> DataLoader[Any] | None:
        return None


class DataModule(DataHooks):
    """Subclass it: ``prepare_data`` (download, write to disk: once per machine, on its first rank,
    before the others go on), ``setup(stage)`` (split, build datasets: on every rank), and the
    ``*_dataloader`` methods. Give it to a Trainer call as ``datamodule=``; the call's own loaders,
    if given, come first, and the module's ``*_dataloader`` methods last. During the call and after
    it, ``trainer.datamodule`` is it."""

    def prepare_data(self) -> None:
        """Once per machine, on its first rank, before ``setup`` runs anywhere on it."""

    def setup(self, stage: str) -> None:
        """On every rank, before the call's loaders are asked for: ``"fit"``, ``"validate"``,
        ``"test"`` or ``"predict"``."""

    def teardown(self, stage: str) -> None:
        """On every rank, after the call ended, even by an exception."""


def find_loader(
    given: DataLoader[Any] | None, datamodule: DataModule | None, module: DataHooks, method: str
) -> DataLoader[Any] | None:
    """The loader a call was given; else its datamodule's ``method()``; else its model's."""
    if given is not None:
        return given
    for source in (datamodule, module):
        found: DataLoader[Any] | None = getattr(source, method)() if source is not None else None
        if found is not None:
            return found
    return None


def needed_loader(
    given: DataLoader[Any] | None, datamodule: DataModule | None, module: DataHooks, stage: str
) -> DataLoader[Any]:
    method = {"validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader"}[stage]
    found = find_loader(given, datamodule, module, method)
    if found is None:
        raise ValueError(f"{stage} needs dataloaders, a datamodule or a model whose {method}() returns one")
    return found
