"""gl.torch.launch and its Runtime on the CPU with tiny models: in this process, as two gloo ranks it
starts, as ranks a launcher started, and as a gang job on two workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch.utils.data import DataLoader, TensorDataset

import gpulayer as gl
from gpulayer.functions import RemoteKeywords
from tests.conftest import Workers

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "launch_ddp" / "train.py"
#: How long a test waits for a subprocess before failing.
WAIT = 120.0


def regression_data(samples: int = 32) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 4, generator=generator)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))


def weights(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([parameter.detach().flatten() for parameter in module.parameters()])


def fit(runtime: gl.torch.Runtime, batch_size: int) -> dict[str, Any]:
    """Two epochs of SGD on the regression, every rank's data its share; rank 0's weights and those
    every rank got from the others, and the ranks' reductions."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model, optimizer = runtime.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
    loader = runtime.setup_dataloaders(DataLoader(regression_data(), batch_size=batch_size))
    for _ in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            runtime.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
    mine = weights(model)
    return {
        "weights": mine,
        "every_rank": [runtime.broadcast(mine, src=rank) for rank in range(runtime.world_size)],
        "sum": runtime.all_reduce(torch.tensor([runtime.rank + 1.0]), op="sum"),
        "mean": runtime.all_reduce({"rank": torch.tensor(float(runtime.rank))}),
        "batches": len(loader),
        "pid": os.getpid(),
    }


def plain_fit(batch_size: int) -> torch.Tensor:
    """The same two epochs in a hand-written loop, in this process."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(2):
        for x, y in DataLoader(regression_data(), batch_size=batch_size):
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    return weights(model)


# -- in this process


def test_one_device_runs_the_function_in_this_process_as_a_plain_loop_would() -> None:
    outcome = gl.torch.launch(fit, 8, accelerator="cpu")
    assert outcome["pid"] == os.getpid()
    assert torch.equal(outcome["weights"], plain_fit(8))
    assert (outcome["sum"].item(), outcome["mean"], outcome["batches"]) == (1.0, {"rank": 0.0}, 4)


def test_ranks_a_launcher_started_run_the_function_as_themselves(monkeypatch: pytest.MonkeyPatch) -> None:
    environment = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert gl.torch.launch(fit, 8, devices=2, accelerator="cpu")["pid"] == os.getpid()


def test_a_checkpoint_restores_modules_and_optimizers_and_gives_back_the_rest(tmp_path: Path) -> None:
    runtime = gl.torch.Runtime(accelerator="cpu")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model, optimizer = runtime.setup(model, torch.optim.Adam(model.parameters(), lr=0.1))
    x, y = regression_data()[:]
    runtime.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
    runtime.save(tmp_path / "run.ckpt", {"model": model, "optimizer": optimizer, "epoch": 3, "note": "kept"})

    fresh = torch.nn.Linear(4, 1)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.5)
    state: dict[str, Any] = {"model": fresh, "optimizer": fresh_optimizer, "epoch": 0}
    rest = runtime.load(tmp_path / "run.ckpt", state)

    assert torch.equal(weights(fresh), weights(model))
    assert fresh_optimizer.param_groups[0]["lr"] == 0.1
    saved_average = optimizer.state[model.weight]["exp_avg"]
    assert torch.equal(fresh_optimizer.state_dict()["state"][0]["exp_avg"], saved_average)
    assert (state["epoch"], rest) == (3, {"note": "kept"})
    assert sorted(runtime.load(tmp_path / "run.ckpt")) == ["epoch", "model", "note", "optimizer"]
    assert [path.name for path in tmp_path.iterdir()] == ["run.ckpt"]  # no temporary file left
    with pytest.raises(KeyError, match="holds no scheduler"):
        runtime.load(tmp_path / "run.ckpt", {"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)})


@pytest.mark.parametrize(("precision", "scaled"), [("16-mixed", True), ("bf16-mixed", False)])
def test_mixed_precision_runs_the_forward_in_autocast_and_steps_through_a_scaler_for_float16(
    precision: str, scaled: bool
) -> None:
    runtime = gl.torch.Runtime(accelerator="cpu", precision=precision)  # type: ignore[arg-type]
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(4, 1))
    seen: list[torch.dtype] = []
    inner[0].register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    model, optimizer = runtime.setup(inner, torch.optim.SGD(inner.parameters(), lr=0.01))
    before = weights(model)
    x, y = regression_data()[:]
    for _ in range(8):
        optimizer.zero_grad()
        output = model(x)
        runtime.backward(torch.nn.functional.mse_loss(output, y))
        runtime.clip_gradients(model, optimizer, max_norm=10.0)
        optimizer.step()

    low = torch.float16 if scaled else torch.bfloat16
    assert (seen, output.dtype, inner[0].weight.dtype) == ([low] * 8, torch.float32, torch.float32)
    assert torch.isfinite(weights(model)).all()
    assert not torch.equal(weights(model), before)
    scaler = runtime._precision.scaler
    # float16's scaler starts at 2**16 and halves at each step it skipped, the scaled gradients
    # having overflowed (they do here, at first): the optimizer's steps went through it.
    assert (scaler.get_scale() < 2**16) if scaler is not None else not scaled
    with runtime.autocast():
        assert (x @ x.T).dtype == low


# -- ranks started here


def test_two_ranks_agree_and_take_the_step_one_process_takes_on_both_their_batches() -> None:
    """Each rank's batch of 4 is half of the one process's batch of 8: DDP's averaged gradients
    make the same step. Rank 0's value comes back."""
    outcome = gl.torch.launch(fit, 4, devices=2, accelerator="cpu")
    first, second = outcome["every_rank"]
    assert torch.equal(first, second)
    assert torch.allclose(outcome["weights"], plain_fit(8), atol=1e-6)
    assert (outcome["sum"].item(), outcome["mean"]["rank"].item(), outcome["batches"]) == (3.0, 0.5, 4)
    assert outcome["pid"] != os.getpid()


