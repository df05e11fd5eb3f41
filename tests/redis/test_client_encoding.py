"""A redis-py client passed in with another `encoding` (latin-1, ascii) or `decode_responses=True` locks the same
keys as a URL client: fencelock sends its keys and arguments as UTF-8 itself, and reads keys back as bytes.

Checked on a single Redis and a Redis Cluster, with both front ends, by a client made from the URL and by a plain
redis-py client that reads the server's keys.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock._sync._cluster import _ClosingRedisCluster
from fencelock.testing.servers import RedisClusterServers, RedisServer

NAMES = ["é", "😀"]
SETTINGS = [{"encoding": "latin-1"}, {"encoding": "latin-1", "decode_responses": True},
            {"encoding": "ascii", "encoding_errors": "strict"}]
STRAY = b"fencelock:{\xe9\xff}:lock"  # under our prefix, not UTF-8: fencelock never writes such a key


def _target(kind: str, front: str, port: int, settings: dict[str, Any]) -> Any:
    made: Any
    if kind == "redis":
        made = redis.Redis if front == "sync" else redis.asyncio.Redis
    else:
        # (the sync one closes its nodes' connections too: `_sync/_cluster.py`)
        made = _ClosingRedisCluster if front == "sync" else redis.asyncio.RedisCluster
    return made(host="127.0.0.1", port=port, socket_timeout=2, **settings)


@pytest.fixture(params=["redis", "cluster"])
def servers(request: pytest.FixtureRequest, standalone: RedisServer,
            cluster: RedisClusterServers) -> tuple[str, int, str, Any]:
    """(kind, port to pass to redis-py, URL, an independent raw client)."""
    if request.param == "redis":
        return "redis", standalone.port, standalone.url, standalone.client()
    return "cluster", cluster.nodes[0].port, cluster.url, cluster.client()


def _utf8_key(name: str) -> bytes:
    return redis_keys(name).lock.encode("utf-8")


@pytest.mark.parametrize("settings", SETTINGS, ids=["latin-1", "latin-1-decoded", "ascii"])
@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_client_with_another_encoding_locks_the_same_keys_as_a_url_client(
        servers: tuple[str, int, str, Any], front: str, settings: dict[str, Any], name: str) -> None:
    kind, port, url, raw = servers
    raw.script_flush()  # the scripts' first sending is then EVAL of their source, as the client encodes it
    names = [f"{name}:{suffix}" for suffix in NAMES]
    for stray in names:
        raw.delete(_utf8_key(stray))
    seen: dict[str, Any] = {}

    def check_on_server(lease_names: list[str]) -> None:
        for lock_name in lease_names:
            assert raw.exists(_utf8_key(lock_name)) == 1, f"no UTF-8 key for {lock_name!r}"
        with fencelock.connect(url) as other:
            for lock_name in lease_names:
                with pytest.raises(fencelock.NotAcquired):
                    other.acquire(lock_name, ttl=1.0, wait=0)

    if front == "sync":
        target = _target(kind, front, port, settings)
        with target, fencelock.connect(target) as locks:
            leases = [locks.acquire(n, ttl=0.4, wait=0, renew=True) for n in names]
            check_on_server(names)
            time.sleep(0.6)  # past the TTL: only renewals (extend_many) kept them
            assert all(lease.held for lease in leases)
            assert all(raw.pttl(_utf8_key(n)) > 0 for n in names)
            seen["list"] = [s.name for s in locks.list() if s.name.startswith(name)]
            seen["status"] = [locks.status(n).held for n in names]
            for lease in leases:
                lease.release()
    else:
        async def main() -> None:
            target = _target(kind, front, port, settings)
            async with target, fencelock.aio.connect(target) as locks:
                leases = [await locks.acquire(n, ttl=0.4, wait=0, renew=True) for n in names]
                await asyncio.to_thread(check_on_server, names)
                await asyncio.sleep(0.6)
                assert all(lease.held for lease in leases)
                assert all(raw.pttl(_utf8_key(n)) > 0 for n in names)
                seen["list"] = [s.name for s in await locks.list() if s.name.startswith(name)]
                seen["status"] = [(await locks.status(n)).held for n in names]
                for lease in leases:
                    await lease.release()

        asyncio.run(main())
    assert seen["list"] == sorted(names)
    assert seen["status"] == [True, True]
    assert all(raw.exists(_utf8_key(n)) == 0 for n in names)


@pytest.mark.parametrize("settings", [{}, {"decode_responses": True}, {"encoding": "latin-1"}],
                         ids=["bytes", "utf-8-decoded", "latin-1"])
@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_list_skips_a_key_that_is_not_utf8_and_never_raises_a_decode_error(
        servers: tuple[str, int, str, Any], front: str, settings: dict[str, Any], name: str) -> None:
    kind, port, _, raw = servers
    raw.set(STRAY, b"x", px=5000)
    try:
        if front == "sync":
            target = _target(kind, front, port, settings)
            with target, fencelock.connect(target) as locks:
                lease = locks.acquire(f"{name}:ours", ttl=5.0, wait=0)
                listed = [s.name for s in locks.list()]
                lease.release()
        else:
            async def main() -> list[str]:
                target = _target(kind, front, port, settings)
                async with target, fencelock.aio.connect(target) as locks:
                    lease = await locks.acquire(f"{name}:ours", ttl=5.0, wait=0)
                    found = [s.name for s in await locks.list()]
                    await lease.release()
                    return found

            listed = asyncio.run(main())
    finally:
        raw.delete(STRAY)
    assert f"{name}:ours" in listed
    assert not any("\ufffd" in n or "\udce9" in n for n in listed)
