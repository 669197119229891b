"""Throwaway TLS material for the tests, made with openssl: a private CA and server
certificates it signs (the recipe of docs/coordinator.md, "TLS"). EC P-256 keys, valid two
days; files are `<name>.pem` (certificate) and `<name>.key` in the directory given."""
from __future__ import annotations

import subprocess
from pathlib import Path

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(d: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)


def make_ca(d: Path, name: str, cn: str) -> Path:
    """A self-signed CA: `<name>.pem`, `<name>.key`."""
    _openssl(d, "req", "-x509", *_EC, "-days", "2", "-subj", f"/CN={cn}", "-keyout", f"{name}.key", "-out", f"{name}.pem")
    return d / f"{name}.pem"


def make_cert(d: Path, name: str, cn: str, ca: str = "ca", san: str = "IP:127.0.0.1,DNS:localhost") -> Path:
    """A certificate for `san` signed by the CA `<ca>.pem`/`<ca>.key` in the same directory."""
    _openssl(d, "req", *_EC, "-subj", f"/CN={cn}", "-addext", f"subjectAltName={san}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr")
    _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-copy_extensions", "copy", "-out", f"{name}.pem")
    return d / f"{name}.pem"
