"""Faults while Redlock rounds are queued in one client for their turn (issue 14, decision
2026-12-05-queued-faults).

One asyncio client starts more acquires at once than its `ROUNDS_AT_ONCE` turns, a competing client acquires part of
the same names, and while rounds wait for their turn: one node is stalled (SIGSTOP for a second, then SIGCONT),
every client connection of one node is killed, half the queued callers are cancelled, or the client is closed. A
test client reading every node checks: no two leases of a name claim validity, none claims more than every quorum
node keeps (PTTL), errors are fencelock errors naming their lock and come within a bound, a held lease is kept or
reported lost, no key (a minority's either) outlives its TTL, and the turns and channels drain.

The network's faults (`NETWORK`: a reply lost or late, a connection reset before or after its request, idle
connections closed) hit some of the rounds' requests to every node as they leave the turns' queue: the client under
test connects through a `FaultProxy` per node, the rival and the checks straight to the nodes; the held lease is
kept throughout.
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

import fencelock.aio
from fencelock._redis.channel import BLOCKING
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisNodes
from tests._queued_faults import (
    LATE_BY,
    NETWORK,
    SOCKET_TIMEOUT,
    Burst,
    Network,
    burst,
    check_claims,
    check_errors,
    inject,
    proxied,
    release_all,
    settle,
)
from tests.conftest import initialise_redlock

pytestmark = pytest.mark.alone  # (it loads one client to its limits: no other test runs beside it)

TTL = 1.0
COUNT = 600
CONTESTED = 150
WAIT = 5.0  # (queued rounds give up by their caller's wait: long enough to stay queued while the faults fire)
LIMIT = 15.0


@pytest.fixture
def nodes() -> Iterator[RedisNodes]:
    started = RedisNodes(3).start()
    initialise_redlock(started.urls)
    try:
        yield started
    finally:
        for node in started.nodes:
            if node.paused:
                node.resume()
        started.close()


def _kept(nodes: RedisNodes) -> Any:
    def kept(leases: list[Any]) -> list[float | None]:
        held: list[list[float]] = [[] for _ in leases]
        for node in nodes.nodes:
            client: Any = node.client()
            pipe = client.pipeline(transaction=False)
            for lease in leases:
                key = redis_keys(lease.name, "fencelock").lock
                pipe.get(key)
                pipe.pttl(key)
            replies = pipe.execute()
            for k, lease in enumerate(leases):
                value, pttl = replies[2 * k], replies[2 * k + 1]
                token = value.decode() if isinstance(value, bytes) else value
                if token == lease.token and pttl > 0:
                    held[k].append(pttl / 1000.0)
        # (a lease claims validity only while a quorum, 2 of 3, keeps its token: it may claim the least of them)
        return [sorted(h, reverse=True)[1] if len(h) >= 2 else None for h in held]
    return kept


def _left_keys(nodes: RedisNodes, names: list[str]) -> list[tuple[int, str, int]]:
    left = []
    for i, node in enumerate(nodes.nodes):
        client: Any = node.client()
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.pttl(redis_keys(name, "fencelock").lock)
        left += [(i, name, pttl) for name, pttl in zip(names, pipe.execute(), strict=True) if pttl != -2]
    return left


def _idle(backend: Any) -> bool:
    return (backend._turns.out == 0 and backend._turns.waiting == 0
            and all(ch._reserved == 0 and not ch._queues[0] and not ch._queues[1] and not ch._placing
                    and BLOCKING.blocking(ch) == 0 for ch in backend._channels))


def _state(backend: Any) -> str:
    return (f"turns running={backend._turns.out} waiting={backend._turns.waiting}; channels "
            + ", ".join(f"reserved={ch._reserved} queued={len(ch._queues[0])}+{len(ch._queues[1])} "
                        f"placing={len(ch._placing)} blocking={BLOCKING.blocking(ch)}" for ch in backend._channels))


@pytest.mark.parametrize("fault", ["stall", "stall_long", "stall_cancel", "kill", "close", *NETWORK])
def test_a_fault_while_redlock_rounds_are_queued(nodes: RedisNodes, fault: str) -> None:
    names = [f"rq:{fault}:{i}" for i in range(COUNT)]
    lost = threading.Event()
    with contextlib.ExitStack() as stack:
        urls, network = nodes.urls, None
        if fault in NETWORK:
            proxies = [stack.enter_context(proxied(node)) for node in nodes.nodes]
            urls = [f"redis://127.0.0.1:{proxy.port}/0?socket_timeout={SOCKET_TIMEOUT}" for proxy in proxies]
            network = Network(fault, proxies, "redlock_acquire", late=LATE_BY, count=10, spread=40)
        _queued_fault(nodes, fault, names, lost, urls, network)


def _queued_fault(nodes: RedisNodes, fault: str, names: list[str], lost: threading.Event, urls: list[str],
                  network: Network | None) -> None:
    stalled = nodes.nodes[1]
    fault_at = functools.partial(inject, fault, pause=stalled.pause, resume=stalled.resume,
                       kill=lambda: stalled.client().client_kill_filter(_type="normal"))

    async def main() -> tuple[Burst, bool, float, str]:
        async with fencelock.aio.connect(urls) as locks, fencelock.aio.connect(nodes.urls) as rival:
            keeper = await locks.acquire(f"keeper:{fault}", ttl=3.0, wait=0, renew=True,
                                         on_lost=lambda lease: lost.set())
            backend = locks.backend

            def queued() -> int:
                return int(backend._turns.waiting)  # type: ignore[attr-defined]

            result = await burst(locks, rival, names, CONTESTED, TTL, WAIT, queued,
                                 lambda tasks: network.inject(queued) if network else fault_at(tasks, locks), LIMIT)
            failed = network.end() if network else ""
            assert not failed, failed
            check_errors(result, LIMIT)
            check_claims(result, _kept(nodes))
            kept = keeper.held
            state, after = "", 0.0
            if not fault.endswith("close"):
                state = _state(backend) if not await settle(lambda: _idle(backend)) else ""
                started = time.monotonic()
                again = await locks.acquire(f"after:{fault}", ttl=TTL, wait=1.0)  # (the same client, not rebuilt)
                await again.release()
                after = time.monotonic() - started
                with contextlib.suppress(fencelock.LockLost):  # (raised when the fault did make it lost)
                    await keeper.release()
            await release_all(result)
            return result, kept, after, state

    result, kept, after, state = asyncio.run(main())
    assert result.queued_at_fault > 0, "no round waited for its turn when the fault came"
    assert kept != lost.is_set(), f"the keeper: held={kept}, on_lost fired={lost.is_set()}"
    if not fault.endswith("close"):
        assert kept, "the held lease was lost through a fault that leaves a quorum"
        assert len(result.granted()) > CONTESTED, "the burst was not served"
    assert not state, f"the client did not drain: {state}"
    assert after < 2.0
    time.sleep(TTL + 0.2)  # (no key, a minority's either, of a call that failed or was cancelled, outlives its TTL)
    left = _left_keys(nodes, names)
    assert not left, f"keys left beyond their TTL (node, name, PTTL): {left[:5]}"
