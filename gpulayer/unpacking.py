"""Unpacking an archive someone else made: the one way every archive is unpacked (a job's source and
inputs on a worker, a code bundle, a checkpoint, outputs downloaded, a source folder uploaded to the
HTTP API), whoever made it.

Nothing is written until the whole archive has been read and found safe: every entry a plain file,
folder or symbolic link, named inside the folder, no link leading out of it (followed through the
archive's own links, as the kernel would), nothing written through a link, and the entries and their
total size under the caps, counted from the headers (a small archive that would unpack to gigabytes
is refused before one byte of it lands). The headers themselves are capped before ``tarfile`` reads
them (:class:`_Header`): it would read a long name or a pax header of any size into memory whole.
Nor until the folder has room for every entry: each folder
on its way a folder, writable where something new goes, so a folder that cannot be written fails the
unpacking before anything lands, not half way. Then it is unpacked entry by entry, each folder
opened without following links, each file created without following one, so a folder that already
held links cannot redirect a write either. It relies on no ``tarfile`` filter, so it holds on every
Python (the ``data`` filter's link check could be bypassed before 3.11.13, 3.12.11 and 3.13.4:
CVE-2025-4517).
"""

from __future__ import annotations

import contextlib
import dataclasses
import lzma
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO

from .errors import ArchiveError
from .units import format_size

#: Most entries (files, folders, links) an archive may hold.
MAX_MEMBERS = 100_000
#: Most bytes of metadata one header may carry (a GNU long name or link, a pax header), and all of an
#: archive's global pax headers together: a name longer than :data:`_PATH_MAX` is refused anyway.
MAX_HEADER_BYTES = 64 * 1024
_METADATA = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)
#: A link may lead through at most this many links, as the kernel allows before ELOOP.
_MAX_HOPS = 40
#: The longest name of one path component, and of a whole path, most filesystems take.
_NAME_MAX = 255
_PATH_MAX = 4096
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_UNSAFE = "unsafe archive entry: "


@dataclasses.dataclass
class _Plan:
    """What an archive holds, by path (as a tuple of components): each entry's kind, each link's target."""

    kinds: dict[tuple[str, ...], str] = dataclasses.field(default_factory=dict)
    links: dict[tuple[str, ...], str] = dataclasses.field(default_factory=dict)
    size: int = 0


def extract(
    archive: IO[bytes],
    dest: Path,
    *,
    max_bytes: int,
    max_members: int = MAX_MEMBERS,
    replace: bool = False,
    keep: Callable[[str], bool] | None = None,
) -> list[Path]:
    """Unpack ``archive`` (tar: plain, gzip, bzip2 or xz; seekable) into the folder ``dest``; the
    regular files written. :class:`ArchiveError` with one line, having written nothing, if it is not
    safe or holds more than ``max_members`` entries or ``max_bytes`` of files, or if ``dest`` (made
    if missing) or a folder in it cannot take what goes there. ``replace``: an entry may replace a
    file already in ``dest`` (outputs downloaded again); without it, it may not (an input may not
    replace a source file). ``keep``: only the entries whose name it accepts are unpacked (the job's
    declared outputs); the others are passed over unread, whatever they are."""
    try:
        with reading(archive) as tar:
            plan = _plan(tar, max_bytes, max_members, keep)
        _check(plan)
        _Room(dest, replace).check(plan)
        archive.seek(0)
        with reading(archive) as tar:
            return _Writer(dest, replace, keep).write_all(tar)
    except tarfile.ReadError:
        raise ArchiveError("not a tar archive (plain, gzip, bzip2 or xz) or cut short") from None
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError) as exc:
        raise ArchiveError(f"not a valid archive: {' '.join(str(exc).split())}") from None


def reading(archive: IO[bytes]) -> tarfile.TarFile:
    """``archive`` (tar: plain, gzip, bzip2 or xz) opened for reading with its headers capped
    (:class:`_Header`): what every archive of someone else's is read through."""
    return tarfile.open(fileobj=archive, mode="r:*", tarinfo=_Header)


