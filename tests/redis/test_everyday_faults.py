"""Everyday faults on real servers: connections the server closed while idle, an acquire retried after its reply
was lost, and Redlock nodes stalled under load. Each test states the invariant it checks, and checks it with an
independent client that reads the servers behind fencelock's back."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock.testing import ClusterDeployment, RedisDeployment, RedlockDeployment
from fencelock.testing.faults import CLOSE, FaultProxy, Rule
from fencelock.testing.servers import RedisServer
from fencelock.testing.timing import slack
from tests.conftest import RedisFamily, _require_server_binary, until

KINDS = ["redis", "cluster", "redlock"]


def _start(kind: str) -> RedisFamily:
    _require_server_binary()
    if kind == "redis":
        return RedisDeployment.start()
    if kind == "cluster":
        return ClusterDeployment.start(3)
    return RedlockDeployment.start(5)


def _servers(deployment: RedisFamily) -> list[RedisServer]:
    servers: Any = deployment.servers
    return [servers] if isinstance(servers, RedisServer) else list(servers.nodes)


@pytest.fixture(scope="module", params=KINDS)
def idle_deployment(request: pytest.FixtureRequest) -> Iterator[RedisFamily]:
    """A deployment of this module's own: its tests close every client connection on the servers."""
    deployment = _start(request.param)
    try:
        yield deployment
    finally:
        deployment.close()


def _close_idle_connections(deployment: RedisFamily) -> None:
    """What a server's idle timeout, a load balancer or a restart does to a connection nobody is using: the server
    closes it. (`CLIENT KILL TYPE normal` closes them the way `timeout` does, without waiting a second for it.)"""
    for server in _servers(deployment):
        with server.client() as raw:
            raw.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


def _holder(deployment: RedisFamily, name: str) -> list[str | None]:
    """The token in `name`'s lock key on each server that could hold it (every node on Redlock)."""
    key = redis_keys(name).lock
    values = [raw.get(key) for raw in deployment.raws()]
    return [None if v is None else bytes(v).decode() for v in values]


# -- 1. a connection the server closed while idle is not a failure ------------------------------------------------

def test_requests_after_the_server_closed_idle_connections_succeed_sync(idle_deployment: RedisFamily,
                                                                        name: str) -> None:
    """Invariant: a server that closed fencelock's idle connections is healthy, so release, extend and status
    succeed on it (reconnecting), and each has the effect the server confirms; no BackendError."""
    locks = idle_deployment.connect()
    try:
        lease = locks.acquire(name, ttl=30.0, wait=0)
        _close_idle_connections(idle_deployment)
        lease.extend(20.0)
        _assert_majority(idle_deployment, lambda: [0 < ttl <= 20_000 for ttl in _pttls(idle_deployment, name)])
        _close_idle_connections(idle_deployment)
        status = locks.status(name)
        assert status.held
        assert status.fence == lease.fence
        _close_idle_connections(idle_deployment)
        lease.release()
        _assert_majority(idle_deployment, lambda: [v is None for v in _holder(idle_deployment, name)])
        _close_idle_connections(idle_deployment)
        again = locks.acquire(name, ttl=5.0, wait=0)  # and the client works on, not rebuilt
        again.release()
    finally:
        locks.close()


def test_requests_after_the_server_closed_idle_connections_succeed_asyncio(idle_deployment: RedisFamily,
                                                                           name: str) -> None:
    """As above, with asyncio."""

    async def main() -> None:
        locks = idle_deployment.aconnect()
        try:
            lease = await locks.acquire(name, ttl=30.0, wait=0)
            _close_idle_connections(idle_deployment)
            await asyncio.sleep(0.05)  # the loop sees the connections close (or not: both must work)
            await lease.extend(20.0)
            await _assert_majority_async(
                idle_deployment, lambda: [0 < ttl <= 20_000 for ttl in _pttls(idle_deployment, name)])
            _close_idle_connections(idle_deployment)
            status = await locks.status(name)
            assert status.held
            assert status.fence == lease.fence
            _close_idle_connections(idle_deployment)
            await lease.release()
            await _assert_majority_async(idle_deployment, lambda: [v is None for v in _holder(idle_deployment, name)])
            _close_idle_connections(idle_deployment)
            again = await locks.acquire(name, ttl=5.0, wait=0)
            await again.release()
        finally:
            await locks.aclose()

    asyncio.run(main())


