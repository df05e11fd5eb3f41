"""A server that refuses BLPOP (an ACL user without it; a renamed command, a proxy that does not block, alike)
makes a waiter raise `BackendError` naming the lock, with the server's message, at its first wait. Before, the
BLPOP's error was dropped and the waiter tried again at once, for the whole wait: tens of thousands of acquire
scripts in 2 s. Decision 2026-12-04-wait-refused.

Single Redis and Redis Cluster, both front ends; the servers' command statistics count the acquire scripts sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock.testing.servers import RedisClusterServers, RedisServer

USER, PASSWORD = "noblpop", "pw-noblpop"


@pytest.fixture(params=["redis", "cluster"])
def refusing(request: pytest.FixtureRequest, standalone: RedisServer,
             cluster: RedisClusterServers) -> Iterator[tuple[str, str, list[Any]]]:
    """(a URL for everyone, a URL for a user without BLPOP, the servers' admin clients)."""
    if request.param == "redis":
        servers, url = [standalone], standalone.url
        refused = f"redis://{USER}:{PASSWORD}@127.0.0.1:{standalone.port}/0"
    else:
        servers, url = list(cluster.nodes), cluster.url
        refused = f"redis+cluster://{USER}:{PASSWORD}@127.0.0.1:{cluster.nodes[0].port}"
    admins: list[Any] = [server.client() for server in servers]
    for admin in admins:
        admin.execute_command("ACL", "SETUSER", USER, "reset", "on", f">{PASSWORD}", "~*", "&*", "+@all", "-blpop")
    yield url, refused, admins
    for admin in admins:
        admin.execute_command("ACL", "DELUSER", USER)


def _scripts_run(admins: list[Any]) -> int:
    return sum(int(admin.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)) for admin in admins)


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_refused_wait_is_a_backend_error_naming_the_lock_not_a_spin(refusing: tuple[str, str, list[Any]],
                                                                      name: str, front: str, fair: bool) -> None:
    url, refused, admins = refusing
    with fencelock.connect(url) as holder:
        lease = holder.acquire(name, ttl=30.0, wait=0)
        before = _scripts_run(admins)
        if front == "sync":
            with fencelock.connect(refused) as locks, pytest.raises(fencelock.BackendError) as caught:
                locks.acquire(name, ttl=5.0, wait=1.5, fair=fair)
        else:
            async def main() -> None:
                async with fencelock.aio.connect(refused) as locks:
                    await locks.acquire(name, ttl=5.0, wait=1.5, fair=fair)

            with pytest.raises(fencelock.BackendError) as caught:
                asyncio.run(main())
        sent = _scripts_run(admins) - before
        lease.release()
    assert caught.value.name == name
    assert "BLPOP" in str(caught.value)
    assert "no permissions" in str(caught.value)  # the server's own message
    assert not isinstance(caught.value, fencelock.NotAcquired)
    assert sent <= 10, f"{sent} scripts sent while waiting on a server that refuses BLPOP"


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_free_lock_is_still_granted_to_a_user_without_blpop(refusing: tuple[str, str, list[Any]], name: str,
                                                              front: str) -> None:
    """Only waiting needs BLPOP: a free lock is granted, with or without a wait."""
    _, refused, _ = refusing
    if front == "sync":
        with fencelock.connect(refused) as locks:
            locks.acquire(name, ttl=5.0, wait=1.0).release()
            locks.acquire(name, ttl=5.0, wait=0).release()
    else:
        async def main() -> None:
            async with fencelock.aio.connect(refused) as locks:
                await (await locks.acquire(name, ttl=5.0, wait=1.0)).release()
                await (await locks.acquire(name, ttl=5.0, wait=0)).release()

        asyncio.run(main())
