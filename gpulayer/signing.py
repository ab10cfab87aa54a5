"""Signatures: a worker runs only jobs a submitter signed, and a client accepts only results and
archives the worker that ran the job signed, each signature bound to what it is for.

Two Ed25519 key pairs per installation, and one per worker. The *job key* signs every job at submit
(its spec, its id and the digests of the files it carries); submitters (and the HTTP server) hold its
private half, workers only its public half, so a worker, or anyone holding a worker's Redis
credentials, can check a job but never make one. The *identity key*, the admin's alone, signs each
machine's *identity* (:class:`gpulayer.models.Identity`): its role, its Redis user, and for a worker
its own *result key*, whose private half only that worker holds. A worker signs what a function job
returned or raised, and the archives it stores (outputs, checkpoints), bound to the job, the attempt
and its identity; a client checks them with the public half its identity's record names, once the
record is found signed by the admin and not expired. No private key is ever written to Redis.

Each signed message starts with a purpose (``job``, ``result``, ``archive``, ``identity``), so a
signature made for one thing is never valid as another, and spells each of its parts with its length,
so no two lists of parts read the same.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

import nacl.exceptions
import nacl.signing

from .errors import ConfigError, UntrustedPayload
from .models import Identity

_DOMAIN = b"gpulayer/1"
#: Signed results start with this, then the signature, then the pickle.
_RESULT_MAGIC = b"GLR1"
_SIGNATURE_BYTES = 64
_HASH_BYTES = 32
#: How many checked batch roots a worker remembers.
_VERIFIED = 4096
#: How many checked identity records a client remembers (by their exact bytes).
_IDENTITIES = 1024
Part = bytes | str | int


def _message(purpose: str, parts: tuple[Part, ...]) -> bytes:
    pieces = [_DOMAIN, purpose.encode()]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        pieces.append(len(data).to_bytes(8, "big") + data)
    return b"\0".join(pieces)


def _decode(text: str, what: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        raise ConfigError(f"{what} is not valid base64") from None
    if len(raw) != 32:
        raise ConfigError(f"{what} must be 32 bytes (it is {len(raw)})")
    return raw


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class VerifyKey:
    """The public half: checks signatures, cannot make them."""

    def __init__(self, public: nacl.signing.VerifyKey) -> None:
        self._public = public
        raw = bytes(public)
        self.text = _encode(raw)
        #: Short name of the key, kept beside each signature so a job signed by another installation
        #: (or a rotated key) is told apart from a forged one.
        self.key_id = hashlib.sha256(raw).hexdigest()[:16]

    @classmethod
    def from_text(cls, text: str, what: str = "a public key") -> VerifyKey:
        return cls(nacl.signing.VerifyKey(_decode(text, what)))

    def verify(self, signature: bytes, purpose: str, *parts: Part) -> None:
        """Nothing if ``signature`` is this key's over ``purpose`` and ``parts``; else
        :class:`UntrustedPayload`."""
        try:
            self._public.verify(_message(purpose, parts), signature)
        except nacl.exceptions.BadSignatureError:
            raise UntrustedPayload(f"the {purpose}'s signature does not match it") from None


class SigningKey:
    """The private half: makes signatures its :attr:`public` half checks."""

    def __init__(self, private: nacl.signing.SigningKey) -> None:
        self._private = private
        self.public = VerifyKey(private.verify_key)

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(nacl.signing.SigningKey.generate())

    @classmethod
    def from_text(cls, text: str, what: str = "a private key") -> SigningKey:
        return cls(nacl.signing.SigningKey(_decode(text, what)))

    @property
    def text(self) -> str:
        return _encode(bytes(self._private))

    def sign(self, purpose: str, *parts: Part) -> bytes:
        return self._private.sign(_message(purpose, parts)).signature


@dataclasses.dataclass(frozen=True)
class Keyring:
    """The keys one machine holds in its role, none of them required: the halves of the job and
    identity pairs, and a worker's own result key."""

    job_key: SigningKey | None = None
    job_verify: VerifyKey | None = None
    identity_key: SigningKey | None = None
    identity_verify: VerifyKey | None = None
    result_key: SigningKey | None = None

    @classmethod
    def generate(cls) -> Keyring:
        """A new installation's keys: both halves of the job and identity pairs (each worker's
        result key is made with its identity)."""
        job, identity = SigningKey.generate(), SigningKey.generate()
        return cls(job, job.public, identity, identity.public)

    def signer(self) -> SigningKey:
        """The key jobs are signed with; :class:`ConfigError` saying how to get it when absent."""
        if self.job_key is None:
            raise ConfigError(
                "this machine holds no key to sign jobs with: run `gpulayer up`, or get a submitter's "
                "access from the installation's admin (`gpulayer access add submitter NAME`) and "
                "`gpulayer connect` with it"
            )
        return self.job_key

    def checker(self) -> VerifyKey:
        """The key a worker checks jobs with; :class:`ConfigError` when absent."""
        if self.job_verify is None:
            raise ConfigError(
                "this machine holds no key to check jobs with: join with a worker's token "
                "(`gpulayer access add worker NAME` on the admin's machine)"
            )
        return self.job_verify

    def as_texts(self) -> dict[str, str]:
        keys: dict[str, SigningKey | VerifyKey | None] = {
            field.name: getattr(self, field.name) for field in dataclasses.fields(self)
        }
        return {name: key.text for name, key in keys.items() if key is not None}

    def result_signer(self, identity: str) -> ResultSigner:
        """What a worker signs under as ``identity``: :class:`ConfigError` without a result key."""
        if self.result_key is None or not identity:
            raise ConfigError(
                "this worker's access is no identity's (a token made before each machine had its own): "
                "get one with `gpulayer access add worker NAME` on the admin's machine"
            )
        return ResultSigner(identity, self.result_key)

    @classmethod
    def from_texts(cls, texts: Mapping[str, str | None]) -> Keyring:
        def private(name: str) -> SigningKey | None:
            text = texts.get(name)
            return SigningKey.from_text(text, name) if text else None

        def public(name: str) -> VerifyKey | None:
            text = texts.get(name)
            return VerifyKey.from_text(text, name) if text else None

        return cls(
            private("job_key"),
            public("job_verify"),
            private("identity_key"),
            public("identity_verify"),
            private("result_key"),
        )


