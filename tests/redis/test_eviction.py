"""A Redis server that may evict held locks is reported: once per client and server, after the first grant there,
as a WARNING "evicting" event (subscribers and the `fencelock.redis` / `fencelock.redlock` loggers) that names the
server and its memory settings, never a secret. A server that will not evict (no `maxmemory`, or `noeviction`), or
that does not let the client read its memory settings, is not reported, and the locks work the same either way."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

import fencelock
from fencelock.testing.servers import RedisServer
from tests.conftest import BACKENDS, until

from ._support import eviction_checks

FRONTS = ["sync", "asyncio"]
LIMIT = 64 * 1024 * 1024
GRACE = 0.2
"""Seconds a client stays open after the server ran its check: far more than reading one reply takes."""


def _server(stack: ExitStack, *settings: str, name: str = "evict") -> RedisServer:
    """A Redis of the test's own that logs every command it runs (its slow log, from 0 µs)."""
    logged = ["--slowlog-log-slower-than", "0", "--slowlog-max-len", "10000"]
    return stack.enter_context(RedisServer(name=name, extra_args=[*logged, *settings]))


def _checks(server: RedisServer) -> int:
    with server.client() as raw:
        return eviction_checks(raw)


def _acquire_twice(front: str, target: str | list[str], names: list[str], checked: Callable[[], bool]) -> None:
    """One client grants and releases each of `names` in turn (sync, or asyncio in a loop of its own), then stays
    open until `checked()` says the servers ran the client's background check, and `GRACE` more for the client to
    read the answer (a test that expects no event would otherwise pass by closing first)."""
    if front == "sync":
        locks = fencelock.connect(target)
        try:
            for name in names:
                with locks.lock(name, ttl=10.0, wait=0):
                    pass
            until(checked, 5.0, "the eviction check")
            time.sleep(GRACE)
        finally:
            locks.close()
        return

    async def run() -> None:
        alocks = fencelock.aio.connect(target)
        try:
            for name in names:
                async with alocks.lock(name, ttl=10.0, wait=0):
                    pass
            for _ in range(500):  # the check is a task of this loop: it runs while this one sleeps
                if checked():
                    await asyncio.sleep(GRACE)
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("not within 5 s: the eviction check")
        finally:
            await alocks.aclose()

    asyncio.run(run())


@pytest.fixture
def events() -> Iterator[list[fencelock.LockEvent]]:
    seen: list[fencelock.LockEvent] = []
    unsubscribe = fencelock.subscribe(lambda event: seen.append(event) if event.kind == "evicting" else None)
    yield seen
    unsubscribe()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
@pytest.mark.parametrize("front", FRONTS)
def test_a_server_that_may_evict_held_locks_is_reported_once_per_client(
        front: str, policy: str, name: str, events: list[fencelock.LockEvent],
        caplog: pytest.LogCaptureFixture) -> None:
    """Every key fencelock writes has a TTL, so `volatile-*` evicts held locks as `allkeys-*` does: the first grant
    on such a server is followed by one WARNING event naming the lock, the server and the policy; a second grant
    by the same client asks again no more."""
    caplog.set_level(logging.WARNING, logger="fencelock")
    with ExitStack() as stack:
        server = _server(stack, "--maxmemory", str(LIMIT), "--maxmemory-policy", policy)
        _acquire_twice(front, server.url, [name, name + ":second"], lambda: bool(events))
        assert _checks(server) == 1
    [event] = events
    assert (event.kind, event.name, event.backend) == ("evicting", name, "redis")
    assert event.error is not None
    assert f"127.0.0.1:{server.port}" in event.error
    assert f"maxmemory {LIMIT} bytes, maxmemory-policy {policy}" in event.error
    assert "noeviction" in event.error
    [record] = [r for r in caplog.records if "evicting" in r.getMessage()]
    assert (record.name, record.levelno) == ("fencelock.redis", logging.WARNING)


