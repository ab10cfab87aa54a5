"""Folders to archives: the source folder, the inputs, the outputs, a checkpoint folder.

Packing applies the ignore rules and the size caps before anything is written. Unpacking, whoever
made the archive, is :mod:`gpulayer.unpacking`'s.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import gzip  # noqa: F401  # imported now, not when tarfile first needs it: a worker may then be reading as a job's user, who cannot read the Python library
import os
import tarfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import IO

import pathspec

from .errors import InputNotFound, SourceError
from .models import OutputSummary
from .units import format_size

#: Never shipped with a source folder, whatever .gitignore says.
ALWAYS_SKIPPED = frozenset({".git", "__pycache__", ".venv"})
#: An installation's keys and passwords (its installation.json and accesses, access/<name>.json, as
#: a home keeps them): never shipped from anywhere in a source folder, a copy of a home's included.
_INSTALLATION_FILE = "installation.json"
_ACCESS_FOLDER = "access"
# Fast rather than small: archives are made and unpacked on the critical path of a job's start.
_GZIP_LEVEL = 1
#: An archive on its way to or from Redis stays in memory up to this size (a temporary file past it):
#: most are small, and a large one must not take a process's memory.
SPOOL_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass
class Manifest:
    """Files chosen for an archive: arcname → path on disk, their total size, and what was left out."""

    members: dict[str, Path] = dataclasses.field(default_factory=dict)
    size: int = 0
    #: Symbolic links that point outside their folder, which an archive cannot carry safely.
    skipped_links: list[str] = dataclasses.field(default_factory=list)

    def add(self, path: Path, arcname: str, root: Path) -> None:
        if arcname in self.members:
            return
        if path.is_symlink():
            if not _inside(path, root):
                self.skipped_links.append(arcname)
                return
        elif not (path.is_file() or path.is_dir()):
            return
        self.members[arcname] = path
        if path.is_file() and not path.is_symlink():
            self.size += path.stat().st_size

    def add_tree(self, path: Path, arcname: str, root: Path) -> None:
        self.add(path, arcname, root)
        if path.is_dir() and not path.is_symlink():
            for dirpath, dirnames, filenames in os.walk(path):
                for name in sorted(dirnames) + sorted(filenames):
                    child = Path(dirpath, name)
                    self.add(child, f"{arcname}/{child.relative_to(path).as_posix()}", root)

    def write(self, dest: IO[bytes]) -> None:
        with tarfile.open(fileobj=dest, mode="w:gz", compresslevel=_GZIP_LEVEL) as tar:
            for arcname, path in self.members.items():
                tar.add(path, arcname=arcname, recursive=False, filter=self._relative_link)

    def _relative_link(self, info: tarfile.TarInfo) -> tarfile.TarInfo:
        if info.issym():
            info.linkname = self.link_target(info.name)
        elif info.islnk():
            # A file with a second name here: stored whole again (tarfile adds the contents of what
            # is regular by then), since unpacking takes no hard links.
            info.type, info.linkname, info.size = tarfile.REGTYPE, "", self.members[info.name].stat().st_size
        return info

    def link_target(self, arcname: str) -> str:
        """What a link is stored as: relative to where it sits, so it points at the same file once
        unpacked elsewhere (an absolute link, or one that climbs out and back in, would be refused there)."""
        path = self.members[arcname]
        return os.path.relpath(path.resolve(), path.parent.resolve())


def _inside(link: Path, root: Path) -> bool:
    return link.resolve().is_relative_to(root.resolve())


def source_manifest(folder: Path, max_bytes: int, home: Path) -> Manifest:
    """The files of a source folder that ship: minus ``.git``, ``__pycache__``, ``.venv``, what
    ``.gitignore`` files ignore (a nested one applies to its own folder), GPUlayer's ``home`` where
    it is inside, and every installation's keys (:data:`_INSTALLATION_FILE`, ``access/*.json``)."""
    if not folder.is_dir():
        raise SourceError(f"source folder not found: {folder}")
    home_inside = _home_inside(folder, home)
    manifest = Manifest()
    specs: dict[str, pathspec.GitIgnoreSpec] = {}
    try:
        for dirpath, dirnames, filenames in os.walk(folder):
            rel_dir = Path(dirpath).relative_to(folder).as_posix()
            if ".gitignore" in filenames:
                lines = Path(dirpath, ".gitignore").read_text(errors="replace").splitlines()
                specs[rel_dir] = pathspec.GitIgnoreSpec.from_lines(lines)
            kept = []
            for name in sorted(dirnames):
                arcname = _join(rel_dir, name)
                if name in ALWAYS_SKIPPED or arcname == home_inside or _ignored(specs, arcname + "/"):
                    continue
                manifest.add(Path(dirpath, name), arcname, folder)
                if not Path(dirpath, name).is_symlink():
                    kept.append(name)
            dirnames[:] = kept
            for name in sorted(filenames):
                arcname = _join(rel_dir, name)
                if not _keys(rel_dir, name) and not _ignored(specs, arcname):
                    manifest.add(Path(dirpath, name), arcname, folder)
    except OSError as exc:
        raise SourceError(f"cannot read source folder {folder}: {exc.strerror}: {exc.filename}") from None
    if manifest.size > max_bytes:
        raise SourceError(
            f"source folder {folder} holds {format_size(manifest.size)} after the ignore rules, above the "
            f"{format_size(max_bytes)} cap; ignore large files in .gitignore, ship them with --input, "
            "or raise GPULAYER_MAX_SOURCE_BYTES"
        )
    return manifest


