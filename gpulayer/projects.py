"""A source folder's project, read at submit for ``project_env``: its dependencies as requirement
lines, from its ``uv.lock`` (exported by uv, as pinned there) or else its ``pyproject.toml``'s
``[project] dependencies``. The project itself is not installed: it is the job's folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import uv

from .environments import requirements_file_lines
from .errors import InvalidJobSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: How long exporting a lock may take (it reads files only).
_EXPORT_TIMEOUT = 60.0


def project_requirements(folder: Path | None) -> list[str]:
    """The dependencies of the project in ``folder``, or :class:`InvalidJobSpec` saying why not."""
    if folder is None:
        raise InvalidJobSpec("invalid job: project_env: it needs a source folder (--source)")
    if (folder / "uv.lock").is_file():
        return _locked(folder)
    if (folder / "pyproject.toml").is_file():
        return _declared(folder / "pyproject.toml")
    raise InvalidJobSpec(f"invalid job: project_env: {folder} holds no uv.lock or pyproject.toml")


def _locked(folder: Path) -> list[str]:
    """The lock's packages as uv exports them: pinned, with their markers, without the project
    itself or its workspace's members (they are in the job's folder), without hashes."""
    command = [
        uv.find_uv_bin(),
        "export",
        "--frozen",
        "--no-hashes",
        "--no-header",
        "--no-annotate",
        "--no-emit-project",
        "--no-emit-workspace",
        "--format",
        "requirements-txt",
        "--directory",
        str(folder),
    ]
    environ = {**os.environ, "NO_COLOR": "1"}
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=_EXPORT_TIMEOUT, env=environ
    )
    if done.returncode != 0:
        said = " ".join(line.strip() for line in done.stderr.splitlines() if line.strip())
        raise InvalidJobSpec(f"invalid job: project_env: uv cannot export {folder / 'uv.lock'}: {said}")
    return _lines(done.stdout, folder / "uv.lock")


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML file ``path``; ValueError (OSError too) saying why it cannot be read."""
    try:
        found: dict[str, Any] = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(str(exc)) from None
    return found


def _declared(pyproject: Path) -> list[str]:
    try:
        data = read_toml(pyproject)
    except (OSError, ValueError) as exc:
        raise InvalidJobSpec(f"invalid job: project_env: cannot read {pyproject}: {exc}") from None
    dependencies = data.get("project", {}).get("dependencies", [])
    if not isinstance(dependencies, list) or not all(isinstance(text, str) for text in dependencies):
        raise InvalidJobSpec(f"invalid job: project_env: {pyproject}'s [project] dependencies is not a list")
    return list(dependencies)


def _lines(text: str, where: Path) -> list[str]:
    try:
        return requirements_file_lines(text)
    except ValueError as exc:
        raise InvalidJobSpec(f"invalid job: project_env: {where}: {exc}") from None
