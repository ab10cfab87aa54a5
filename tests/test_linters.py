"""What ruff and mypy do not read: the shell scripts (shellcheck) and the Dockerfile (hadolint),
each with its binary from PyPI (the dev extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_shell_scripts_pass_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    checked = subprocess.run(
        [shellcheck, str(ROOT / "install.sh"), str(ROOT / ".ci" / "run")],
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
