"""The arrival endpoint's own CA and serving certificate, made and renewed by pure functions:
`renew` reads what a Secret holds and the time, and answers what it must hold instead (or
None: nothing to change). The Secret's reading and writing is `controller.servingsecret`'s."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_CERT",
    "CA_DAYS",
    "CA_KEY",
    "DEFAULT_LIFETIMES",
    "RENEW_AT",
    "SERVING_DAYS",
    "TLS_CERT",
    "TLS_KEY",
    "Lifetimes",
    "due",
    "make_ca",
    "make_serving",
    "renew",
    "service_names",
]

# The keys of the Secret, as cert-manager names them (a `kubernetes.io/tls` Secret plus
# `ca.crt`), and `ca.key`, which cert-manager keeps in its issuer's Secret instead.
TLS_CERT, TLS_KEY, CA_CERT, CA_KEY = "tls.crt", "tls.key", "ca.crt", "ca.key"

CA_DAYS = 3650
"""The CA's life. Pods carry it from their creation (the pod builder puts it in their
environment), so it must outlive any pod: ten years, renewed after two thirds of it."""
SERVING_DAYS = 90
"""The serving certificate's life (as cert-manager's default); only the controller holds it."""
RENEW_AT = 2 / 3
"""A certificate is renewed once this share of its life has passed (cert-manager's default)."""
_BACKDATE = datetime.timedelta(minutes=5)
"""notBefore this far back: a node whose clock is a little behind still accepts the cert."""


@dataclass(frozen=True)
class Lifetimes:
    ca_days: float = CA_DAYS
    serving_days: float = SERVING_DAYS
    renew_at: float = RENEW_AT


DEFAULT_LIFETIMES = Lifetimes()


def service_names(host: str) -> list[str]:
    """The DNS names a serving certificate for `host` carries: `host` itself, and for a
    Service's `<name>.<namespace>.svc` the short forms and `.cluster.local`."""
    names = [host]
    parts = host.split(".")
    if len(parts) == 3 and parts[2] == "svc":
        names += [parts[0], ".".join(parts[:2]), f"{host}.cluster.local"]
    return names


def _key() -> ec.EllipticCurvePrivateKey:
    # P-256: a handshake costs the server a fraction of an RSA-2048 one, and the PEM is small
    # enough to ride in every worker pod's environment.
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _builder(
    subject: str, issuer: x509.Name | None, key: ec.EllipticCurvePrivateKey, now: datetime.datetime
) -> x509.CertificateBuilder:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
    )


def make_ca(now: datetime.datetime, days: float = CA_DAYS) -> tuple[bytes, bytes]:
    """A self-signed CA: (certificate PEM, key PEM)."""
    key = _key()
    cert = (
        _builder("gangjob-arrivals-ca", None, key, now)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def make_serving(
    ca_cert: bytes,
    ca_key: bytes,
    names: Iterable[str],
    now: datetime.datetime,
    days: float = SERVING_DAYS,
) -> tuple[bytes, bytes]:
    """A server certificate for `names` signed by the CA: (certificate PEM, key PEM)."""
    ca = x509.load_pem_x509_certificate(ca_cert)
    signer = serialization.load_pem_private_key(ca_key, password=None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    names = list(names)
    key = _key()
    cert = (
        _builder(names[0], ca.subject, key, now)
        .not_valid_after(min(now + datetime.timedelta(days=days), ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
        )
        .sign(signer, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def due(cert: x509.Certificate, now: datetime.datetime, renew_at: float = RENEW_AT) -> bool:
    """Whether `cert` has lived `renew_at` of its life (or has not begun it)."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now < start or now >= start + (end - start) * renew_at


def _certs(pem: bytes | None) -> list[x509.Certificate]:
    if not pem:
        return []
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _key_matches(cert: x509.Certificate, key_pem: bytes | None) -> bool:
    if not key_pem:
        return False
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return False
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    return bool(key.public_key().public_bytes(der, pub) == cert.public_key().public_bytes(der, pub))


def _general_name(name: str) -> x509.GeneralName:
    """An address as an IP SAN (which TLS clients match an IP URL against), else a DNS one."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _names(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    ips = [str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)]
    return [*san.value.get_values_for_type(x509.DNSName), *ips]


def renew(
    held: Mapping[str, bytes] | None,
    names: Iterable[str],
    now: datetime.datetime,
    lifetimes: Lifetimes = DEFAULT_LIFETIMES,
) -> dict[str, bytes] | None:
    """What the Secret must hold instead of `held` (its data, decoded; None: no Secret), or None
    if `held` serves as it is.

    The CA is kept while it has its key and is not `due`; a new one is made otherwise (a pod
    made before that trusts only the old CA, and arrives by annotation). The serving certificate
    is made again when it is missing, does not match its key, is not the CA's, does not name
    `names`, or is `due`."""
    held = held or {}
    names = list(names)
    held_ca = _certs(held.get(CA_CERT))
    ca_pem, ca_key = held.get(CA_CERT), held.get(CA_KEY)
    ca = held_ca[0] if len(held_ca) == 1 else None
    new_ca = (
        ca is None
        or not _is_ca(ca)
        or not _key_matches(ca, ca_key)
        or due(ca, now, lifetimes.renew_at)
    )
    if new_ca:
        ca_pem, ca_key = make_ca(now, lifetimes.ca_days)
        ca = x509.load_pem_x509_certificate(ca_pem)
    assert ca is not None
    assert ca_pem is not None
    assert ca_key is not None
    serving = _certs(held.get(TLS_CERT))
    cert = serving[0] if serving else None
    fresh = (
        not new_ca
        and cert is not None
        and _key_matches(cert, held.get(TLS_KEY))
        and _signed_by(cert, ca)
        and sorted(_names(cert)) == sorted(names)
        and not due(cert, now, lifetimes.renew_at)
    )
    if fresh:
        return None
    tls_cert, tls_key = make_serving(ca_pem, ca_key, names, now, lifetimes.serving_days)
    return {CA_CERT: ca_pem, CA_KEY: ca_key, TLS_CERT: tls_cert, TLS_KEY: tls_key}


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False