# --- jobs --------------------------------------------------------------------------------------------
def seal_job(key: SigningKey, job_id: str, spec_json: str | bytes, files: Mapping[str, str]) -> str:
    """The seal stored with a job (``gl_seal``): a signature over its id, its spec exactly as stored,
    and the SHA-256 of each file it carries (by archive name). A batch of one: see :func:`seal_jobs`."""
    return seal_jobs(key, [(job_id, spec_json, files)])[0]


def seal_jobs(key: SigningKey, jobs: Sequence[tuple[str, str | bytes, Mapping[str, str]]]) -> list[str]:
    """The seals of many jobs (id, spec as stored, file digests) made with one signature: over the
    root of a Merkle tree of the jobs, each seal carrying the path from its job to that root. A
    worker checks one job with a few hashes and, once per batch, the signature."""
    leaves = [_leaf(job_id, spec_json, files) for job_id, spec_json, files in jobs]
    root, paths = _tree(leaves)
    signature = _encode_signature(key.sign("jobs", root))
    return [
        json.dumps(
            {"key": key.public.key_id, "files": dict(files), "sig": signature, "path": path},
            separators=(",", ":"),
        )
        for (_, _, files), path in zip(jobs, paths, strict=True)
    ]


class Verified:
    """Batch roots whose signature a worker has checked already, the latest :data:`_VERIFIED` of them.
    Shared by the threads that start jobs (the main loop and each slot): a root found must not be
    evicted before it is moved to the end."""

    def __init__(self) -> None:
        self._roots: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, root: object) -> bool:
        with self._lock:
            if root in self._roots:
                self._roots.move_to_end(root)  # type: ignore[arg-type]
                return True
            return False

    def add(self, root: bytes) -> None:
        with self._lock:
            self._roots[root] = None
            if len(self._roots) > _VERIFIED:
                self._roots.popitem(last=False)


def check_job(
    key: VerifyKey, job_id: str, spec_json: bytes, seal: bytes | None, verified: Verified | None = None
) -> dict[str, str]:
    """The digests of the job's files, once its seal is found to be a submitter's over exactly this
    job; else :class:`UntrustedPayload` with a one-line reason. ``verified``: roots (with their
    signature) already checked, so a batch's signature is checked once."""
    if not seal:
        raise UntrustedPayload("the job is not signed")
    try:
        found = json.loads(seal)
        files, signature, key_id = found["files"], _decode_signature(found["sig"]), found["key"]
        path = [(step[0], base64.b64decode(step[1:], validate=True)) for step in found["path"]]
        if not isinstance(files, dict) or not all(
            isinstance(name, str) and isinstance(digest, str) for name, digest in files.items()
        ):
            raise TypeError
    except (ValueError, TypeError, KeyError, IndexError):
        raise UntrustedPayload("the job's signature is garbled") from None
    if key_id != key.key_id:
        raise UntrustedPayload("the job is signed with another installation's key")
    node = _leaf(job_id, spec_json, files)
    for side, sibling in path:
        if side not in "LR" or len(sibling) != _HASH_BYTES:
            raise UntrustedPayload("the job's signature is garbled")
        node = _node(sibling, node) if side == "L" else _node(node, sibling)
    checked = node + signature
    if verified is None or checked not in verified:
        try:
            key.verify(signature, "jobs", node)
        except UntrustedPayload:
            raise UntrustedPayload("the job's signature does not match it") from None
        if verified is not None:
            verified.add(checked)
    return files