def _home_inside(folder: Path, home: Path) -> str | None:
    """Where ``home`` is in ``folder`` (an arcname), if it is; a :class:`SourceError` if the folder
    is the home, or in it."""
    real_folder, real_home = folder.resolve(), home.resolve()
    if real_folder.is_relative_to(real_home):
        raise SourceError(f"source folder {folder} is in GPUlayer's home ({home}), which holds its keys")
    return real_home.relative_to(real_folder).as_posix() if real_home.is_relative_to(real_folder) else None


def _keys(rel_dir: str, name: str) -> bool:
    """Whether a file holds an installation's keys, by its name alone: in any home, a copy of one
    included, wherever it is in the folder."""
    return name == _INSTALLATION_FILE or (Path(rel_dir).name == _ACCESS_FOLDER and name.endswith(".json"))


def _join(rel_dir: str, name: str) -> str:
    return name if rel_dir == "." else f"{rel_dir}/{name}"


def _ignored(specs: dict[str, pathspec.GitIgnoreSpec], arcname: str) -> bool:
    for spec_dir, spec in specs.items():
        if spec_dir == ".":
            if spec.match_file(arcname):
                return True
        elif arcname.startswith(spec_dir + "/") and spec.match_file(arcname[len(spec_dir) + 1 :]):
            return True
    return False


def inputs_manifest(paths: Iterable[Path]) -> Manifest:
    """Each input, a file or a folder, under its base name at the top of the job's folder."""
    manifest = Manifest()
    for path in paths:
        if not path.exists():
            raise InputNotFound(f"input not found: {path}")
        name = Path(os.path.abspath(path)).name
        if any(member == name or member.startswith(name + "/") for member in manifest.members):
            raise InputNotFound(f"two inputs are named {name!r}; each input keeps its base name")
        # An input named on the command line ships as what it points to; links inside it must stay inside.
        real = path.resolve()
        manifest.add_tree(real, name, real)
    return manifest


def folder_manifest(folder: Path) -> Manifest:
    """Everything in ``folder``, named relative to it."""
    manifest = Manifest()
    for child in sorted(folder.iterdir()):
        manifest.add_tree(child, child.name, folder)
    return manifest


def outputs_manifest(workdir: Path, patterns: Iterable[str]) -> tuple[Manifest, list[str]]:
    """What the job's declared outputs matched, and the patterns that matched nothing."""
    manifest, missing = Manifest(), []
    for pattern in patterns:
        matches = sorted(workdir.glob(pattern))
        if not matches:
            missing.append(pattern)
        for path in matches:
            arcname = path.relative_to(workdir).as_posix()
            manifest.add_tree(path, arcname, workdir)
    return manifest, missing


def declared(patterns: Iterable[str]) -> Callable[[str], bool]:
    """Whether an entry of an outputs archive is one of the job's declared outputs: a path the
    patterns match as the worker's glob matched them, or a path inside one. Never a path that could
    land outside the folder it is unpacked in."""
    split = [_components(pattern) for pattern in patterns]

    def keep(name: str) -> bool:
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            return False
        parts = path.parts
        return any(_matches(parts[:end], pattern) for pattern in split for end in range(1, len(parts) + 1))

    return keep


def _components(pattern: str) -> tuple[str, ...]:
    return tuple(part for part in pattern.split("/") if part not in ("", "."))


def _matches(parts: Sequence[str], pattern: Sequence[str]) -> bool:
    """Whether the path ``parts`` matches the glob ``pattern`` component by component, ``**`` matching
    any number of them, as :meth:`Path.glob` does."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_matches(parts[skip:], pattern[1:]) for skip in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _matches(parts[1:], pattern[1:])


def summarize(manifest: Manifest, missing: list[str]) -> OutputSummary:
    """What outputs found: how many files, their size, the patterns that matched nothing."""
    files = sum(1 for path in manifest.members.values() if path.is_file())
    return OutputSummary(files=files, bytes=manifest.size, missing=missing)
