"""Faults while requests are queued in one Redis client (issue 14, decision 2026-12-05-queued-faults).

One asyncio client sends more acquires at once than its server's capped connections carry (`MAX_OPEN`), so most
wait in `Channel.place`; a competing client acquires part of the same names meanwhile, and waiters block (BLPOP,
`MAX_BLOCKING`). While requests are queued: the server is paused (SIGSTOP, SIGCONT), every client connection is
killed (`CLIENT KILL TYPE normal`), half the queued callers are cancelled, or the client is closed. A test client
then checks: no two valid leases of a name, no lease claims more than the key's PTTL, every error a fencelock error
naming its lock and within a bound, a held lease's renewals kept (or its loss reported), no key left by a call that
failed or was cancelled beyond its TTL, and the channel's queue and counters back to zero.

The network's faults (`NETWORK`: a reply lost or late, a connection reset before or after its request, idle
connections closed) hit some of the burst's acquires as they leave the queue: the client under test then connects
through a `FaultProxy`, the rival and the checks straight to the server, and the same checks hold, the held lease
kept throughout (the server never stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock._redis.channel import BLOCKING
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisServer
from tests._queued_faults import (
    LATE_BY,
    NETWORK,
    SOCKET_TIMEOUT,
    Burst,
    Network,
    Outcome,
    burst,
    check_claims,
    check_errors,
    inject,
    own_redis,
    proxied,
    release_all,
    settle,
)

pytestmark = pytest.mark.alone  # (it loads one client to its limits: no other test runs beside it)

TTL = 1.0
"""The burst's leases (not renewed): short, so that a key left behind must be gone by the end of the test."""
COUNT = 800
CONTESTED = 200
WAIT = 1.0
LIMIT = 15.0
"""A bound on every call: the request timeout and a retry or two, far below the 30 s queue bounds."""


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with own_redis() as started:
        yield started


def _kept(server: RedisServer) -> Any:
    def kept(leases: list[Any]) -> list[float | None]:
        client: Any = server.client()
        pipe = client.pipeline(transaction=False)
        for lease in leases:
            key = redis_keys(lease.name, "fencelock").lock
            pipe.get(key)
            pipe.pttl(key)
        replies = pipe.execute()
        left: list[float | None] = []
        for k, lease in enumerate(leases):
            value, pttl = replies[2 * k], replies[2 * k + 1]
            token = value.decode() if isinstance(value, bytes) else value
            left.append(pttl / 1000.0 if token == lease.token and pttl > 0 else None)
        return left
    return kept


def _left_keys(server: RedisServer, names: list[str]) -> list[tuple[str, int]]:
    client: Any = server.client()
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.pttl(redis_keys(name, "fencelock").lock)
    return [(name, pttl) for name, pttl in zip(names, pipe.execute(), strict=True) if pttl != -2]


def _idle(channel: Any) -> bool:
    return (channel._reserved == 0 and not channel._queues[0] and not channel._queues[1] and not channel._placing
            and BLOCKING.blocking(channel) == 0)


def _state(channel: Any) -> str:
    return (f"reserved={channel._reserved} queued={len(channel._queues[0])}+{len(channel._queues[1])} "
            f"placing={len(channel._placing)} blocking={BLOCKING.blocking(channel)}")


@pytest.mark.parametrize("fault", ["pause", "pause_long", "pause_cancel", "pause_close", "kill", "cancel", "close",
                                   *NETWORK])
def test_a_fault_while_acquires_are_queued_in_the_client(server: RedisServer, fault: str) -> None:
    names = [f"q:{fault}:{i}" for i in range(COUNT)]
    lost = threading.Event()
    with contextlib.ExitStack() as stack:
        url, network = server.url, None
        if fault in NETWORK:
            proxy = stack.enter_context(proxied(server))
            url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout={SOCKET_TIMEOUT}"
            network = Network(fault, [proxy], "acquire", late=LATE_BY, count=20, spread=25)
        _queued_fault(server, fault, names, lost, url, network)


