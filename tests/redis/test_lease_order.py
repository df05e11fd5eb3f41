"""One lease's requests that set its key's expiry land in the order they were sent, and `remaining()` never claims
more than the server keeps, whatever the network does to them.

The reported race: a watchdog renewal (the lease's old, short TTL) is held back on the wire; `extend(ttl=longer)`
went out on another connection meanwhile, landed first, and was counted; the late renewal then set the key back
to the short TTL, and the lease claimed the long one while the server's key expired (a second client was granted
the lock). Now the extend waits for the renewal in flight, and each renewal counts with the TTL it sent.

Real servers behind a `FaultProxy`; an independent client reads the server's PTTL.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock._scripts import EXTEND, EXTEND_MANY
from fencelock.testing.faults import LATE, PAUSE, RESET_BEFORE, FaultProxy, Rule
from fencelock.testing.servers import RedisServer

TTL = 1.0  # renewed every third of it
HELD_BACK = 0.3  # seconds the renewal is held back on the wire
LONGER = 30.0


def _claims_no_more_than_the_server(lease: Any, raw: Any, name: str) -> None:
    """PTTL first, then remaining(): the claim, read later, must not exceed what the server had left before."""
    pttl_ms = int(raw.pttl(redis_keys(name).lock))
    claim = lease.remaining()
    assert claim == 0.0 or claim * 1000.0 <= pttl_ms, f"remaining() {claim:.3f} s, the server keeps {pttl_ms} ms"


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_an_extend_waits_for_the_renewal_in_flight_and_never_claims_more_than_the_server_keeps(
        own_server: RedisServer, name: str, front: str) -> None:
    raw: Any = own_server.client()
    raw.script_load(EXTEND_MANY.source)  # (else the held renewal's NOSCRIPT sends it again, into a reset rule)
    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5"

        def arm() -> Rule:
            return proxy.arm(Rule(PAUSE, "extend_many", delay=HELD_BACK))  # the next renewal is held back

        def after_extend(lease: Any, held: Rule) -> None:
            waited = held.done.is_set()
            assert held.done.wait(5)
            time.sleep(0.05)  # (without the wait, the late renewal lands now: what the server keeps after it)
            _claims_no_more_than_the_server(lease, raw, name)
            assert waited, "extend() returned before the renewal it had to wait for was delivered"
            extend_at = [r.at for r in proxy.requests if r.name == "extend"][-1]
            assert held.ended_at is not None
            assert extend_at >= held.ended_at
            _claims_no_more_than_the_server(lease, raw, name)
            for _ in range(50):  # from now on no renewal reaches the server: only what was counted keeps the key
                proxy.arm(Rule(RESET_BEFORE, "extend_many"))

        if front == "sync":
            with fencelock.connect(url) as locks:
                lease = locks.acquire(name, ttl=TTL, wait=0, renew=True)
                held = arm()
                assert held.hit.wait(5)
                lease.extend(LONGER)
                after_extend(lease, held)
                time.sleep(TTL + 0.2)  # the short TTL the late renewal carried would have run out by now
                _claims_no_more_than_the_server(lease, raw, name)
                assert lease.held
                with fencelock.connect(own_server.url) as other, pytest.raises(fencelock.NotAcquired):
                    other.acquire(name, ttl=1.0, wait=0)
                proxy.clear()
                lease.release()
        else:
            async def main() -> None:
                async with fencelock.aio.connect(url) as locks:
                    lease = await locks.acquire(name, ttl=TTL, wait=0, renew=True)
                    held = arm()
                    assert await asyncio.to_thread(held.hit.wait, 5)
                    await lease.extend(LONGER)
                    after_extend(lease, held)
                    await asyncio.sleep(TTL + 0.2)
                    _claims_no_more_than_the_server(lease, raw, name)
                    assert lease.held
                    async with fencelock.aio.connect(own_server.url) as other:
                        with pytest.raises(fencelock.NotAcquired):
                            await other.acquire(name, ttl=1.0, wait=0)
                    proxy.clear()
                    await lease.release()

            asyncio.run(main())


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_concurrent_extends_of_one_lease_go_one_after_the_other(own_server: RedisServer, name: str,
                                                                front: str) -> None:
    """Two extends at once (two threads or tasks) never overlap on the wire: the second is sent after the first's
    answer, so the last one sent is the one the server keeps, and the lease counts that one."""
    raw: Any = own_server.client()
    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5"
        if front == "sync":
            import threading

            with fencelock.connect(url) as locks:
                lease = locks.acquire(name, ttl=5.0, wait=0)
                held = proxy.arm(Rule(PAUSE, "extend", delay=HELD_BACK))
                first = threading.Thread(target=lease.extend, args=(LONGER,))
                first.start()
                assert held.hit.wait(5)
                lease.extend(2.0)  # sent only once the first extend (held back) was answered
                first.join()
                _claims_no_more_than_the_server(lease, raw, name)
                lease.release()
        else:
            async def main() -> Rule:
                async with fencelock.aio.connect(url) as locks:
                    lease = await locks.acquire(name, ttl=5.0, wait=0)
                    held = proxy.arm(Rule(PAUSE, "extend", delay=HELD_BACK))
                    first = asyncio.ensure_future(lease.extend(LONGER))
                    assert await asyncio.to_thread(held.hit.wait, 5)
                    await lease.extend(2.0)
                    await first
                    _claims_no_more_than_the_server(lease, raw, name)
                    await lease.release()
                    return held

            held = asyncio.run(main())
    # (an EVALSHA answered NOSCRIPT goes again as EVAL: count the requests by the TTL they carry)
    second = [r for r in proxy.requests if r.name == "extend" and b"2000" in r.args]
    assert second
    assert [r for r in proxy.requests if r.name == "extend" and b"30000" in r.args]
    assert held.ended_at is not None
    assert all(r.at >= held.ended_at for r in second)


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_while_an_extend_to_a_shorter_ttl_is_unanswered_the_lease_claims_no_more_than_that_ttl(
        own_server: RedisServer, name: str, front: str) -> None:
    """Invariant: the server may apply an extend before its reply comes. While one to a shorter TTL is on the wire
    unanswered, remaining(), held and ensure() count the shorter TTL: the lease never outlives the server's key."""
    raw: Any = own_server.client()
    raw.script_load(EXTEND.source)  # (else the delayed reply is NOSCRIPT's, and the extend has not run yet)
    short = 0.5
    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5"

        def while_unanswered(lease: Any, late: Rule) -> None:
            assert late.hit.wait(5)
            time.sleep(0.05)  # the server applied the shorter TTL; its reply is still held back
            assert not late.done.is_set()
            _claims_no_more_than_the_server(lease, raw, name)
            assert lease.remaining() <= short
            time.sleep(short + 0.05)  # the shorter TTL ran out on the server, still unanswered
            assert not late.done.is_set()
            assert raw.exists(redis_keys(name).lock) == 0
            assert not lease.held
            assert lease.remaining() == 0.0
            with pytest.raises(fencelock.LockLost):
                lease.ensure()

        if front == "sync":
            import threading

            with fencelock.connect(url) as locks:
                lease = locks.acquire(name, ttl=LONGER, wait=0)
                late = proxy.arm(Rule(LATE, "extend", delay=short + 0.6))
                errors: list[BaseException] = []

                def extend() -> None:
                    try:
                        lease.extend(short)
                    except BaseException as exc:
                        errors.append(exc)

                worker = threading.Thread(target=extend)
                worker.start()
                while_unanswered(lease, late)
                worker.join()
                assert [type(e) for e in errors] == [fencelock.LockLost]  # confirmed after its TTL ran out
        else:
            async def main() -> None:
                async with fencelock.aio.connect(url) as locks:
                    lease = await locks.acquire(name, ttl=LONGER, wait=0)
                    late = proxy.arm(Rule(LATE, "extend", delay=short + 0.6))
                    extend = asyncio.ensure_future(lease.extend(short))
                    await asyncio.to_thread(while_unanswered, lease, late)
                    with pytest.raises(fencelock.LockLost):
                        await extend

            asyncio.run(main())
