"""Certificates for the local control plane and for webhook servers, made with cryptography.

kopf's own certificate helper (oscrypto) fails on OpenSSL 3, and the API server needs a CA,
a serving certificate, a service-account key pair and an admin client identity anyway.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    def write(self, cert_path: Path, key_path: Path) -> None:
        cert_path.write_bytes(self.cert_pem)
        key_path.write_bytes(self.key_pem)
        key_path.chmod(0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


class CertificateAuthority:
    """A throw-away CA that signs serving and client certificates."""

    def __init__(
        self, common_name: str = "cozystack-gpu-test-ca", *, _loaded: KeyPair | None = None
    ) -> None:
        if _loaded is not None:
            self._cert = x509.load_pem_x509_certificate(_loaded.cert_pem)
            key = serialization.load_pem_private_key(_loaded.key_pem, password=None)
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                raise ValueError("the CA key is not an elliptic-curve key")
            self._key = key
            self._name = self._cert.subject
            return
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self._name = _name(common_name)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
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
            .sign(self._key, hashes.SHA256())
        )

    @classmethod
    def load(cls, cert_path: Path, key_path: Path) -> CertificateAuthority:
        """The CA whose pair ``write`` left in these files: a later client of a running
        plane (the real node's kubelet) gets certificates the API server trusts."""
        return cls(_loaded=KeyPair(cert_path.read_bytes(), key_path.read_bytes()))

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def write(self, cert_path: Path, key_path: Path) -> None:
        """The certificate and the private key (mode 0600), for ``load``."""
        KeyPair(self.cert_pem, _key_pem(self._key)).write(cert_path, key_path)

    def issue(
        self,
        common_name: str,
        *,
        organization: str | None = None,
        dns_names: tuple[str, ...] = (),
        ip_addresses: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        alt_names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def service_account_keys() -> KeyPair:
    """An RSA key pair for signing service-account tokens (public key in cert_pem)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(public, _key_pem(key))
