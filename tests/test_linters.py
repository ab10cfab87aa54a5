"""What ruff and mypy do not check: the shell scripts (shellcheck), the Dockerfile (hadolint) and the
direction of imports between the package's layers (import-linter), each from PyPI (the dev extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_shell_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    checked = subprocess.run(
        [shellcheck, *(str(ROOT / script) for script in ("install.sh", ".ci/run", "compose/base-image.sh"))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    dockerfile = ROOT / "compose" / "Dockerfile"
    checked = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout


def test_imports_go_the_way_the_layers_do() -> None:
    # The contracts are pyproject.toml's [tool.importlinter]; no cache, so nothing is left behind.
    lint_imports = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    checked = subprocess.run(
        [lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
