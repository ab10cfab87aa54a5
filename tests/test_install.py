"""install.sh into a fresh HOME: a private environment, the command linked, idempotent, removable;
bad input is one line and a non-zero exit. (It installs this checkout: --from the repository.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "install.sh"


def run(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "HOME": str(home), "PYTHON": sys.executable, **env}
    for name in ("GPULAYER_INSTALL_DIR", "GPULAYER_BIN_DIR", "VIRTUAL_ENV"):
        environ.pop(name, None)
    return subprocess.run(
        ["sh", str(SCRIPT), *args], env=environ, capture_output=True, text=True, timeout=600, check=False
    )


def test_install_sh_installs_upgrades_and_removes_itself_in_a_fresh_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    first = run(home, "--from", str(ROOT))
    assert first.returncode == 0, first.stderr
    link = home / ".local" / "bin" / "gpulayer"
    venv = home / ".local" / "share" / "gpulayer" / "venv"
    assert link.is_symlink()
    assert link.resolve() == (venv / "bin" / "gpulayer").resolve()
    version = subprocess.run([str(link), "--version"], capture_output=True, text=True, check=True).stdout
    assert "gpulayer, version" in version
    assert "(made)" in first.stdout
    assert "next: gpulayer up" in first.stdout
    # Again: the same environment, upgraded in place.
    again = run(home, "--from", str(ROOT))
    assert again.returncode == 0, again.stderr
    assert "(kept)" in again.stdout
    gone = run(home, "--uninstall")
    assert gone.returncode == 0, gone.stderr
    assert not link.exists()
    assert not venv.exists()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--bogus"], {}, "install.sh: unknown option --bogus (see --help)"),
        (["--from"], {}, "install.sh: --from needs a wheel or a folder"),
        (["--from", "/nonexistent/gpulayer"], {}, "install.sh: /nonexistent/gpulayer does not exist"),
        (["--version", "1", "--from", "."], {}, "install.sh: give --version or --from, not both"),
        ([], {"PYTHON": "/nonexistent/python3"}, "install.sh: /nonexistent/python3 not found"),
    ],
)
def test_install_sh_refuses_bad_input_in_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    done = run(tmp_path, *args, **env)
    assert done.returncode == 1
    assert done.stderr.startswith(message), done.stderr
    assert done.stderr.count("\n") == 1
    assert not (tmp_path / ".local").exists()


def test_install_sh_refuses_a_python_older_than_3_10(tmp_path: Path) -> None:
    old = tmp_path / "python3"
    old.write_text('#!/bin/sh\ncase "$1" in -V) echo "Python 3.8.10" ;; *) exit 1 ;; esac\n')
    old.chmod(0o755)
    done = run(tmp_path, PYTHON=str(old))
    assert done.returncode == 1
    too_old = "Python 3.8.10 is too old: GPUlayer needs Python 3.10 or newer (set PYTHON to another)"
    assert done.stderr == f"install.sh: {too_old}\n"