class _Header(tarfile.TarInfo):
    """A tar header, refused (:class:`ArchiveError`) before ``tarfile`` reads what it says follows
    when that would take unbounded memory: metadata over :data:`MAX_HEADER_BYTES` (``tarfile`` reads
    a GNU long name or a pax header into one bytes object, and keeps every global pax header for the
    rest of the archive), or a sparse file's map of holes in GNU's form or pax's 1.0 (read block by
    block for as long as it goes on). Pax's sparse 0.0 and 0.1 keep their map in the pax header,
    capped above. ``tarfile`` reads a header's successor in a call of its own: a chain of headers
    ends, refused, where Python's recursion does."""

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> _Header:
        header = super().frombuf(buf, encoding, errors)
        if header.type in _METADATA and header.size > MAX_HEADER_BYTES:
            raise ArchiveError(
                f"an archive header carries {format_size(header.size)} of metadata, above the "
                f"{format_size(MAX_HEADER_BYTES)} cap"
            )
        if header.type == tarfile.GNUTYPE_SPARSE:
            raise ArchiveError(_SPARSE.format(name=header.name))
        return header

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> _Header:
        held = sum(len(key) + len(value) for key, value in tar.pax_headers.items())
        if held > MAX_HEADER_BYTES:
            raise ArchiveError(
                f"the archive's global pax headers carry more than {format_size(MAX_HEADER_BYTES)}, the cap"
            )
        try:
            return super().fromtarfile(tar)
        except RecursionError:
            raise ArchiveError("an archive header is followed by too many others before its entry") from None

    def _proc_gnusparse_10(self, member: tarfile.TarInfo, pax_headers: dict[str, str], tar: object) -> None:
        raise ArchiveError(_SPARSE.format(name=member.name))


_SPARSE = "archive entry {name!r} is a sparse file, which is not taken"


def _parts(name: str) -> tuple[str, ...]:
    """An entry's path as components, refused if it could land outside the folder."""
    if "\0" in name:
        raise ArchiveError(f"archive entry {name!r} holds a NUL byte")
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise ArchiveError(f"archive entry {name!r} would land outside its folder")
    if len(name.encode()) > _PATH_MAX or any(len(part.encode()) > _NAME_MAX for part in path.parts):
        raise ArchiveError(f"archive entry {name[:80]!r}... has a name too long to write")
    return path.parts


def _plan(
    tar: tarfile.TarFile, max_bytes: int, max_members: int, keep: Callable[[str], bool] | None = None
) -> _Plan:
    """Every kept entry's kind, read from the headers alone, stopping at the first cap passed."""
    plan = _Plan()
    for count, member in enumerate(tar, start=1):
        if count > max_members:
            raise ArchiveError(f"the archive holds more than {max_members:,} entries")
        if keep is not None and not keep(member.name):
            continue
        parts = _parts(member.name)
        if not parts:  # the folder itself ("." or "./")
            continue
        kind = "dir" if member.isdir() else "file" if member.isreg() else "link" if member.issym() else ""
        if not kind:
            what = "a hard link" if member.islnk() else "not a file, folder or link"
            raise ArchiveError(f"archive entry {member.name!r} is {what}")
        if parts in plan.kinds and (kind, plan.kinds[parts]) != ("dir", "dir"):
            raise ArchiveError(f"archive entry {member.name!r} appears twice")
        plan.kinds[parts] = kind
        if kind == "link":
            plan.links[parts] = member.linkname
        plan.size += member.size if kind == "file" else 0
        if plan.size > max_bytes:
            raise ArchiveError(f"the archive unpacks to more than {format_size(max_bytes)}, the cap")
    return plan


