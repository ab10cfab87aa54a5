"""A transfer's messages, sealed end to end: what a worker sends the client that asked it for an
archive it holds (:mod:`gpulayer.archive_server`, :mod:`gpulayer.pulls`), whoever else reads Redis;
and, the other way, what a submitter sends the worker that pulls the inputs it serves (signed with
the job key instead, under :data:`SUBMITTERS`).

The asker makes a key pair for the one transfer and puts its public half in its request. The worker
makes one too, and its first message (the *hello*) carries its public half signed with its result
key (its identity's, the one that sealed the archive), bound to the transfer, the job, the archive,
the offset and the asker's key. Each chunk after it is encrypted and authenticated (XSalsa20-Poly1305)
for the asker alone, numbered by its nonce, and an empty chunk ends the transfer. So a chunk is read
only by the asker; one changed, dropped, reordered or replayed in Redis, or pushed by anyone but that
worker, is refused as it arrives; and the end cannot be faked. The archive's SHA-256, signed when the
job ended, is checked as well once it is whole.
"""

from __future__ import annotations

import base64
import dataclasses
import json

import nacl.exceptions
import nacl.public

from .errors import UntrustedPayload
from .signing import ResultSigner, WorkerKey

#: Each chunk carries this much of the archive, at most: sealed (16 bytes more) and stored as a Redis
#: string, it still fits the allocator's 1 MiB size class (one byte more, and it takes 1.25 MiB).
CHUNK = 1024 * 1024 - 64
_PURPOSE = "transfer"
#: The identity a submitter's hello names: it signs with the installation's job key (what the job's
#: own signature is made with), which the worker checks it against.
SUBMITTERS = "submitters"


def _text(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode()


def _raw(text: object, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(str(text))
    except ValueError:
        raise UntrustedPayload(f"the transfer's {what} is not valid base64") from None


def _nonce(seq: int) -> bytes:
    return seq.to_bytes(nacl.public.Box.NONCE_SIZE, "big")


@dataclasses.dataclass(frozen=True)
class Ask:
    """What one transfer asks for: its id, the job and archive, where to start, and the asker's key."""

    transfer_id: str
    job_id: str
    name: str
    offset: int
    #: The asker's public key for this transfer (base64).
    key: str

    def bound(self, sender_key: bytes, size: int, identity: str) -> tuple[str | int | bytes, ...]:
        """What the hello's signature covers."""
        return (self.transfer_id, self.job_id, self.name, self.offset, self.key, sender_key, size, identity)


class Sealer:
    """The worker's side of one transfer."""

    def __init__(self, ask: Ask, signer: ResultSigner) -> None:
        self._ask = ask
        self._signer = signer
        self._private = nacl.public.PrivateKey.generate()
        asker = nacl.public.PublicKey(_raw(ask.key, "asker's key"))
        self._box = nacl.public.Box(self._private, asker)

    def hello(self, size: int) -> bytes:
        """The first message: the archive's whole ``size``, and this side's key, signed."""
        public = bytes(self._private.public_key)
        identity = self._signer.identity
        signature = self._signer.key.sign(_PURPOSE, *self._ask.bound(public, size, identity))
        fields = {"key": _text(public), "size": size, "identity": identity, "sig": _text(signature)}
        return json.dumps(fields).encode()

    def seal(self, seq: int, data: bytes) -> bytes:
        """Chunk number ``seq`` (from 0) for the asker alone; ``b""`` ends the transfer."""
        return self._box.encrypt(data, _nonce(seq)).ciphertext


def refusal(reason: str) -> bytes:
    """A first message saying why the worker sends nothing."""
    return json.dumps({"error": reason}).encode()


@dataclasses.dataclass(frozen=True)
class Hello:
    """A hello read: the archive's whole size, and the sender's key for this transfer."""

    size: int
    identity: str
    key: bytes


class Opener:
    """The asker's side of one transfer: its key pair, then the sender's key once the hello checks."""

    def __init__(self, transfer_id: str, job_id: str, name: str, offset: int) -> None:
        self._private = nacl.public.PrivateKey.generate()
        self.ask = Ask(transfer_id, job_id, name, offset, _text(bytes(self._private.public_key)))
        self._box: nacl.public.Box | None = None

    def hello(self, raw: bytes, sender: WorkerKey) -> Hello:
        """The first message, checked: signed by ``sender`` (the identity that sealed the archive)
        for this very ask; :class:`UntrustedPayload` if not; :class:`LookupError` with the worker's
        reason if it refused."""
        try:
            fields = json.loads(raw)
            if "error" in fields:
                raise LookupError(str(fields["error"]))
            hello = Hello(int(fields["size"]), str(fields["identity"]), _raw(fields["key"], "key"))
            signature = _raw(fields["sig"], "signature")
        except (ValueError, TypeError, KeyError, AttributeError):
            raise UntrustedPayload("the transfer's first message cannot be read") from None
        if hello.identity != sender.identity:
            raise UntrustedPayload(
                f"the transfer is sent by {hello.identity!r}, not by {sender.identity!r}, which signed "
                "the archive"
            )
        sender.key.verify(signature, _PURPOSE, *self.ask.bound(hello.key, hello.size, hello.identity))
        self._box = nacl.public.Box(self._private, nacl.public.PublicKey(hello.key))
        return hello

    def open(self, seq: int, raw: bytes) -> bytes:
        """Chunk number ``seq``: :class:`UntrustedPayload` unless the sender sealed exactly it, as that
        number, for this asker (``b""``: the end)."""
        if self._box is None:
            raise UntrustedPayload("a chunk came before the transfer's hello")
        try:
            return self._box.decrypt(raw, _nonce(seq))
        except (nacl.exceptions.CryptoError, ValueError, TypeError):
            raise UntrustedPayload(
                f"chunk {seq} of the transfer was changed, dropped or sent by someone else: refused"
            ) from None
