"""TLS and bearer-token auth (compared in constant time) of the network channels."""

from __future__ import annotations

import hmac
import pathlib
import shutil
import subprocess
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
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(
            "openssl CLI not found; provide TLS cert_chain/private_key/root_certs PEM files"
        )
    d = pathlib.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cert, key = d / "cert.pem", d / "key.pem"
    san = ",".join(
        ("IP:" if h.replace(".", "").isdigit() or ":" in h else "DNS:") + h for h in hosts
    )
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            str(days),
            "-subj",
            f"/CN={hosts[0]}",
            "-addext",
            f"subjectAltName={san}",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return TLSConfig(cert_chain=str(cert), private_key=str(key), root_certs=str(cert))
