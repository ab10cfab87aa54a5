"""The Lightning compatibility suite: scripts written for Lightning 2.x (tests/lightning_scripts/),
each run with its first line, ``import lightning.pytorch as pl``, swapped for ``import
gpulayer.torch as pl`` and nothing else. Each prints one ``RESULT {json}`` line; the suite compares
it with the same script's under Lightning (in one process), and under ``gpulayer.torch`` as 2 DDP
ranks on the CPU and as a 2-node gang job with what one process gives (a run over the same data)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import gpulayer as gl
from tests.conftest import Workers
from tests.test_trainer import ROOT, WAIT

SCRIPTS = ROOT / "tests" / "lightning_scripts"
LIGHTNING_LINE = "import lightning.pytorch as pl"
IMPORTS = {"lightning": LIGHTNING_LINE, "gpulayer": "import gpulayer.torch as pl"}
NAMES = sorted(path.stem for path in SCRIPTS.glob("*.py") if not path.name.startswith("_"))
#: How close a number must be to Lightning's: the same steps on the same data, in another loop.
SAME = 1e-5
#: How close as ranks (gloo's sums, bf16 rounding of other partial sums).
RANKED = 1e-3
#: What a run over ranks does not bring back, by script: what the module records in attributes of
#: its own during a step stays in the ranks (the Trainer takes back the weights, as Lightning's
#: ddp_spawn does). The hooks script records nothing else: it runs in one process only.
RANK_LOCAL = {
    "hparams_checkpoint": {"devices_seen"},
    "trainer_options": {"limited_steps", "fast_dev_run_steps", "sanity_steps"},
    "optimizers_precision": {"dtypes"},
}
RANKED_NAMES = [name for name in NAMES if name != "hooks"]
#: The scripts also run as a gang job (each Trainer call is one: a few keep the suite short).
GANG = ["logging_seed", "manual_gan"]

Result = dict[str, Any]


def swapped(name: str, framework: str, folder: Path) -> Path:
    """The script ``name`` in ``folder`` (beside what its scripts share), importing ``framework``."""
    lines = (SCRIPTS / f"{name}.py").read_text().splitlines(keepends=True)
    assert lines[0].rstrip("\n") == LIGHTNING_LINE, f"{name}.py must start with {LIGHTNING_LINE!r}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "_suite.py").write_text((SCRIPTS / "_suite.py").read_text())
    script = folder / f"{name}.py"
    script.write_text(IMPORTS[framework] + "\n" + "".join(lines[1:]))
    return script


def run(script: Path, root: Path, *mode: str, env: dict[str, str] | None = None) -> Result:
    """Run ``script`` in a process of its own with ``--root root`` and ``mode``; its RESULT."""
    done = subprocess.run(
        [sys.executable, str(script), "--accelerator", "cpu", "--root", str(root), *mode],
        env={**(env or os.environ), "OMP_NUM_THREADS": "1"},
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, f"{script.name} {' '.join(mode)} failed:\n{done.stderr[-3000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"{script.name} printed no RESULT line:\n{done.stdout[-2000:]}"
    found: Result = json.loads(lines[-1].removeprefix("RESULT "))
    return found


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Result]:
    """A script's RESULT in one process under a framework, run once for every test that needs it."""
    found: dict[tuple[str, str], Result] = {}

    def result(name: str, framework: str) -> Result:
        if (name, framework) not in found:
            folder = tmp_path_factory.mktemp(f"{name}-{framework}")
            found[name, framework] = run(swapped(name, framework, folder / "script"), folder / "runs")
        return found[name, framework]

    return result


#: How far apart two runs' bfloat16 results may be (ranks add their gradients in another order).
BF16_TOLERANCE = 2e-2


def assert_alike(found: Any, expected: Any, rel: float, where: str = "RESULT") -> None:
    """The same keys and lists; numbers within ``rel`` when either is a float, else equal."""
    if isinstance(expected, dict):
        assert isinstance(found, dict), f"{where}: {found!r}, not a dict"
        assert sorted(found) == sorted(expected), f"{where}: keys {sorted(found)} != {sorted(expected)}"
        for key in expected:
            assert_alike(found[key], expected[key], rel, f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(found, list), f"{where}: {found!r}, not a list"
        for index, (one, other) in enumerate(zip(found, expected, strict=False)):  # the first difference
            assert_alike(one, other, rel, f"{where}[{index}]")
        assert len(found) == len(expected), f"{where}: {len(found)} items, not {len(expected)}"
    elif isinstance(expected, float) or isinstance(found, float):
        assert isinstance(found, (int, float)), f"{where}: {found!r}, not a number"
        if "bf16" in where:  # bfloat16 keeps 3 significant digits: a sum's order shows in the third
            rel = max(rel, BF16_TOLERANCE)
        assert math.isclose(found, expected, rel_tol=rel, abs_tol=rel * 1e-2), (
            f"{where}: {found!r} != {expected!r} (within {rel})"
        )
    else:
        assert found == expected, f"{where}: {found!r} != {expected!r}"


def without(result: Result, name: str) -> Result:
    return {key: value for key, value in result.items() if key not in RANK_LOCAL.get(name, set())}


def test_each_script_starts_with_the_one_line_the_swap_replaces() -> None:
    assert len(NAMES) >= 7
    for name in NAMES:
        assert (SCRIPTS / f"{name}.py").read_text().splitlines()[0] == LIGHTNING_LINE


@pytest.mark.parametrize("name", NAMES)
def test_a_lightning_script_gives_lightnings_results_with_the_import_swapped(
    name: str, in_process: Callable[[str, str], Result]
) -> None:
    if importlib.util.find_spec("lightning") is None:
        pytest.skip("Lightning is not installed")
    assert_alike(in_process(name, "gpulayer"), in_process(name, "lightning"), SAME)


@pytest.mark.parametrize("name", RANKED_NAMES)
def test_a_lightning_script_as_two_ranks_gives_what_one_process_gives(
    name: str, in_process: Callable[[str, str], Result], tmp_path: Path
) -> None:
    ranked = run(swapped(name, "gpulayer", tmp_path / "script"), tmp_path / "runs", "--devices", "2")
    assert_alike(without(ranked, name), without(in_process(name, "gpulayer"), name), RANKED)


@pytest.mark.parametrize("name", GANG)
def test_a_lightning_script_as_a_two_node_gang_job_gives_what_one_process_gives(
    name: str,
    in_process: Callable[[str, str], Result],
    client: gl.Client,
    workers: Workers,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Two workers, one rank each; the script's default client finds the installation through
    GPULAYER_HOME, and its folder is the code the job ships."""
    workers.start("node-a", 1)
    workers.start("node-b", 1)
    script = swapped(name, "gpulayer", tmp_path / "script")
    ganged = run(script, tmp_path / "runs", "--num-nodes", "2", env=env)
    assert_alike(without(ganged, name), without(in_process(name, "gpulayer"), name), RANKED)
    jobs = client.jobs()
    assert jobs
    assert {job.state for job in jobs} == {gl.JobState.SUCCEEDED}
    assert all(sorted(part.worker for part in job.parts) == ["node-a", "node-b"] for job in jobs)