def _leaf(job_id: str, spec_json: str | bytes, files: Mapping[str, str]) -> bytes:
    """One job as a leaf of a batch's tree: what its signature covers (leaves and inner nodes are
    hashed apart, so neither can pass for the other)."""
    spec = spec_json.encode() if isinstance(spec_json, str) else spec_json
    message = _message("job", (job_id, hashlib.sha256(spec).digest(), _files_text(files)))
    return hashlib.sha256(b"\0" + message).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\1" + left + right).digest()


def _tree(leaves: list[bytes]) -> tuple[bytes, list[list[str]]]:
    """The root over ``leaves`` and each leaf's path to it: its siblings, level by level, each marked
    L or R for the side it is on (the last node of an odd level goes up alone)."""
    paths: list[list[str]] = [[] for _ in leaves]
    at = list(range(len(leaves)))  # where each leaf's ancestor stands in the current level
    level = leaves
    while len(level) > 1:
        for leaf, position in enumerate(at):
            sibling = position ^ 1
            if sibling < len(level):
                side = "L" if sibling < position else "R"
                paths[leaf].append(side + base64.b64encode(level[sibling]).decode())
            at[leaf] = position // 2
        level = [
            _node(level[i], level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)
        ]
    return level[0], paths


def check_file(files: Mapping[str, str], name: str, sha256: str) -> None:
    """Nothing if the job's seal names ``name`` with this digest; else :class:`UntrustedPayload`."""
    if name not in files:
        raise UntrustedPayload(f"the job's signature does not cover its {name}")
    if files[name] != sha256:
        raise UntrustedPayload(f"the job's {name} is not the one it was signed with")


def _files_text(files: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(files.items())), separators=(",", ":"))


def _encode_signature(signature: bytes) -> str:
    return base64.b64encode(signature).decode()


def _decode_signature(text: object) -> bytes:
    if not isinstance(text, str):
        raise TypeError
    signature = base64.b64decode(text, validate=True)
    if len(signature) != _SIGNATURE_BYTES:
        raise ValueError
    return signature


# --- identities --------------------------------------------------------------------------------------
def sign_identity(key: SigningKey, identity: Identity) -> str:
    """``identity`` as the registry keeps it: its record, and the admin's signature over exactly it."""
    record = identity.model_dump_json()
    return json.dumps({"record": record, "sig": _encode_signature(key.sign("identity", record))})


@dataclasses.dataclass(frozen=True)
class WorkerKey:
    """The result key of one worker identity, from its record, checked."""

    identity: str
    key: VerifyKey


class Identities:
    """Identity records checked with the admin's key: a record that does not check (forged, edited,
    signed by another key, filed under another name) counts as absent. Each stored record is checked
    once, and a worker's result key read once (remembered by the record's exact bytes)."""

    def __init__(self, key: VerifyKey) -> None:
        self._key = key
        self._checked: dict[bytes, tuple[Identity, VerifyKey | None] | None] = {}

    def check(self, name: str, stored: bytes | None) -> Identity | None:
        """The identity ``name``'s record, if ``stored`` is one the admin signed for that name."""
        found = self._found(name, stored)
        return found[0] if found is not None else None

    def _found(self, name: str, stored: bytes | None) -> tuple[Identity, VerifyKey | None] | None:
        if stored is None:
            return None
        # One read of the entry: another thread (a client's sender, a web server's) may clear them.
        found = self._checked.get(stored)
        if found is None and stored not in self._checked:
            found = self._open(stored)
            if len(self._checked) >= _IDENTITIES:
                self._checked.clear()
            self._checked[stored] = found
        return found if found is not None and found[0].name == name else None

    def _open(self, stored: bytes) -> tuple[Identity, VerifyKey | None] | None:
        try:
            signed = json.loads(stored)
            record, signature = signed["record"], _decode_signature(signed["sig"])
            self._key.verify(signature, "identity", record)
            identity = Identity.model_validate_json(record)
            text = identity.result_key
            return identity, VerifyKey.from_text(text, "a result key") if text else None
        except (ValueError, TypeError, KeyError, UntrustedPayload, ConfigError):
            return None

    def worker_key(self, name: str | None, stored: bytes | None, now: datetime | None = None) -> WorkerKey:
        """The result key of the worker identity ``name`` (its record ``stored`` in the registry), if the
        record checks, names a worker and has not expired; else :class:`UntrustedPayload`."""
        if name is None:
            raise UntrustedPayload("no worker identity claimed the attempt")
        found = self._found(name, stored)
        if found is None:
            raise UntrustedPayload(
                f"worker identity {name!r} is not in the installation's registry (revoked?)"
            )
        identity, key = found
        if identity.expired(now or datetime.now(timezone.utc)):
            raise UntrustedPayload(
                f"worker identity {name!r} expired at {identity.expires:%Y-%m-%d %H:%M} UTC"
            )
        if identity.role != "worker" or key is None:
            raise UntrustedPayload(f"identity {name!r} is a {identity.role}'s, not a worker's")
        return WorkerKey(name, key)


