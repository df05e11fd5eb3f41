"""`unix:///path/redis.sock?db=N`, as the README documents it, on a real Redis listening on a unix socket: the
synchronous API, asyncio and the CLI all reach it, and on the database the URL names."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator

import pytest
import redis

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisServer
from tests.conftest import _require_server_binary


@pytest.fixture(scope="module")
def socket_server() -> Iterator[tuple[RedisServer, str]]:
    _require_server_binary()
    where = tempfile.mkdtemp(prefix="fencelock-unix-")
    path = os.path.join(where, "redis.sock")
    with RedisServer(name="unix", extra_args=["--unixsocket", path, "--unixsocketperm", "700"]) as server:
        yield server, path


def _held_in_db(server: RedisServer, db: int, name: str) -> bool:
    raw = redis.Redis(host=server.host, port=server.port, db=db)
    try:
        return bool(raw.exists(redis_keys(name).lock))
    finally:
        raw.close()


def test_sync_client_locks_over_a_unix_socket(socket_server: tuple[RedisServer, str]) -> None:
    server, path = socket_server
    name = f"unix:{uuid.uuid4().hex[:8]}"
    with fencelock.connect(f"unix://{path}?db=3") as locks, locks.lock(name) as lease:
        assert lease.held
        assert _held_in_db(server, 3, name)
        assert not _held_in_db(server, 0, name)
    assert not _held_in_db(server, 3, name)


def test_asyncio_client_locks_over_a_unix_socket(socket_server: tuple[RedisServer, str]) -> None:
    server, path = socket_server
    name = f"unix:{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with fencelock.aio.connect(f"unix://{path}?db=4") as locks, locks.lock(name) as lease:
            assert lease.held
            assert _held_in_db(server, 4, name)
            assert not _held_in_db(server, 0, name)

    asyncio.run(main())
    assert not _held_in_db(server, 4, name)


def test_cli_runs_and_shows_a_lock_over_a_unix_socket(socket_server: tuple[RedisServer, str]) -> None:
    server, path = socket_server
    name = f"unix:{uuid.uuid4().hex[:8]}"
    url = f"unix://{path}?db=5"
    probe = (f"import redis,sys; r=redis.Redis(host='127.0.0.1', port={server.port}, db=5); "
             f"sys.exit(0 if r.exists({redis_keys(name).lock!r}) else 9)")
    ran = subprocess.run([sys.executable, "-m", "fencelock", "run", "--url", url, name, "--",
                          sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr   # the command ran while the key was in db 5
    shown = subprocess.run([sys.executable, "-m", "fencelock", "status", "--url", url, name],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert f"{name}: free" in shown.stdout
