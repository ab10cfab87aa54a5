"""The README's two quickstart commands, as a new user runs them in a fresh clone."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> tuple[str, str]:
    """The quickstart's two bash blocks: run a job end to end, and run the tests."""
    quickstart = (ROOT / "README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", quickstart, re.DOTALL)
    assert len(blocks) == 2, "the quickstart has exactly two commands"
    run, test = (block.strip() for block in blocks)
    assert "\n" not in run, "each is one command"
    assert "\n" not in test, "each is one command"
    return run, test


def test_ci_runs_the_readmes_test_command() -> None:
    _, test = readme_commands()
    assert test in (ROOT / ".ci" / "run").read_text().splitlines()
    # PyTorch (a CPU build) alone first, so the torch extra does not pull the multi-GB CUDA build.
    steps = test.split(" && ")
    assert steps.index(".venv/bin/pip install torch==2.13.0") < steps.index(
        ".venv/bin/pip install -e '.[dev,torch]'"
    )


@pytest.mark.slow
def test_the_readmes_run_command_works_in_a_fresh_clone(tmp_path: Path) -> None:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    run, _ = readme_commands()
    env = {
        key: value for key, value in os.environ.items() if not key.startswith(("GPULAYER_", "VIRTUAL_ENV"))
    }
    env["GPULAYER_HOME"] = str(tmp_path / "home")
    try:
        result = subprocess.run(
            ["bash", "-c", run], cwd=clone, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "GPUlayer is up." in result.stdout
        assert re.search(r"^hello, world: job \w+ ran on ", result.stdout, re.MULTILINE), result.stdout
        assert "wrote greeting.txt" in result.stdout
        # --wait brought the output back, and the hint names the command as this shell runs it.
        assert (clone / "greeting.txt").is_file()
        assert "Try:  .venv/bin/gpulayer submit --wait -- echo hello" in result.stdout.splitlines()
        assert re.search(r"^job \w+ succeeded$", result.stderr, re.MULTILINE), result.stderr
    finally:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [str(clone / ".venv" / "bin" / "gpulayer"), "down", "--timeout", "5"],
                env=env,
                timeout=60,
                check=False,
            )