@dataclasses.dataclass(frozen=True)
class ResultSigner:
    """A worker's own result key, and the identity it signs under."""

    identity: str
    key: SigningKey


# --- results -----------------------------------------------------------------------------------------
def sign_result(signer: ResultSigner, job_id: str, attempt: int, name: str, payload: bytes) -> bytes:
    """A function's result (or exception) as stored: signed for this job, attempt and file name, by
    this worker identity."""
    digest = hashlib.sha256(payload).digest()
    signature = signer.key.sign("result", job_id, attempt, name, digest, signer.identity)
    return _RESULT_MAGIC + signature + payload


def open_result(key: WorkerKey, job_id: str, attempt: int, name: str, blob: bytes) -> bytes:
    """The payload, if the worker identity ``key`` is signed ``blob`` as ``name`` of this job's
    ``attempt``; else :class:`UntrustedPayload` (and nothing of it is unpickled)."""
    head = len(_RESULT_MAGIC)
    if not blob.startswith(_RESULT_MAGIC) or len(blob) < head + _SIGNATURE_BYTES:
        raise UntrustedPayload(f"the job's {name} is not signed by a worker; not unpickled")
    signature, payload = blob[head : head + _SIGNATURE_BYTES], blob[head + _SIGNATURE_BYTES :]
    try:
        digest = hashlib.sha256(payload).digest()
        key.key.verify(signature, "result", job_id, attempt, name, digest, key.identity)
    except UntrustedPayload:
        raise UntrustedPayload(
            f"the job's {name} is not signed by the worker that ran this job and attempt "
            f"({key.identity}); not unpickled"
        ) from None
    return payload


# --- archives ----------------------------------------------------------------------------------------
def seal_archive(signer: ResultSigner, job_id: str, attempt: int, name: str, sha256: str) -> str:
    """What an archive a worker stores (outputs, a checkpoint) is kept with: its signature over the
    archive's SHA-256, for this job, attempt and file name, by this worker identity."""
    signature = signer.key.sign("archive", job_id, attempt, name, sha256, signer.identity)
    return json.dumps({"attempt": attempt, "identity": signer.identity, "sig": _encode_signature(signature)})


@dataclasses.dataclass(frozen=True)
class ArchiveSeal:
    """An archive's seal, read: the attempt and identity it names, and the signature."""

    attempt: int
    identity: str
    signature: bytes

    @classmethod
    def read(cls, text: str | None, name: str) -> ArchiveSeal:
        """:class:`UntrustedPayload` if there is none, or it cannot be read."""
        if not text:
            raise UntrustedPayload(f"the job's {name} is not signed by a worker")
        try:
            found = json.loads(text)
            attempt, identity = found["attempt"], found["identity"]
            if not isinstance(attempt, int) or not isinstance(identity, str):
                raise TypeError
            return cls(attempt, identity, _decode_signature(found["sig"]))
        except (ValueError, TypeError, KeyError):
            raise UntrustedPayload(f"the job's {name} has a garbled signature") from None

    def check(self, key: WorkerKey, job_id: str, name: str, sha256: str) -> None:
        """Nothing if ``key`` signed this archive of the job as ``name``; else :class:`UntrustedPayload`."""
        if key.identity != self.identity:
            raise self.refused(name)
        try:
            key.key.verify(self.signature, "archive", job_id, self.attempt, name, sha256, key.identity)
        except UntrustedPayload:
            raise self.refused(name) from None

    def refused(self, name: str) -> UntrustedPayload:
        return UntrustedPayload(
            f"the job's {name} is not signed by the worker that ran attempt {self.attempt}"
        )