def _assert_majority(deployment: RedisFamily, check: Any) -> None:
    """`check()` holds on a majority of the servers now (Redlock decides at a quorum; the other nodes' requests
    finish in the background), and on all of them soon after."""
    found = check()
    assert sum(found) > len(found) // 2, found
    until(lambda: all(check()), 5.0, "every node to agree")


async def _assert_majority_async(deployment: RedisFamily, check: Any) -> None:
    """`_assert_majority` from a coroutine: the loop runs on meanwhile (the other nodes' requests are its tasks)."""
    found = check()
    assert sum(found) > len(found) // 2, found
    deadline = time.monotonic() + 5.0
    while not all(check()):
        assert time.monotonic() < deadline, ("every node to agree", check())
        await asyncio.sleep(0.01)


def _pttls(deployment: RedisFamily, name: str) -> list[int]:
    key = redis_keys(name).lock
    return [int(raw.pttl(key)) for raw in deployment.raws()]


def test_a_server_idle_timeout_does_not_fail_the_next_request(own_server: RedisServer, name: str) -> None:
    """The same with the server's own `timeout 1` (the reported case): after two idle seconds, release, extend
    and status on the dedicated connections succeed, sync and asyncio."""
    own_server.client().config_set("timeout", 1)
    locks = fencelock.connect(own_server.url)

    async def asyncio_side(lease_name: str) -> None:
        alocks = fencelock.aio.connect(own_server.url)
        try:
            lease = await alocks.acquire(lease_name, ttl=30.0, wait=0)
            await asyncio.sleep(2.5)
            await lease.extend()
            await asyncio.sleep(2.5)
            assert (await alocks.status(lease_name)).held
            await asyncio.sleep(2.5)
            await lease.release()
        finally:
            await alocks.aclose()

    try:
        lease = locks.acquire(name, ttl=30.0, wait=0)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(asyncio_side(name + ":aio"))
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(2.5)
        lease.extend()
        time.sleep(2.5)
        assert locks.status(name).held
        time.sleep(2.5)
        lease.release()
        thread.join(30)
        assert not errors, errors
        raw = own_server.client()
        assert raw.exists(redis_keys(name).lock, redis_keys(name + ":aio").lock) == 0
    finally:
        locks.close()


@pytest.mark.parametrize("api", ["sync", "asyncio"])
@pytest.mark.parametrize("request_name", ["acquire", "extend", "release", "status"])
def test_a_connection_the_server_closed_during_its_handshake_is_not_a_failure(own_server: RedisServer, name: str,
                                                                            api: str, request_name: str) -> None:
    """Invariant: a new dedicated connection that the server closes while it is being set up (its handshake, before
    the request was written) is not a failure: the request never reached the server, so it goes on another new
    connection and has its effect. (Seen when a server's idle sweep met a Redlock node's background request.)"""
    proxy = FaultProxy("127.0.0.1", own_server.port, name="handshake").start()
    url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5"
    raw = own_server.client()
    key = redis_keys(name).lock

    def arm() -> Rule:  # the next connection's first CLIENT command (its handshake) meets a closed connection
        return proxy.arm(Rule(CLOSE, "client"))

    try:
        if api == "sync":
            with fencelock.connect(url) as locks:
                rule = arm() if request_name == "acquire" else None
                lease = locks.acquire(name, ttl=10.0, wait=0)
                if request_name != "acquire":
                    proxy.reset_all()  # the next request needs a new connection
                    rule = arm()
                if request_name == "extend":
                    lease.extend(20.0)
                    assert 10_000 < raw.pttl(key) <= 20_000
                elif request_name == "status":
                    assert locks.status(name).fence == lease.fence
                elif request_name == "release":
                    lease.release()
                    assert raw.exists(key) == 0
                assert rule is not None
                assert rule.hit.is_set()
                if request_name == "acquire":
                    assert raw.get(key) is not None
        else:
            async def main() -> None:
                async with fencelock.aio.connect(url) as locks:
                    rule = arm() if request_name == "acquire" else None
                    lease = await locks.acquire(name, ttl=10.0, wait=0)
                    if request_name != "acquire":
                        proxy.reset_all()
                        await asyncio.sleep(0.05)  # the loop sees its connections end
                        rule = arm()
                    if request_name == "extend":
                        await lease.extend(20.0)
                        assert 10_000 < raw.pttl(key) <= 20_000
                    elif request_name == "status":
                        assert (await locks.status(name)).fence == lease.fence
                    elif request_name == "release":
                        await lease.release()
                        assert raw.exists(key) == 0
                    assert rule is not None
                    assert rule.hit.is_set()
                    if request_name == "acquire":
                        assert raw.get(key) is not None

            asyncio.run(main())
    finally:
        proxy.close()
        raw.close()