def _check(plan: _Plan) -> None:
    """No entry written through a link; no link that leads out of the folder."""
    for parts in plan.kinds:
        for end in range(1, len(parts)):
            if parts[:end] in plan.links:
                through = "/".join(parts[:end])
                raise ArchiveError(f"{_UNSAFE}{'/'.join(parts)!r} is written through the link {through!r}")
    for parts, target in plan.links.items():
        if "\0" in target or PurePosixPath(target).is_absolute():
            raise ArchiveError(f"{_UNSAFE}the link {'/'.join(parts)!r} points to an absolute path")
        _follow(plan, list(parts[:-1]), target, parts)


def _follow(plan: _Plan, where: list[str], target: str, link: tuple[str, ...], hops: int = 0) -> list[str]:
    """Where ``target``, read in the folder ``where``, leads, following the archive's own links; an
    :class:`ArchiveError` if it leaves the folder or goes through too many links."""
    for part in PurePosixPath(target).parts:
        if part == "..":
            if not where:
                raise ArchiveError(f"{_UNSAFE}the link {'/'.join(link)!r} leads out of its folder")
            where.pop()
            continue
        where.append(part)
        inner = plan.links.get(tuple(where))
        if inner is not None:
            if hops >= _MAX_HOPS:
                raise ArchiveError(f"{_UNSAFE}the link {'/'.join(link)!r} goes through too many links")
            if PurePosixPath(inner).is_absolute():
                raise ArchiveError(f"{_UNSAFE}the link {'/'.join(link)!r} leads out of its folder")
            where = _follow(plan, where[:-1], inner, link, hops + 1)
    return where


class _Room:
    """Whether every entry of a plan can be written under ``dest`` as it is now: each folder on its way
    a folder (never a link), each one that gets a new entry writable, nothing replaced unless allowed."""

    def __init__(self, dest: Path, replace: bool) -> None:
        self._dest = dest
        self._replace = replace
        #: Folders by path: whether they are there already (else the unpacking makes them).
        self._there: dict[tuple[str, ...], bool] = {}
        self._writable: set[tuple[str, ...]] = set()

    def check(self, plan: _Plan) -> None:
        for parts, kind in plan.kinds.items():
            if kind == "dir":
                self._folder(parts)
                continue
            if self._folder(parts[:-1]):
                self._can_add_to(parts[:-1])
                found = self._lstat(self._dest.joinpath(*parts))
                if found is not None and (not self._replace or stat.S_ISDIR(found.st_mode)):
                    raise ArchiveError(
                        f"archive entry {'/'.join(parts)!r} would replace what is already there"
                    )

    def _folder(self, parts: tuple[str, ...]) -> bool:
        """Whether the folder ``parts`` is there already; an :class:`ArchiveError` if what is there is
        not a folder, or if it is missing and the folder it would be made in cannot be written."""
        known = self._there.get(parts)
        if known is not None:
            return known
        path = self._dest.joinpath(*parts)
        if parts:
            found = self._lstat(path) if self._folder(parts[:-1]) else None
        else:  # the folder asked for may be a link to one, and its own parents need not exist yet
            found = self._stat(path)
            if found is None:
                self._can_make(path)
        if found is not None and not stat.S_ISDIR(found.st_mode):
            if not parts:
                raise ArchiveError(f"cannot write to {path}: not a folder")
            raise ArchiveError(f"{_UNSAFE}{'/'.join(parts)!r} is already there, and not a folder")
        if found is None and parts and self._there[parts[:-1]]:
            self._can_add_to(parts[:-1])
        self._there[parts] = found is not None
        return found is not None

    def _can_add_to(self, parts: tuple[str, ...]) -> None:
        if parts not in self._writable:
            _writable(self._dest.joinpath(*parts))
            self._writable.add(parts)

    def _can_make(self, path: Path) -> None:
        """``path`` is missing: the nearest folder above it that is there must take a new folder."""
        above = path.absolute().parent
        while self._stat(above) is None and above != above.parent:
            above = above.parent
        found = self._stat(above)
        if found is None or not stat.S_ISDIR(found.st_mode):
            raise ArchiveError(f"cannot write to {path}: {above} is not a folder")
        _writable(above)

    def _lstat(self, path: Path) -> os.stat_result | None:
        try:
            return os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ArchiveError(f"cannot write to {path}: {_reason(exc)}") from None

    def _stat(self, path: Path) -> os.stat_result | None:
        try:
            return os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise ArchiveError(f"cannot write to {path}: {_reason(exc)}") from None