def _queued_fault(server: RedisServer, fault: str, names: list[str], lost: threading.Event, url: str,
                  network: Network | None) -> None:
    fault_at = functools.partial(inject, fault, pause=server.pause, resume=server.resume,
                       kill=lambda: server.client().client_kill_filter(_type="normal"))

    async def main() -> tuple[Burst, bool, float, str]:
        async with fencelock.aio.connect(url) as locks, fencelock.aio.connect(server.url) as rival:
            keeper = await locks.acquire(f"keeper:{fault}", ttl=3.0, wait=0, renew=True,
                                         on_lost=lambda lease: lost.set())
            channel = locks.backend._channel  # type: ignore[attr-defined]

            def queued() -> int:
                return len(channel._queues[0]) + len(channel._queues[1])

            result = await burst(locks, rival, names, CONTESTED, TTL, WAIT, queued,
                                 lambda tasks: network.inject(queued) if network else fault_at(tasks, locks), LIMIT)
            failed = network.end() if network else ""
            assert not failed, failed
            check_errors(result, LIMIT)
            check_claims(result, _kept(server))
            kept = keeper.held
            state = ""
            if not fault.endswith("close"):
                state = _state(channel) if not await settle(lambda: _idle(channel)) else ""
                started = time.monotonic()
                again = await locks.acquire(f"after:{fault}", ttl=TTL, wait=1.0)  # (the same client, not rebuilt)
                await again.release()
                after = time.monotonic() - started
                with contextlib.suppress(fencelock.LockLost):  # (raised when the fault did make it lost)
                    await keeper.release()
            else:
                after = 0.0
            await release_all(result)
            return result, kept, after, state

    result, kept, after, state = asyncio.run(main())
    assert result.queued_at_fault > 0, "nothing was queued in the client when the fault came"
    assert kept != lost.is_set(), f"the keeper: held={kept}, on_lost fired={lost.is_set()}"
    if fault in ("kill", "cancel", *NETWORK):
        assert kept, "the held lease was lost through a fault that does not stop its server"
    assert not state, f"the channel did not drain: {state}"
    assert after < 2.0
    if not fault.endswith("close"):
        assert len(result.granted()) > CONTESTED, "the burst was not served"
    time.sleep(TTL + 0.2)  # (a key of a call that failed or was cancelled lives no longer than its TTL)
    left = _left_keys(server, names)
    assert not left, f"keys left beyond their TTL (name, PTTL): {left[:5]}"


@pytest.mark.parametrize("fault", ["pause", "kill"])
def test_a_fault_while_threads_are_queued_in_the_sync_client(server: RedisServer, fault: str) -> None:
    """The sync front end: 300 threads acquire through one client (more than its `MAX_OPEN` connections), a second
    client competes for a quarter of the names, and the server is paused for a second or its connections killed
    while requests are queued. The same checks as above."""
    count, contested = 300, 75
    names = [f"tq:{fault}:{i}" for i in range(count)]
    lost = threading.Event()
    locks, rival = fencelock.connect(server.url), fencelock.connect(server.url)
    outcomes: list[Outcome] = []
    start = threading.Barrier(count + contested + 1)

    def one(client: str, which: Any, name: str) -> None:
        outcome = Outcome(client, name)
        start.wait()
        began = time.monotonic()
        try:
            outcome.lease = which.acquire(name, ttl=TTL, wait=WAIT)
        except BaseException as exc:
            outcome.error = exc
        outcome.took = time.monotonic() - began
        outcomes.append(outcome)

    try:
        keeper = locks.acquire(f"keeper:{fault}", ttl=3.0, wait=0, renew=True, on_lost=lambda lease: lost.set())
        channel: Any = locks.backend._channel  # type: ignore[attr-defined]
        threads = [threading.Thread(target=one, args=("ours", locks, name)) for name in names]
        threads += [threading.Thread(target=one, args=("rival", rival, name)) for name in names[:contested]]
        admin: Any = server.client()
        admin.ping()  # (connected before the server stops)
        server.pause()  # the calls pile up: MAX_OPEN in flight, the rest queued in the client
        for thread in threads:
            thread.start()
        start.wait()
        depth = 0
        deadline = time.monotonic() + 5.0
        while depth == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
            depth = max(depth, len(channel._queues[0]) + len(channel._queues[1]), len(channel._placing))
        if fault == "pause":
            time.sleep(1.0)
            server.resume()
        else:
            server.resume()
            admin.client_kill_filter(_type="normal")  # (every connection, the in-flight ones among them)
        for thread in threads:
            thread.join(LIMIT)
        assert not [thread for thread in threads if thread.is_alive()], f"calls still running after {LIMIT} s"
        result = Burst(outcomes, depth, [])
        check_errors(result, LIMIT)
        check_claims(result, _kept(server))
        kept = keeper.held
        deadline = time.monotonic() + 5.0
        while not _idle(channel) and time.monotonic() < deadline:
            time.sleep(0.02)
        state = "" if _idle(channel) else _state(channel)
        locks.acquire(f"after:{fault}", ttl=TTL, wait=1.0).release()
        with contextlib.suppress(fencelock.LockLost):
            keeper.release()
        for o in result.granted():
            with contextlib.suppress(fencelock.LockError):
                o.lease.release()
    finally:
        locks.close()
        rival.close()
    assert depth > 0, "nothing was queued in the client when the fault came"
    assert kept, "the held lease was lost through a one-second fault"
    assert not lost.is_set()
    assert not state, f"the channel did not drain: {state}"
    assert len(result.granted()) > contested
    time.sleep(TTL + 0.2)
    left = _left_keys(server, names)
    assert not left, f"keys left beyond their TTL (name, PTTL): {left[:5]}"