# -- 3. an acquire retried after its reply was lost claims no more validity than the server keeps -----------------

def _acquire_paths(kind: str) -> list[bool]:
    return [False] if kind == "redlock" else [False, True]


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_the_same_tokens_acquire_again_resets_the_ttl(idle_deployment: RedisFamily, name: str, fair: bool) -> None:
    """Invariant: an acquire sent again with its token (a retry after a lost reply) that finds its own grant
    leaves the key with a full TTL from then: the lease counts its validity from the retry."""
    locks = idle_deployment.connect()
    try:
        if fair not in _acquire_paths(idle_deployment.kind):  # no fair path to check: it is refused
            with pytest.raises(ValueError, match="fair=True"):
                locks.acquire(name, fair=True)
            return
        backend: Any = locks.backend
        token = "0123456789abcdef" * 2
        first = backend.try_acquire(name, token, 3000, 0.0, fair)
        time.sleep(1.0)
        again = backend.try_acquire(name, token, 3000, 0.0, fair)
        assert first.granted
        assert again.granted
        assert again.fence >= first.fence  # (Redlock moves its fence up to the new round)
        pttls = _pttls(idle_deployment, name)
        assert sum(1 for ttl in pttls if ttl > 2500) > len(pttls) // 2, pttls  # reset, not 2 s left
    finally:
        locks.close()