class GaveUp(Exception):
    pass


def give_up_on_rank_one(runtime: gl.torch.Runtime) -> None:
    if runtime.rank == 1:
        raise GaveUp(f"rank {runtime.rank} gave up")
    runtime.barrier()  # rank 0 would wait here for ever


def test_an_exception_on_one_rank_ends_every_rank_and_is_raised_here() -> None:
    with pytest.raises(GaveUp, match=r"^rank 1 gave up") as raised:
        gl.torch.launch(give_up_on_rank_one, devices=2, accelerator="cpu")
    # Caused by torch's report, which holds the rank's traceback.
    assert "in give_up_on_rank_one" in str(raised.value.__cause__)


def test_launch_refuses_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="devices must be at least 1, not 0"):
        gl.torch.launch(fit, 8, devices=0)
    with pytest.raises(ValueError, match="precision must be one of"):
        gl.torch.launch(fit, 8, precision="8-mixed")  # type: ignore[arg-type]


# -- a gang job


def test_num_nodes_runs_the_function_as_a_gang_job_on_two_workers(
    client: gl.Client, workers: Workers, capsys: pytest.CaptureFixture[str]
) -> None:
    workers.start("node-a", 1)
    workers.start("node-b", 1)
    options: RemoteKeywords = {"client": client, "source": ROOT}
    outcome = gl.torch.launch(fit, 4, num_nodes=2, accelerator="cpu", job_options=options)

    assert torch.allclose(outcome["weights"], plain_fit(8), atol=1e-6)
    assert outcome["sum"].item() == 3.0
    (job,) = client.jobs()
    assert job.state is gl.JobState.SUCCEEDED
    assert sorted(part.worker for part in job.parts) == ["node-a", "node-b"]
    assert (
        f"gpulayer: fit's 2 x 1 ranks run as job {job.id} (`gpulayer logs -f {job.id}` follows them)"
        in capsys.readouterr().err.splitlines()
    )


def test_an_exception_on_one_rank_of_a_gang_job_ends_it_and_is_raised_here(
    client: gl.Client, workers: Workers
) -> None:
    workers.start("node-a", 1)
    workers.start("node-b", 1)
    options: RemoteKeywords = {"client": client, "source": ROOT}
    with pytest.raises(GaveUp, match=r"^rank 1 gave up") as raised:
        gl.torch.launch(give_up_on_rank_one, num_nodes=2, accelerator="cpu", job_options=options)
    assert "in give_up_on_rank_one" in "".join(getattr(raised.value, "__notes__", []))
    (job,) = client.jobs()
    assert job.state is gl.JobState.FAILED


# -- the example, as a program


def test_the_example_trains_as_two_ranks_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    def run(epochs: int) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(EXAMPLE), "--accelerator", "cpu", "--devices", "2"]
        command += ["--epochs", str(epochs), "--samples", "128", "--checkpoint", str(tmp_path / "ckpt")]
        return subprocess.run(command, capture_output=True, text=True, check=True, timeout=WAIT)

    first = run(2)
    assert json.loads(first.stdout.splitlines()[-1])["epochs"] == 2
    again = run(3)
    lines = again.stdout.splitlines()
    assert lines[0] == f"resumed from {tmp_path / 'ckpt'} after epoch 2"
    assert lines[1].startswith("epoch 2: val_loss ")
    summary = json.loads(lines[-1])
    assert (summary["world_size"], summary["epochs"]) == (2, 3)
