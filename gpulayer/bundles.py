"""Code bundles: the project folder a remote function's code comes from, shipped once per content.

A function from the user's script (``__main__``), a closure or a lambda travels by value inside its
pickle; a function from one of the project's modules travels by reference, so the worker must be
able to import that module. So the project folder ships as a bundle, with the ignore rules and cap
of ``submit --source``, and a worker puts it first on ``sys.path``. A bundle is named by the SHA-256
of its contents: a second call ships nothing new, and a worker unpacks each bundle once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import threading
import time
from pathlib import Path

from . import archive

#: How long a client trusts the bundle it made before looking at the folder again (seconds).
_RECHECK = 2.0


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
    again only when its size or modification time changed."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._made: dict[Path, tuple[float, Bundle]] = {}
        self._hashes: dict[Path, tuple[tuple[int, int], bytes]] = {}

    def get(self, root: Path) -> Bundle:
        with self._lock:
            made = self._made.get(root)
            if made and time.monotonic() - made[0] < _RECHECK:
                return made[1]
            manifest = archive.source_manifest(root, self._max_bytes)
            digest = hashlib.sha256()
            for arcname in sorted(manifest.members):
                digest.update(arcname.encode() + b"\0" + self._hash(manifest.members[arcname]) + b"\0")
            bundle = Bundle(digest.hexdigest(), manifest)
            self._made[root] = (time.monotonic(), bundle)
            return bundle

    def _hash(self, path: Path) -> bytes:
        if path.is_symlink():
            return b"link:" + str(path.readlink()).encode()
        if not path.is_file():
            return b"dir"
        stat = path.stat()
        version = (stat.st_size, stat.st_mtime_ns)
        known = self._hashes.get(path)
        if known and known[0] == version:
            return known[1]
        digest = hashlib.sha256(path.read_bytes()).digest()
        self._hashes[path] = (version, digest)
        return digest
