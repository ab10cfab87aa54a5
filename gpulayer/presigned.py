"""Plain HTTP to presigned URLs of an S3-compatible store: what workers (and clients without the
store's credentials) use, so they hold none (see :mod:`gpulayer.object_store`)."""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from .archive import SPOOL_BYTES
from .errors import OutputsUnavailable, UntrustedPayload

#: How long (s) one request may wait on the store.
TIMEOUT = 60.0
#: What an archive is sent as (urllib would say a form, which a store may try to parse).
_BINARY = "application/octet-stream"


def download(url: str, dest: IO[bytes], most: int) -> str:
    """What ``url`` holds, written to ``dest``; its SHA-256. :class:`OutputsUnavailable` if the store
    refuses it (expired, removed) or it holds more than ``most`` bytes."""
    digest = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(_checked(url), timeout=TIMEOUT) as response:  # https or http only
            while block := response.read(SPOOL_BYTES):
                size += len(block)
                if size > most:
                    raise OutputsUnavailable(f"the object store sends more than the {most} bytes recorded")
                digest.update(block)
                dest.write(block)
    except (urllib.error.URLError, OSError) as exc:
        raise OutputsUnavailable(f"the object store did not send it: {_reason(exc)}") from None
    return digest.hexdigest()


def fetch(url: str, path: Path, size: int, sha256: str) -> None:
    """What ``url`` holds, into the file ``path``: :class:`UntrustedPayload` (``path`` removed) unless
    it is the archive of SHA-256 ``sha256``; :class:`OutputsUnavailable` if the store does not send
    it (or sends more than ``size`` bytes)."""
    with open(path, "wb") as file:
        came = download(url, file, size)
    if came != sha256:
        path.unlink(missing_ok=True)
        raise UntrustedPayload("the archive the object store sent is not the one that was signed")


def upload(url: str, path: Path) -> None:
    """The file at ``path`` PUT to ``url``; :class:`OSError` if the store refuses it."""
    size = path.stat().st_size
    with open(path, "rb") as file:
        request = urllib.request.Request(  # https or http only
            _checked(url),
            data=file,
            method="PUT",
            headers={"Content-Length": str(size), "Content-Type": _BINARY},
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
                response.read()
        except urllib.error.URLError as exc:
            raise OSError(f"the object store refused it: {_reason(exc)}") from None


def _checked(url: str) -> str:
    """``url`` if it is http(s): nothing else is fetched (a ``file:`` URL would read this machine)."""
    if not url.startswith(("https://", "http://")):
        raise OSError("the object store's URL is not http(s): refused")
    return url


def _reason(exc: OSError) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc)
