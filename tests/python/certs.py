"""Test certificates made with the `openssl` command, as README.md's Security section makes them:
a certificate authority, a broker certificate it signs (for 127.0.0.1 and localhost), client
certificates, and a second, untrusted authority with a client certificate of its own."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _key(name: str, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key", cwd=cwd)


def authority(name: str, cwd: Path) -> Path:
    """A self-signed certificate authority `name.pem` with its key `name.key`."""
    _key(name, cwd)
    _openssl("req", "-x509", "-new", "-key", f"{name}.key", "-out", f"{name}.pem", "-days", "30",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=cwd)
    return cwd / f"{name}.pem"


def signed(name: str, ca: str, cwd: Path, subject: str, extensions: str, days: int = 30) -> None:
    """`name.key` and `name.crt`, signed by the authority `ca`."""
    _key(name, cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", str(days), "-extfile", f"{name}.ext", cwd=cwd)


def expired(name: str, ca: str, cwd: Path, subject: str, extensions: str) -> None:
    """`name.key` and `name.crt`, signed by the authority `ca` but valid only in 2020
    (`openssl ca` sets the dates; `openssl x509` cannot set them in the past)."""
    _key(name, cwd)
    _openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    db = cwd / f"{name}-ca"
    db.mkdir(exist_ok=True)
    (db / "index.txt").write_text("")
    (db / "serial").write_text("1000\n")
    (db / "ca.cnf").write_text(
        "[ca]\ndefault_ca = test\n"
        f"[test]\ndatabase = {db}/index.txt\nnew_certs_dir = {db}\nserial = {db}/serial\n"
        "default_md = sha256\npolicy = any\n"
        "[any]\ncommonName = supplied\norganizationalUnitName = optional\n")
    _openssl("ca", "-batch", "-config", str(db / "ca.cnf"), "-cert", f"{ca}.pem", "-keyfile", f"{ca}.key",
             "-in", f"{name}.csr", "-out", f"{name}.crt", "-notext", "-startdate", "20200101000000Z",
             "-enddate", "20201231000000Z", "-extfile", f"{name}.ext", cwd=cwd)


@dataclass
class Certs:
    dir: Path
    ca: Path
    # The broker's PEM keystore: its private key and certificate in one file.
    broker_keystore: Path
    client_cert: Path
    client_key: Path
    rogue_ca: Path
    rogue_client_cert: Path
    rogue_client_key: Path

    def keystore(self, name: str, subject: str) -> Path:
        """Another broker keystore signed by the same authority, e.g. to replace the first."""
        signed(name, "ca", self.dir, subject, SERVER_EXTENSIONS)
        path = self.dir / f"{name}-keystore.pem"
        path.write_bytes((self.dir / f"{name}.key").read_bytes() + (self.dir / f"{name}.crt").read_bytes())
        return path


SERVER_EXTENSIONS = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
CLIENT_EXTENSIONS = "extendedKeyUsage=clientAuth\n"


def make(cwd: Path) -> Certs:
    cwd.mkdir(parents=True, exist_ok=True)
    authority("ca", cwd)
    authority("rogue-ca", cwd)
    certs = Certs(
        dir=cwd,
        ca=cwd / "ca.pem",
        broker_keystore=cwd / "broker-keystore.pem",
        client_cert=cwd / "client.crt",
        client_key=cwd / "client.key",
        rogue_ca=cwd / "rogue-ca.pem",
        rogue_client_cert=cwd / "rogue-client.crt",
        rogue_client_key=cwd / "rogue-client.key",
    )
    certs.broker_keystore = certs.keystore("broker", "/CN=broker-1")
    signed("client", "ca", cwd, "/CN=alice/OU=tests", CLIENT_EXTENSIONS)
    signed("rogue-client", "rogue-ca", cwd, "/CN=mallory", CLIENT_EXTENSIONS)
    return certs