def _writable(folder: Path) -> None:
    # As the kernel will judge the writes: with the effective user, and its capabilities.
    effective = os.access in os.supports_effective_ids
    if not os.access(folder, os.W_OK | os.X_OK, effective_ids=effective):
        raise ArchiveError(f"cannot write to {folder}: permission denied")


def _reason(error: OSError) -> str:
    """``permission denied``: the system's words for it, as a message goes on after a colon."""
    text = error.strerror or str(error)
    return text[:1].lower() + text[1:]


class _Writer:
    """Writes entries under ``dest`` through folder descriptors opened without following links."""

    def __init__(self, dest: Path, replace: bool, keep: Callable[[str], bool] | None = None) -> None:
        self._dest = dest
        self._replace = replace
        self._keep = keep
        self._folders: dict[tuple[str, ...], int] = {}

    def write_all(self, tar: tarfile.TarFile) -> list[Path]:
        written: list[Path] = []
        try:
            self._dest.mkdir(parents=True, exist_ok=True)
            self._folders[()] = os.open(self._dest, _DIRECTORY)
            for member in tar:
                if self._keep is not None and not self._keep(member.name):
                    continue
                parts = _parts(member.name)
                if not parts:
                    continue
                if member.isdir():
                    self._folder(parts)
                elif member.issym():
                    self._link(parts, member.linkname)
                else:
                    source = tar.extractfile(member)
                    assert source is not None, "a regular file has contents"
                    self._file(parts, member, source)
                    written.append(self._dest.joinpath(*parts))
        except OSError as exc:
            raise ArchiveError(f"cannot write to {self._dest}: {_reason(exc)}") from None
        finally:
            for descriptor in self._folders.values():
                os.close(descriptor)
        return written

    def _folder(self, parts: tuple[str, ...]) -> int:
        """The descriptor of the folder ``parts``, made if missing; never a link."""
        found = self._folders.get(parts)
        if found is not None:
            return found
        parent = self._folder(parts[:-1])
        with contextlib.suppress(FileExistsError):
            os.mkdir(parts[-1], 0o755, dir_fd=parent)
        try:
            descriptor = os.open(parts[-1], _DIRECTORY, dir_fd=parent)
        except OSError:
            raise ArchiveError(f"{_UNSAFE}{'/'.join(parts)!r} is already there, and not a folder") from None
        self._folders[parts] = descriptor
        return descriptor

    def _clear(self, parent: int, name: str, parts: tuple[str, ...]) -> None:
        """Make room for an entry: only a file or link, only when replacing."""
        try:
            info = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            return
        if not self._replace or stat.S_ISDIR(info.st_mode):
            raise ArchiveError(f"archive entry {'/'.join(parts)!r} would replace what is already there")
        os.unlink(name, dir_fd=parent)

    def _link(self, parts: tuple[str, ...], target: str) -> None:
        parent = self._folder(parts[:-1])
        self._clear(parent, parts[-1], parts)
        os.symlink(target, parts[-1], dir_fd=parent)

    def _file(self, parts: tuple[str, ...], member: tarfile.TarInfo, source: IO[bytes]) -> None:
        parent = self._folder(parts[:-1])
        self._clear(parent, parts[-1], parts)
        # No setuid, setgid or sticky bit, nothing writable by others; always the owner's to read and write.
        mode = (member.mode & 0o755) | 0o600
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        descriptor = os.open(parts[-1], flags, mode, dir_fd=parent)
        with os.fdopen(descriptor, "wb") as target:
            shutil.copyfileobj(source, target)
            os.utime(target.fileno(), (member.mtime, member.mtime))
