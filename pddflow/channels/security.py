"""TLS and bearer-token auth (compared in constant time) of the network channels."""

from __future__ import annotations

import hmac
import os
import pathlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

AUTH_HEADER = "authorization"


@dataclass(frozen=True)
class TLSConfig:
    """PEM paths: a server needs cert_chain + private_key, a client root_certs."""

    cert_chain: str | None = None
    private_key: str | None = None
    root_certs: str | None = None

    def server_pair(self) -> tuple[bytes, bytes]:
        if not (self.cert_chain and self.private_key):
            raise ValueError("TLS server needs cert_chain and private_key (PEM paths)")
        return _read(self.cert_chain), _read(self.private_key)

    def roots(self) -> bytes | None:
        return _read(self.root_certs) if self.root_certs else None

    def cert_chain_bytes(self) -> bytes:
        return self.server_pair()[0]

    def private_key_bytes(self) -> bytes:
        return self.server_pair()[1]


def _read(path: str) -> bytes:
    p = pathlib.Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"TLS file {path} does not exist")
    return p.read_bytes()


def bearer(token: str) -> str:
    return f"Bearer {token}"


def check_bearer(
    values: list[str] | tuple[str, ...] | None, token: str, channel: str
) -> str | None:
    """None when the header carries the expected token, else the refusal message."""
    if not values:
        return (
            f"{channel}: missing bearer token "
            "(this receiver requires `authorization: Bearer <token>`)"
        )
    for v in values:
        v = v.decode() if isinstance(v, bytes) else str(v)
        scheme, _, got = v.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(got.strip().encode(), token.encode()):
            return None
    return f"{channel}: wrong bearer token"


def self_signed(
    directory: str | pathlib.Path,
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
    days: int = 30,
) -> TLSConfig:
    """A throwaway certificate (its own root) for both ends on this machine, via openssl."""
    d = pathlib.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cert, key = d / "cert.pem", d / "key.pem"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
        "-days", str(days), "-subj", f"/CN={hosts[0]}", "-addext", f"subjectAltName={_san(hosts)}",
        missing="provide TLS cert_chain/private_key/root_certs PEM files",
    )  # fmt: skip
    return TLSConfig(cert_chain=str(cert), private_key=str(key), root_certs=str(cert))


# ---- a deployment's own certificate authority (the ray backend) -----------------------------
# Each node makes its private key where it runs and sends only a signing request; the deploying
# process signs it with a CA whose key never leaves it. Every end trusts the CA, so a restarted
# instance's new certificate is trusted without telling anyone.


def _openssl(
    *args: str,
    stdin: bytes | None = None,
    missing: str = "the ray backend's TLS needs it on every node",
) -> bytes:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(f"openssl CLI not found; {missing}")
    try:
        done = subprocess.run(
            [openssl, *args], input=stdin, check=True, capture_output=True, timeout=60
        )
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"openssl {args[0]} failed: {exc.stderr.decode().strip()}") from None
    return done.stdout


def _san(hosts: tuple[str, ...]) -> str:
    return ",".join(
        ("IP:" if h.replace(".", "").isdigit() or ":" in h else "DNS:") + h for h in hosts
    )


@dataclass(frozen=True)
class CertificateAuthority:
    cert: str  # PEM paths
    key: str

    @staticmethod
    def create(directory: str | pathlib.Path, days: int = 30) -> CertificateAuthority:
        d = pathlib.Path(directory)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        cert, key = d / "ca.pem", d / "ca-key.pem"
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
            "-out", str(cert), "-days", str(days), "-subj", "/CN=pddflow deployment CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        key.chmod(0o600)
        return CertificateAuthority(str(cert), str(key))

    def sign(self, csr_pem: bytes, hosts: tuple[str, ...], days: int = 30) -> bytes:
        """A certificate for the request's key, valid for `hosts` only: the names come from the
        signer, never from the request."""
        with tempfile.NamedTemporaryFile(
            "w", suffix=".cnf", dir=pathlib.Path(self.key).parent
        ) as ext:
            ext.write(
                f"subjectAltName={_san(hosts)}\nbasicConstraints=critical,CA:FALSE\n"
                "extendedKeyUsage=serverAuth,clientAuth\n"
            )
            ext.flush()
            serial = str(int.from_bytes(os.urandom(8), "big"))
            return _openssl(
                "x509", "-req", "-CA", self.cert, "-CAkey", self.key, "-set_serial", serial,
                "-days", str(days), "-extfile", ext.name,
                stdin=csr_pem,
            )  # fmt: skip


def key_and_request(directory: str | pathlib.Path, name: str) -> tuple[str, bytes]:
    """A private key made here (0600, never sent) and the signing request for it."""
    key = pathlib.Path(directory) / "key.pem"
    key.unlink(missing_ok=True)
    csr = _openssl(
        "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
        "-subj", "/CN=" + name.replace("/", "-"),
    )  # fmt: skip
    key.chmod(0o600)
    return str(key), csr