@pytest.mark.parametrize("settings", [["--maxmemory", str(LIMIT), "--maxmemory-policy", "noeviction"],
                                      ["--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"]],
                         ids=["noeviction", "no-limit"])
@pytest.mark.parametrize("front", FRONTS)
def test_a_server_that_never_evicts_is_not_reported(front: str, settings: list[str], name: str,
                                                    events: list[fencelock.LockEvent]) -> None:
    """`noeviction` (full memory refuses writes: the acquire fails, nothing is granted twice), or no memory limit
    at all: the check runs and says nothing."""
    with ExitStack() as stack:
        server = _server(stack, *settings)
        _acquire_twice(front, server.url, [name], lambda: _checks(server) == 1)
    assert events == []


@pytest.mark.parametrize("front", FRONTS)
def test_a_user_not_allowed_info_gets_its_locks_and_no_report(front: str, name: str,
                                                              events: list[fencelock.LockEvent],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """An ACL user without INFO cannot be checked: its locks work as before, and nothing is reported or logged
    (no secret either, as the URL carries the user's password)."""
    caplog.set_level(logging.DEBUG, logger="fencelock")
    password = "s3cret-Evict-9"
    with ExitStack() as stack:
        server = _server(stack, "--maxmemory", str(LIMIT), "--maxmemory-policy", "allkeys-lru")
        with server.client() as raw:
            raw.execute_command("ACL", "SETUSER", "locker", "on", f">{password}", "~*", "&*", "+@all", "-info")
        url = f"redis://locker:{password}@127.0.0.1:{server.port}/0"
        _acquire_twice(front, url, [name, name + ":second"], lambda: _checks(server) == 1)
        with server.client() as raw:
            errors: Any = raw.info("errorstats")
        assert "errorstat_ERR" in errors  # (a script's refused command: "The user ... can't run this command")
    assert events == []
    assert password not in caplog.text


def test_redlock_reports_each_node_that_may_evict(name: str, events: list[fencelock.LockEvent]) -> None:
    """Redlock: each node is checked once after the first grant; only the node that may evict is named."""
    with ExitStack() as stack:
        safe = [_server(stack, name="evict-a"), _server(stack, name="evict-b")]
        evicting = _server(stack, "--maxmemory", str(LIMIT), "--maxmemory-policy", "volatile-lru", name="evict-c")
        nodes = [*safe, evicting]
        _acquire_twice("sync", [server.url for server in nodes], [name, name + ":second"],
                       lambda: all(_checks(server) == 1 for server in nodes) and bool(events))
    [event] = events
    assert (event.backend, event.name) == ("redlock", name)
    assert event.error is not None
    assert f"127.0.0.1:{evicting.port}" in event.error
    assert all(f":{server.port}" not in event.error for server in safe)


def test_a_cluster_reports_the_shard_that_holds_the_first_lock(events: list[fencelock.LockEvent]) -> None:
    """Redis Cluster: the check goes with the first grant's key, to the shard that holds that lock, once per
    client, sync and asyncio alike."""
    deployment: Any = BACKENDS["cluster"]()  # its own: the settings below are for no other test
    try:
        nodes = list(deployment.servers.nodes)
        for server in nodes:
            with server.client() as raw:
                raw.config_set("maxmemory", LIMIT)
                raw.config_set("maxmemory-policy", "allkeys-lfu")
                raw.config_set("slowlog-log-slower-than", 0)
        for front in FRONTS:
            target = deployment.target
            _acquire_twice(front, target, ["cluster:evict:a", "cluster:evict:b"],
                           lambda: len(events) == FRONTS.index(front) + 1)  # noqa: B023 - called at once
        assert sum(_checks(server) for server in nodes) == len(FRONTS)
    finally:
        deployment.close()
    assert [event.name for event in events] == ["cluster:evict:a"] * len(FRONTS)
    assert all(event.error is not None and "maxmemory-policy allkeys-lfu" in event.error for event in events)
