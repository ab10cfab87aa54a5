"""Code bundles: the project folder a remote function's code comes from, shipped once per content.

A function from the user's script (``__main__``), a closure or a lambda travels by value inside its
pickle; a function from one of the project's modules travels by reference, so the worker must be
able to import that module. So the project folder ships as a bundle, with the ignore rules and cap
of ``submit --source``, and a worker puts it first on ``sys.path``. A bundle is named by the SHA-256
of its contents (:func:`digest`): a second call ships nothing new, a worker unpacks each bundle once,
and, since the name is in the job's signature, a worker checks the archive against it
(:func:`archive_digest`) before any of it is unpacked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import tarfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from . import archive
from .errors import ArchiveError
from .unpacking import MAX_MEMBERS, reading

#: How long a client trusts the bundle it made before looking at the folder again (seconds).
_RECHECK = 2.0
#: What a link's and a folder's hash start with in a bundle's digest.
_LINK = b"link:"
_FOLDER = b"dir"


def project_root() -> Path:
    """Where the running program imports its own modules from: the folder of the script being run
    (``python train.py``), else the current folder (``python -m pkg.train``, a REPL, a notebook)."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if script and getattr(main, "__spec__", None) is None:
        return Path(script).resolve().parent
    return Path.cwd()


@dataclasses.dataclass(frozen=True)
class Bundle:
    digest: str
    manifest: archive.Manifest


class BundleCache:
    """A client's bundles, by folder: looked at again at most every two seconds, and each file hashed
    again only when its size or modification time changed. GPUlayer's ``home`` never ships in one."""

    def __init__(self, max_bytes: int, home: Path) -> None:
        self._max_bytes = max_bytes
        self._home = home
        self._lock = threading.Lock()
        self._made: dict[Path, tuple[float, Bundle]] = {}
        self._hashes: dict[Path, tuple[tuple[int, int], bytes]] = {}

    def get(self, root: Path) -> Bundle:
        with self._lock:
            made = self._made.get(root)
            if made and time.monotonic() - made[0] < _RECHECK:
                return made[1]
            manifest = archive.source_manifest(root, self._max_bytes, self._home)
            hashes = {arcname: self._hash(manifest, arcname) for arcname in manifest.members}
            bundle = Bundle(digest(hashes), manifest)
            self._made[root] = (time.monotonic(), bundle)
            return bundle

    def _hash(self, manifest: archive.Manifest, arcname: str) -> bytes:
        path = manifest.members[arcname]
        if path.is_symlink():
            return _LINK + manifest.link_target(arcname).encode()
        if not path.is_file():
            return _FOLDER
        stat = path.stat()
        version = (stat.st_size, stat.st_mtime_ns)
        known = self._hashes.get(path)
        if known and known[0] == version:
            return known[1]
        found = hashlib.sha256(path.read_bytes()).digest()
        self._hashes[path] = (version, found)
        return found


def digest(hashes: Mapping[str, bytes]) -> str:
    """A bundle's name: the SHA-256 over each member's name and hash (of its contents; of where a link
    points; ``dir`` for a folder), in name order."""
    total = hashlib.sha256()
    for arcname in sorted(hashes):
        total.update(arcname.encode() + b"\0" + hashes[arcname] + b"\0")
    return total.hexdigest()


def archive_digest(archive: IO[bytes], max_bytes: int) -> str:
    """:func:`digest` of what a bundle's archive holds, read from the archive itself: what the client
    names the bundle by, and what a worker checks before it unpacks any of it. :class:`ArchiveError`
    if it is not a readable archive, or holds more than ``max_bytes`` (read a chunk at a time) or
    :data:`~gpulayer.unpacking.MAX_MEMBERS` entries."""
    hashes: dict[str, bytes] = {}
    size = 0
    try:
        with reading(archive) as tar:
            for count, member in enumerate(tar, start=1):
                if count > MAX_MEMBERS:
                    raise ArchiveError(f"the code bundle holds more than {MAX_MEMBERS:,} entries")
                size += member.size if member.isreg() else 0
                if size > max_bytes:
                    raise ArchiveError(f"the code bundle unpacks to more than {max_bytes} bytes")
                if member.issym():
                    hashes[member.name] = _LINK + member.linkname.encode()
                elif member.isdir():
                    hashes[member.name] = _FOLDER
                else:
                    content = tar.extractfile(member)
                    hashes[member.name] = _hash_stream(content) if content else hashlib.sha256().digest()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ArchiveError(f"the code bundle is not a readable archive: {exc}") from None
    return digest(hashes)


def _hash_stream(stream: IO[bytes]) -> bytes:
    found = hashlib.sha256()
    while chunk := stream.read(1 << 20):
        found.update(chunk)
    return found.digest()
