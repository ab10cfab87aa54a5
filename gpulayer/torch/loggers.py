"""Where a Trainer's metric rows go (rank 0 only): the run folder's ``metrics.json`` and
``metrics.csv`` by default, Lightning's CSV and TensorBoard layouts, or a :class:`Logger` of your own.

Each row a run records (see ``metrics.MetricsLog``) reaches every logger once, as
``log_metrics(values, step)`` with ``"epoch"`` among the values (as Lightning gives it), when the
Trainer writes its rows: at each epoch's end, after each validation, and at the end of
``validate`` and ``test``; ``save`` follows each such batch of rows.
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import io
import json
import re
from pathlib import Path
from typing import Any

from .checkpoint import write_atomic

Row = dict[str, float | int]


class Logger:
    """Subclass it and override what you need; ``log_metrics`` at least."""

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> int | str | None:
        return None

    @property
    def save_dir(self) -> str | None:
        return None

    @property
    def log_dir(self) -> str | None:
        return None

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """One row: its values (``"epoch"`` among them) at optimizer step ``step``."""

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        """The module's ``hparams``, when a fit starts."""

    def save(self) -> None:
        """After each batch of rows."""

    def finalize(self, status: str) -> None:
        """At the end of a Trainer call: ``"success"`` or ``"failed"``."""
        self.save()

    def reload(self) -> None:
        """After a call ran in ranks started elsewhere (each with its own copy of this logger): take
        back what rank 0's copy wrote, so that the next call goes on from it."""


class MetricsFiles(Logger):
    """The default: ``metrics.json`` (a list of the rows) and ``metrics.csv`` (one column per name) in
    the run folder, each rewritten whole, atomically, at every save, so that a run killed at any
    moment leaves files that parse. A resumed fit's files go on from its checkpoint's rows."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.rows: list[Row] = []

    @property
    def save_dir(self) -> str:
        return str(self.folder)

    @property
    def log_dir(self) -> str:
        return str(self.folder)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append({"epoch": metrics.get("epoch", 0), "step": step, **metrics})

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        # Not synced to disk: a killed process loses nothing, and after a power cut the next
        # checkpoint (which is synced) holds these rows.
        json_text = json.dumps(self.rows, indent=1) + "\n"
        write_atomic(self.folder / "metrics.json", json_text.encode(), durable=False)
        write_atomic(self.folder / "metrics.csv", _csv(self.rows, ["epoch", "step"]), durable=False)


class _Versioned(Logger):
    """Lightning's layout: ``save_dir/name/version_N``, ``N`` the next free one unless ``version``
    is given (an int, or a folder name as a string)."""

    def __init__(
        self, save_dir: str | Path, name: str = "lightning_logs", version: int | str | None = None
    ) -> None:
        self._save_dir = Path(save_dir)
        self._name = name
        self._version = version

    @property
    def name(self) -> str:
        return self._name

    @property
    def save_dir(self) -> str:
        return str(self._save_dir)

    @property
    def version(self) -> int | str:
        if self._version is None:  # decided on first use, by rank 0 (or where it is asked first)
            self._version = _next_version(self._save_dir / self._name)
        return self._version

    @property
    def log_dir(self) -> str:
        version = self.version
        folder = version if isinstance(version, str) else f"version_{version}"
        return str(self._save_dir / self._name / folder)

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        if params:
            folder = Path(self.log_dir)
            folder.mkdir(parents=True, exist_ok=True)
            write_atomic(folder / "hparams.yaml", _yaml(params).encode(), durable=False)


class CSVLogger(_Versioned):
    """Lightning's ``CSVLogger``: ``log_dir/metrics.csv`` (one row per logged row, one column per
    name, ``epoch`` among them, ``step`` last) and ``log_dir/hparams.yaml``."""

    def __init__(
        self, save_dir: str | Path, name: str = "lightning_logs", version: int | str | None = None
    ) -> None:
        super().__init__(save_dir, name, version)
        self.rows: list[Row] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append({**metrics, "step": step})

    def reload(self) -> None:
        try:
            with open(Path(self.log_dir) / "metrics.csv", newline="") as file:
                self.rows = [
                    {name: _number(text) for name, text in row.items() if text}
                    for row in csv.DictReader(file)
                ]
        except FileNotFoundError:  # rank 0 wrote on another machine (a gang job), or wrote nothing
            pass

    def save(self) -> None:
        if not self.rows:
            return
        folder = Path(self.log_dir)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "metrics.csv", _csv(self.rows, []), durable=False)


class TensorBoardLogger(_Versioned):
    """Lightning's ``TensorBoardLogger``: event files in ``log_dir`` (a scalar per metric at its
    step) and ``log_dir/hparams.yaml``. Needs ``tensorboard`` (or ``tensorboardX``) installed;
    ``experiment`` is its ``SummaryWriter``."""

    def __init__(
        self, save_dir: str | Path, name: str = "lightning_logs", version: int | str | None = None
    ) -> None:
        self._writer_class = _summary_writer()
        super().__init__(save_dir, name, version)
        self._writer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # A writer holds a file and a thread: each process that logs opens its own.
        return {**self.__dict__, "_writer": None}

    @property
    def experiment(self) -> Any:
        if self._writer is None:
            self._writer = self._writer_class(log_dir=self.log_dir)
        return self._writer

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.experiment.add_scalar(name, value, step)

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        super().log_hyperparams(params)
        if params:
            self.experiment.add_text("hparams", _yaml(params))

    def save(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def finalize(self, status: str) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _summary_writer() -> Any:
    if importlib.util.find_spec("tensorboard") is not None:
        return importlib.import_module("torch.utils.tensorboard").SummaryWriter
    if importlib.util.find_spec("tensorboardX") is not None:
        return importlib.import_module("tensorboardX").SummaryWriter
    raise ImportError("TensorBoardLogger needs TensorBoard: pip install tensorboard")


def _next_version(folder: Path) -> int:
    found = [
        int(match[1])
        for path in folder.glob("version_*")
        if (match := re.fullmatch(r"version_(\d+)", path.name))
    ]
    return max(found) + 1 if found else 0


def _csv(rows: list[Row], first: list[str]) -> bytes:
    """``rows`` as CSV: the ``first`` columns, then every other name in the order it first appears."""
    columns = dict.fromkeys(first)
    for row in rows:
        columns.update(dict.fromkeys(row))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue().encode()


def _yaml(params: dict[str, Any]) -> str:
    """``params`` as YAML, a ``name: value`` line each: JSON's values are YAML's (a value JSON has no
    form for is written as its text)."""
    return "".join(f"{name}: {json.dumps(value, default=str)}\n" for name, value in params.items())


def _number(text: str) -> float | int:
    """A CSV cell as the number it was written from."""
    try:
        return int(text)
    except ValueError:
        return float(text)


def __getattr__(name: str) -> object:
    # Lightning's other loggers (WandbLogger, MLFlowLogger, ...): one line that says what to use.
    if name.endswith("Logger"):
        raise AttributeError(
            f"gpulayer.torch.loggers.{name}: only CSVLogger and TensorBoardLogger are built in; "
            "subclass gl.torch.Logger, or read trainer.callback_metrics from a Callback"
        )
    raise AttributeError(f"module 'gpulayer.torch.loggers' has no attribute {name!r}")
