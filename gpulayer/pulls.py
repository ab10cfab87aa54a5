"""A pull of an archive its maker keeps (outputs too large for Redis, pulled by a client from their
worker; inputs too large, pulled by a worker from their submitter), through Redis
(:mod:`gpulayer.store.transfers`), into a file that survives a dropped connection or a stopped
client: the next pull resumes where it ends.

Each chunk is checked as it arrives (sealed by the worker identity that signed the archive:
:mod:`gpulayer.transfer_seal`), and the whole file against the SHA-256 that identity signed when the
job ended. A file that does not check is removed, never resumed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import secrets
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .errors import OutputsUnavailable, UntrustedPayload
from .signing import WorkerKey
from .store.artifacts import HeldArchive
from .store.transfers import GONE_AFTER, TransferStore
from .transfer_seal import Opener

#: A worker has this long (s) to answer a request.
ANSWER = 10.0
#: A transfer with no chunk for this long (s) is dropped and asked for again from where it stopped.
STALLED = 15.0
#: Transfers in a row that bring nothing before a pull gives up.
TRIES = 5
#: Called as chunks arrive: bytes so far, bytes in all.
Progress = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True)
class Pull:
    """Archive ``name`` of job ``job_id``, which ``held`` says is kept by ``who`` (what messages call
    it; default: its worker), signed by ``sender``, brought into the file ``partial``; ``progress`` is
    told how far along; ``again`` is what to do once ``who`` is gone."""

    transfers: TransferStore
    sender: WorkerKey
    job_id: str
    name: str
    held: HeldArchive
    partial: Path
    progress: Progress | None = None
    who: str = ""
    again: str = "start it again to download them"

    @property
    def _who(self) -> str:
        return self.who or f"worker {self.held.worker}"

    def run(self) -> None:
        """Resuming what ``partial`` holds, transfer after transfer while each brings something.
        :class:`UntrustedPayload` (``partial`` removed) if a chunk or the whole is not what ``sender``
        signed; :class:`OutputsUnavailable` if the worker is gone or does not answer."""
        held, partial = self.held, self.partial
        self._check_serving()
        fruitless = 0
        while True:
            offset, digest = _resume(partial, held.size)
            try:
                if offset == held.size or self._transfer(offset, digest):
                    break
            except UntrustedPayload:
                partial.unlink(missing_ok=True)
                raise
            except (RedisConnectionError, RedisTimeoutError):
                time.sleep(1.0)
            fruitless = fruitless + 1 if partial.stat().st_size == offset else 0
            if fruitless >= TRIES:
                raise OutputsUnavailable(
                    f"{self._who} sent nothing of job {self.job_id}'s {self.name} in {TRIES} tries: "
                    "run it again later, it resumes"
                )
        # What came, all of it: the running digest of this transfer, begun over what an earlier one wrote.
        if digest.hexdigest() != held.sha256:
            partial.unlink(missing_ok=True)
            raise UntrustedPayload(
                f"job {self.job_id}'s {self.name} as it came is not the one its worker signed"
            )

    def _transfer(self, offset: int, digest: hashlib._Hash) -> bool:
        """One transfer from ``offset``, appended to ``partial``: True once it reached the end, False
        if it stalled (the caller asks again from where it stopped)."""
        held, transfers = self.held, self.transfers
        opener = Opener(secrets.token_hex(16), self.job_id, self.name, offset)
        transfer = opener.ask.transfer_id
        try:
            transfers.ask(held.worker, opener.ask)
        except NoPermissionError:
            raise OutputsUnavailable(
                f"job {self.job_id}'s outputs are kept on worker {held.worker}, and this access (a "
                "viewer's?) may not ask a worker for them: use a submitter's"
            ) from None
        try:
            first = transfers.receive(transfer, ANSWER)
            if first is None:
                raise OutputsUnavailable(
                    f"{self._who}, which keeps job {self.job_id}'s {self.name}, did not answer in "
                    f"{ANSWER:g} s"
                )
            try:
                hello = opener.hello(first, self.sender)
            except LookupError as exc:
                raise OutputsUnavailable(str(exc)) from None
            if hello.size != held.size:
                raise UntrustedPayload(f"{self._who} sends a {self.name} of another size than it signed")
            return self._receive(opener, offset, digest)
        finally:
            with contextlib.suppress(RedisError):  # else it expires on its own
                transfers.close(transfer)

    def _receive(self, opener: Opener, offset: int, digest: hashlib._Hash) -> bool:
        """The chunks, each written and acked as it comes (see :meth:`_transfer`)."""
        held, transfer = self.held, opener.ask.transfer_id
        written = offset
        with open(self.partial, "ab") as out:
            for seq in range(held.size + 1):  # bounded: a sender cannot keep a client for ever
                raw = self.transfers.receive(transfer, STALLED)
                if raw is None:
                    return False
                data = opener.open(seq, raw)
                if not data:
                    return True
                written += len(data)
                if written > held.size:
                    raise UntrustedPayload(f"{self._who} sends more of {self.name} than it signed")
                out.write(data)
                out.flush()
                digest.update(data)
                self.transfers.ack(transfer, seq + 1)
                if self.progress is not None:
                    self.progress(written, held.size)
        return False

    def _check_serving(self) -> None:
        """:class:`OutputsUnavailable` in one line, naming the server and since when, unless it said it
        serves within :data:`GONE_AFTER`."""
        last = self.transfers.last_served(self.held.worker)
        if last is not None and (datetime.now(timezone.utc) - last).total_seconds() <= GONE_AFTER:
            return
        since = f"since {last:%Y-%m-%d %H:%M:%S} UTC" if last else "for longer than the jobs' retention"
        kept = (
            f"job {self.job_id}'s outputs are kept on worker {self.held.worker}"
            if not self.who
            else f"job {self.job_id}'s {self.name} is kept by {self.who}"
        )
        raise OutputsUnavailable(f"{kept}, which is gone (not heard from {since}): {self.again}")


def _resume(partial: Path, size: int) -> tuple[int, hashlib._Hash]:
    """How much of the archive ``partial`` holds, and the SHA-256 of it so far (an over-long one is
    started again)."""
    digest = hashlib.sha256()
    if not partial.exists() or partial.stat().st_size > size:
        partial.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial.write_bytes(b"")
        return 0, digest
    with open(partial, "rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return partial.stat().st_size, digest
