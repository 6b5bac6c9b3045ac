"""Test certificates made with ``cryptography``: a CA, a server and client certificates."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    """A client certificate from another CA (must be refused)."""
    stranger_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
    node: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server or node:
        usages = [ExtendedKeyUsageOID.SERVER_AUTH]
        if node:  # a cluster node both accepts and dials replication links
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    elif not ca:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    if ca:
        builder = builder.add_extension(
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
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        key_path = path.with_suffix(".key")
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        key_path.chmod(0o600)


def make_certificates(directory: Path, client_cn: str = "alice") -> CertFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("tierlog test CA", ca_key, "tierlog test CA", ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _issue("localhost", server_key, "tierlog test CA", ca_key, server=True)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _issue(client_cn, client_key, "tierlog test CA", ca_key)
    other_ca_key = ec.generate_private_key(ec.SECP256R1())
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger = _issue(client_cn, stranger_key, "another CA", other_ca_key)
    _write(directory / "ca.pem", ca, None)
    _write(directory / "server.pem", server, server_key)
    _write(directory / "client.pem", client, client_key)
    _write(directory / "stranger.pem", stranger, stranger_key)
    return CertFiles(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        stranger_cert=directory / "stranger.pem",
        stranger_key=directory / "stranger.key",
    )


@dataclass(frozen=True)
class NodeCertFiles:
    ca: Path
    nodes: dict[str, tuple[Path, Path]]
    """Certificate and key of each node, for both sides of a link."""
    stranger: tuple[Path, Path]
    """A node certificate from another CA (its links must be refused)."""


def make_node_certificates(directory: Path, nodes: tuple[str, ...]) -> NodeCertFiles:
    """A cluster CA, one certificate per node (server and client use), and a stranger."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("tierlog cluster CA", ca_key, "tierlog cluster CA", ca_key, ca=True)
    _write(directory / "cluster-ca.pem", ca, None)
    files: dict[str, tuple[Path, Path]] = {}
    for node in nodes:
        key = ec.generate_private_key(ec.SECP256R1())
        _write(
            directory / f"{node}.pem",
            _issue(node, key, "tierlog cluster CA", ca_key, node=True),
            key,
        )
        files[node] = (directory / f"{node}.pem", directory / f"{node}.key")
    other_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    _write(directory / "stranger.pem", _issue("n9", key, "another CA", other_key, node=True), key)
    return NodeCertFiles(
        directory / "cluster-ca.pem",
        files,
        (directory / "stranger.pem", directory / "stranger.key"),
    )
