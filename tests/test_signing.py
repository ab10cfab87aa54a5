"""Signatures as stored: the keys and seals of an installation made before the move to libsodium
(keys and signatures made through OpenSSL) still sign and check the same."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from gpulayer import UntrustedPayload
from gpulayer.signing import Keyring, SigningKey, _message, check_job, seal_job


def _openssl_key() -> tuple[Ed25519PrivateKey, str]:
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return key, base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_a_key_made_through_openssl_signs_the_same_bytes_and_checks_its_signatures() -> None:
    openssl, text = _openssl_key()
    ours = SigningKey.from_text(text)
    signature = ours.sign("job", "abc", 1)
    openssl.public_key().verify(signature, _message("job", ("abc", 1)))  # raises if it differs
    assert signature == openssl.sign(_message("job", ("abc", 1)))
    ours.public.verify(signature, "job", "abc", 1)
    with pytest.raises(UntrustedPayload):
        ours.public.verify(signature, "job", "abc", 2)


def test_a_seal_from_an_earlier_keyring_text_is_checked_and_a_changed_spec_refused() -> None:
    _, text = _openssl_key()
    keys = Keyring.from_texts({"job_key": text})
    assert keys.job_key is not None
    seal = seal_job(keys.job_key, "job1", '{"command":["true"]}', {"source.tar": "ab" * 32})
    checker = keys.job_key.public
    assert check_job(checker, "job1", b'{"command":["true"]}', seal.encode()) == {"source.tar": "ab" * 32}
    with pytest.raises(UntrustedPayload, match="does not match"):
        check_job(checker, "job1", b'{"command":["false"]}', seal.encode())