class _LoseFirstReply:
    """A proxy that drops the server's reply to the first request naming `marker`, and `hold` seconds later resets
    the client's connection: the request ran on the server, its client learns nothing but a reset."""

    def __init__(self, port: int, marker: bytes, hold: float) -> None:
        self.port_to, self.marker, self.hold = port, marker, hold
        self.armed = True
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.port_to))
            drop = threading.Event()
            threading.Thread(target=self._up, args=(client, server, drop), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, drop), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, drop: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self.armed and self.marker in data:
                    self.armed = False
                    drop.set()
                server.sendall(data)

    def _down(self, server: socket.socket, client: socket.socket, drop: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if drop.is_set():
                    time.sleep(self.hold)
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.shutdown(socket.SHUT_RDWR)  # (wakes the other thread's recv)
                    client.close()  # a reset
                    server.close()
                    return
                client.sendall(data)

    def close(self) -> None:
        self.listener.close()


def _claims_no_more_than_the_server(lease: Any, raw: Any, name: str) -> None:
    """remaining() now is at most what the server keeps: read the lease first, the server after."""
    t1 = time.monotonic()
    remaining = lease.remaining()
    pttl = int(raw.pttl(redis_keys(name).lock)) / 1000.0
    t2 = time.monotonic()
    assert remaining <= pttl + (t2 - t1) + 0.01, (remaining, pttl)


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_an_acquire_retried_after_a_lost_reply_claims_no_more_than_the_server_keeps(
        own_server: RedisServer, name: str, fair: bool, api: str) -> None:
    """Invariant: remaining() never exceeds the key's PTTL, also for a lease granted by a retry whose first
    request ran on the server (its reply lost, the connection reset a second later)."""
    with fencelock.connect(own_server.url) as warm:  # the scripts cached: the request dropped is the script's own
        warm.acquire(f"warm-up:{fair}", ttl=1.0, wait=0, fair=fair).release()
    proxy = _LoseFirstReply(own_server.port, name.encode(), hold=1.0)
    url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5"
    raw = own_server.client()
    try:
        if api == "sync":
            locks = fencelock.connect(url)
            lease = locks.acquire(name, ttl=3.0, wait=0, fair=fair)
            _claims_no_more_than_the_server(lease, raw, name)
            lease.release()
            locks.close()
        else:
            async def main() -> None:
                alocks = fencelock.aio.connect(url)
                lease = await alocks.acquire(name, ttl=3.0, wait=0, fair=fair)
                _claims_no_more_than_the_server(lease, raw, name)
                await lease.release()
                await alocks.aclose()

            asyncio.run(main())
        assert not proxy.armed  # the fault did happen
    finally:
        proxy.close()


# -- 4. sync Redlock: two stalled nodes of five never starve the requests to the three healthy ones ---------------

@pytest.fixture
def stalled_redlock() -> Iterator[RedlockDeployment]:
    """Five Redlock nodes of this test's own, the first two of them SIGSTOPped."""
    _require_server_binary()
    deployment = RedlockDeployment.start(5)
    stalled = deployment.nodes.nodes[:2]
    try:
        for node in stalled:
            node.pause()
        yield deployment
    finally:
        for node in stalled:
            node.resume()
        deployment.close()


def test_sync_redlock_with_two_stalled_nodes_loses_no_renewed_lease(stalled_redlock: RedlockDeployment,
                                                                     name: str) -> None:
    """Invariant: while a quorum (three of five) is healthy, no renewed lease is lost and every acquire is granted,
    however many requests the two stalled nodes leave hanging; each lease's key stays, with its token, on every
    healthy node, as an independent client sees it there."""
    healthy = [node.client(socket_timeout=2) for node in stalled_redlock.nodes.nodes[2:]]
    locks = fencelock.connect(stalled_redlock.nodes.urls)
    lost: list[str] = []
    errors: list[BaseException] = []
    missing: list[tuple[str, list[str | None]]] = []
    acquired = [0]
    stop = threading.Event()
    ttl = 2.0

    def on_healthy(lock: str, token: str) -> None:
        key = redis_keys(lock).lock
        values: list[Any] = [raw.get(key) for raw in healthy]
        seen = [None if v is None else bytes(v).decode() for v in values]
        if seen != [token] * len(healthy):
            missing.append((lock, seen))

    def acquirer(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                lease = locks.acquire(f"{name}:a{i}:{n}", ttl=ttl, wait=0)
                on_healthy(lease.name, lease.token)
                lease.release()
                acquired[0] += 1
            except Exception as exc:  # noted, and on: the renewals go on meanwhile
                errors.append(exc)
                time.sleep(0.01)

    try:
        leases = [locks.acquire(f"{name}:r{i}", ttl=ttl, wait=0, renew=True,
                                on_lost=lambda lease: lost.append(lease.name)) for i in range(20)]
        threads = [threading.Thread(target=acquirer, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        ends = time.monotonic() + 4 * ttl
        while time.monotonic() < ends:
            for lease in leases:
                on_healthy(lease.name, lease.token)
            time.sleep(0.2)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert not lost, lost
        assert not errors, (len(errors), errors[:3])
        assert not missing, missing[:3]
        assert all(lease.held for lease in leases)
        assert acquired[0] >= 8  # the acquirers were served all along, not just once
        for lease in leases:
            lease.release()
    finally:
        stop.set()
        locks.close()
        for raw in healthy:
            raw.close()


def test_asyncio_redlock_with_two_stalled_nodes_loses_no_renewed_lease(stalled_redlock: RedlockDeployment,
                                                                        name: str) -> None:
    """The same invariant with asyncio: tasks, one loop."""
    healthy = [node.client(socket_timeout=2) for node in stalled_redlock.nodes.nodes[2:]]
    lost: list[str] = []
    errors: list[BaseException] = []
    missing: list[tuple[str, list[str | None]]] = []
    ttl = 2.0

    def on_healthy(lock: str, token: str) -> None:
        key = redis_keys(lock).lock
        values: list[Any] = [raw.get(key) for raw in healthy]
        seen = [None if v is None else bytes(v).decode() for v in values]
        if seen != [token] * len(healthy):
            missing.append((lock, seen))

    async def main() -> int:
        # A node timeout a busy loop can keep: the 70 ms default for this TTL is less than one stall of a loaded
        # loop, and CI saw a healthy node's reply take over 0.3 s. A round still ends once the three healthy
        # nodes answer, and the stalled nodes' requests still pile up behind it.
        locks = fencelock.aio.connect(stalled_redlock.nodes.urls, node_timeout=slack(0.8))
        acquired = 0
        ends = math.inf

        async def acquirer(i: int) -> None:
            nonlocal acquired
            n = 0
            while time.monotonic() < ends:
                n += 1
                try:
                    lease = await locks.acquire(f"{name}:a{i}:{n}", ttl=ttl, wait=0)
                    await asyncio.to_thread(on_healthy, lease.name, lease.token)  # (never block the loop)
                    await lease.release()
                    acquired += 1
                except Exception as exc:
                    errors.append(exc)
                    await asyncio.sleep(0.01)

        try:
            # Warm: eight connections to each healthy node. (Forty cold connects at once on one loop can take
            # longer than the 70 ms node timeout on a busy machine, stalled nodes or not.)
            warm = await asyncio.gather(*[locks.acquire(f"{name}:w{i}", ttl=ttl, wait=5.0) for i in range(8)])
            for lease in warm:
                await lease.release()
            leases = [await locks.acquire(f"{name}:r{i}", ttl=ttl, wait=0, renew=True,
                                          on_lost=lambda lease: lost.append(lease.name)) for i in range(20)]
            ends = time.monotonic() + 4 * ttl
            workers = [asyncio.ensure_future(acquirer(i)) for i in range(8)]
            while time.monotonic() < ends:
                for lease in leases:
                    await asyncio.to_thread(on_healthy, lease.name, lease.token)
                await asyncio.sleep(0.2)
            await asyncio.gather(*workers)
            assert all(lease.held for lease in leases)
            for lease in leases:
                await lease.release()
        finally:
            await locks.aclose()
        return acquired

    try:
        acquired = asyncio.run(main())
        assert not lost, lost
        assert not errors, (len(errors), errors[:3])
        assert not missing, missing[:3]
        assert acquired >= 8
    finally:
        for raw in healthy:
            raw.close()


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_a_release_whose_reply_was_lost_goes_again_and_is_released_not_expired(own_server: RedisServer, name: str,
                                                                              api: str) -> None:
    """Invariant: a release that ran on the server but whose connection closed before the reply goes again once, on
    a new connection; that second sending finds the key gone, and since the first was sent while the lease was
    valid, the lease is released (not "expired", not an error), and the lock is free."""
    with fencelock.connect(own_server.url) as warm:  # the scripts cached: the request dropped is the script's own
        warm.acquire("warm-up", ttl=1.0, wait=0).release()
    proxy = _LoseFirstReply(own_server.port, name.encode(), hold=0.2)
    url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5"
    raw = own_server.client()
    try:
        if api == "sync":
            locks = fencelock.connect(url)
            proxy.armed = False
            lease = locks.acquire(name, ttl=10.0, wait=0)
            proxy.armed = True
            lease.release()
            assert not proxy.armed  # the first sending's reply was lost
            assert raw.exists(redis_keys(name).lock) == 0
            assert lease.remaining() == 0.0
            lease.release()  # released already: nothing more to do, and no error
            locks.acquire(name, ttl=1.0, wait=0).release()
            locks.close()
        else:
            async def main() -> None:
                alocks = fencelock.aio.connect(url)
                proxy.armed = False
                lease = await alocks.acquire(name, ttl=10.0, wait=0)
                proxy.armed = True
                await lease.release()
                assert not proxy.armed
                assert raw.exists(redis_keys(name).lock) == 0
                assert lease.remaining() == 0.0
                await lease.release()
                await (await alocks.acquire(name, ttl=1.0, wait=0)).release()
                await alocks.aclose()

            asyncio.run(main())
    finally:
        proxy.close()
