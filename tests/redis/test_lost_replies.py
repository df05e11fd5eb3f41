"""A request whose reply was lost (it ran on the server; its client saw a reset) goes again with the same token,
and the lease claims no more than the server keeps: an acquire sent again resets the TTL and counts its validity
from the retry, and a release sent again finds the key gone and is released, not expired."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from typing import Any

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock._scripts import RELEASE
from fencelock.testing.faults import LOSE, RESET_AFTER, FaultProxy, Rule
from fencelock.testing.servers import RedisServer
from tests.conftest import RedisFamily

from . import _support
from ._support import _pttls

idle_deployment = _support.idle_deployment   # the module-scoped fixture: a deployment of this module's own


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
        try:
            with contextlib.suppress(OSError):
                while data := client.recv(65536):
                    if self.armed and self.marker in data:
                        self.armed = False
                        drop.set()
                    server.sendall(data)
        finally:
            _end(server, client)  # the client left: end the server's side too, so `_down` ends and nothing leaks

    def _down(self, server: socket.socket, client: socket.socket, drop: threading.Event) -> None:
        try:
            self._pump_down(server, client, drop)
        finally:
            _end(client, server)

    def _pump_down(self, server: socket.socket, client: socket.socket, drop: threading.Event) -> None:
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


def _end(*sockets: socket.socket) -> None:
    """Shut down (waking a thread blocked in recv on it) and close each socket; one already closed is skipped."""
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


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


class _Waiter:
    """Another client that waits for `name`, takes it the moment it is free (`taken`) and keeps it until `end()`."""

    def __init__(self, server: RedisServer, name: str) -> None:
        self.server, self.name = server, name
        self.taken, self.ending = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        with fencelock.connect(self.server.url) as other, other.lock(self.name, ttl=10.0, wait=10.0):
            self.taken.set()
            self.ending.wait(10.0)

    def end(self) -> None:
        self.ending.set()
        self.thread.join(10.0)


def _waiting(raw: Any, name: str) -> None:
    """Until the waiter's marker is on the server (it blocks for a wake-up)."""
    deadline = time.monotonic() + 5.0
    while not raw.exists(redis_keys(name).waiters):
        assert time.monotonic() < deadline, "the waiter never started to wait"
        time.sleep(0.01)


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_a_release_sent_again_that_finds_a_waiter_holding_the_lock_is_released(own_server: RedisServer, name: str,
                                                                               api: str) -> None:
    """Invariant: the first sending of a release ran (and woke a waiter, who took the lock); its reply was lost
    with its connection; the second sending finds another token. That is our own release's doing: released, no
    error (not "taken", not LockLost)."""
    raw: Any = own_server.client()
    raw.script_load(RELEASE.source)  # (the request that loses its reply is the script's own)
    waiters: list[_Waiter] = []
    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5"

        def first_release_ran(lease: Any) -> Rule:
            waiters.append(_Waiter(own_server, name))
            _waiting(raw, name)
            return proxy.arm(Rule(RESET_AFTER, "release", delay=0.5))  # time enough for the waiter to take it

        if api == "sync":
            with fencelock.connect(url) as locks:
                lease = locks.acquire(name, ttl=10.0, wait=0)
                reset = first_release_ran(lease)
                lease.release()
                assert reset.hit.is_set()
                assert waiters[0].taken.is_set()
                assert not lease.held
                lease.release()  # released already: nothing to do
        else:
            async def main() -> Rule:
                async with fencelock.aio.connect(url) as locks:
                    lease = await locks.acquire(name, ttl=10.0, wait=0)
                    reset = first_release_ran(lease)
                    await lease.release()
                    assert waiters[0].taken.is_set()
                    assert not lease.held
                    await lease.release()
                    return reset

            assert asyncio.run(main()).hit.is_set()
    waiters[0].end()
    assert [r.name for r in proxy.requests if r.name == "release"] == ["release", "release"]  # it went twice


@pytest.mark.parametrize("api", ["sync", "asyncio"])
def test_a_release_without_an_answer_leaves_the_lease_in_doubt_and_its_retry_after_a_waiter_took_it_is_released(
        own_server: RedisServer, name: str, api: str) -> None:
    """Invariant: a release whose reply never came (the socket timeout) may have run: from then on the lease claims
    nothing (held False, remaining() 0, ensure() raises). The caller's retry finds the waiter holding the lock:
    our first release went through, so it is released, not LockLost."""
    raw: Any = own_server.client()
    raw.script_load(RELEASE.source)
    waiter: _Waiter | None = None
    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=0.5"

        def in_doubt(lease: Any) -> None:
            assert waiter is not None
            assert waiter.taken.wait(5)  # our first release ran: the waiter has the lock
            assert not lease.held
            assert lease.remaining() == 0.0
            with pytest.raises(fencelock.LockLost, match="release"):
                lease.ensure()

        if api == "sync":
            with fencelock.connect(url) as locks:
                lease = locks.acquire(name, ttl=10.0, wait=0)
                waiter = _Waiter(own_server, name)
                _waiting(raw, name)
                proxy.arm(Rule(LOSE, "release"))
                with pytest.raises(fencelock.BackendError):
                    lease.release()
                in_doubt(lease)
                lease.release()
                assert not lease.held
        else:
            async def main() -> None:
                async with fencelock.aio.connect(url) as locks:
                    nonlocal waiter
                    lease = await locks.acquire(name, ttl=10.0, wait=0)
                    waiter = _Waiter(own_server, name)
                    await asyncio.to_thread(_waiting, raw, name)
                    proxy.arm(Rule(LOSE, "release"))
                    with pytest.raises(fencelock.BackendError):
                        await lease.release()
                    await asyncio.to_thread(in_doubt, lease)
                    await lease.release()
                    assert not lease.held

            asyncio.run(main())
    assert waiter is not None
    waiter.end()
