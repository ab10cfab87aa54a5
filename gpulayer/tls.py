"""TLS for an installation's Redis across machines: a CA of its own, and the certificate it signs for
the Redis server. Every access token carries the CA, and a connection trusts that CA alone, so a worker
talks to this installation's Redis or to nothing.

Kept in ``$GPULAYER_HOME/tls/``: ``ca.pem`` (public), ``ca.key`` and ``redis.key`` (600), and
``redis.pem``, made again whenever the addresses it must name change.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import socket
from collections.abc import Iterable
from pathlib import Path

import psutil
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from . import home as local

_CA_YEARS = 10
_CERT_DAYS = 825


@dataclasses.dataclass(frozen=True)
class ServerFiles:
    """What redis-server's ``tls-*`` settings name."""

    cert: Path
    key: Path
    ca: Path


def ensure(home: Path, names: Iterable[str]) -> ServerFiles:
    """The installation's CA (made once) and a Redis certificate that names each of ``names`` (host
    names or addresses), made again if it does not."""
    folder = local.private_folder(home / "tls")
    ca_key_path, ca_path = folder / "ca.key", folder / "ca.pem"
    if not ca_path.exists() or not ca_key_path.exists():
        key, cert = _new_ca()
        local.write_private(ca_key_path, _key_pem(key))
        local.write_private(ca_path, cert.public_bytes(serialization.Encoding.PEM))
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca_cert = x509.load_pem_x509_certificate(ca_path.read_bytes())
    files = ServerFiles(folder / "redis.pem", folder / "redis.key", ca_path)
    wanted = sorted({_normal(name) for name in names})
    if not files.cert.exists() or not files.key.exists() or _names(files.cert) != wanted:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _server_cert(key, ca_key, ca_cert, wanted)
        local.write_private(files.key, _key_pem(key))
        local.write_private(files.cert, cert.public_bytes(serialization.Encoding.PEM))
    return files


def ca_pem(home: Path) -> str:
    return (home / "tls" / "ca.pem").read_text()


def machine_names(bind: str) -> list[str]:
    """The names another machine may reach this one by when Redis listens on ``bind``: its host
    name, localhost, and its addresses (every one, for a wildcard bind)."""
    names = {socket.gethostname(), "localhost", "127.0.0.1", "::1"}
    if bind in ("0.0.0.0", "::"):
        for addresses in psutil.net_if_addrs().values():
            for address in addresses:
                if address.family in (socket.AF_INET, socket.AF_INET6):
                    names.add(address.address.split("%")[0])
    else:
        names.add(bind)
    return sorted(names)


def _new_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"GPUlayer CA ({socket.gethostname()})")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365 * _CA_YEARS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _server_cert(
    key: ec.EllipticCurvePrivateKey,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    names: list[str],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    alternatives: list[x509.GeneralName] = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "GPUlayer Redis")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _names(path: Path) -> list[str]:
    """The names a certificate on disk is for (empty if it cannot be read)."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        found = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return []
    addresses = [str(ip) for ip in found.get_values_for_type(x509.IPAddress)]
    return sorted(addresses + found.get_values_for_type(x509.DNSName))


def _normal(name: str) -> str:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
