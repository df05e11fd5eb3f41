"""What a lease claims while its release is under way, and after one that was never sent.

- From the moment `release()` is called, the lease claims nothing (`held` False, `remaining()` 0, `ensure()`
  raises): the server frees the lock as soon as the release lands, before its answer comes back. Before, a release
  whose reply was late left the lease claiming its whole validity while another client held the lock.
- A release that never left the client (no connection) changed nothing: once the server has lost the key
  (restarted empty) and another client took the lock, the retried release reports the loss. Before, the first
  failure made it "unsure", and the retry reported released.

Found from outside by a probe of the API (issue 14's invariants: never two leases that both claim validity).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock.testing.faults import LATE, FaultProxy, Rule
from fencelock.testing.servers import RedisServer
from tests.conftest import lock_value


def _claims(lease: Any) -> tuple[bool, float, bool]:
    try:
        lease.ensure()
        ensured = True
    except fencelock.LockLost:
        ensured = False
    return lease.held, lease.remaining(), ensured


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_lease_claims_nothing_while_its_release_is_under_way(own_server: RedisServer, name: str,
                                                               front: str) -> None:
    """A's release runs on the server, its reply held back 1.5 s; B is granted meanwhile. While both are read,
    only B claims the lock. A's release then returns (released)."""
    raw: Any = own_server.client()
    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        url = f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=5"
        if front == "sync":
            a, b = fencelock.connect(url), fencelock.connect(own_server.url)
            try:
                a.acquire(f"{name}:warm", ttl=10.0, wait=0).release()  # (the release script is loaded)
                lease = a.acquire(name, ttl=10.0, wait=0)
                late = proxy.arm(Rule(LATE, "release", delay=1.5))
                releasing = threading.Thread(target=lease.release)
                releasing.start()
                assert late.hit.wait(5)
                other = b.acquire(name, ttl=10.0, wait=1.0)  # (the server ran A's release)
                a_claims, b_claims = _claims(lease), _claims(other)
                releasing.join(10)
                assert lease._life.state.value == "released"
                other.release()
            finally:
                a.close()
                b.close()
        else:
            async def main() -> tuple[tuple[bool, float, bool], tuple[bool, float, bool], str]:
                async with fencelock.aio.connect(url) as a, fencelock.aio.connect(own_server.url) as b:
                    await (await a.acquire(f"{name}:warm", ttl=10.0, wait=0)).release()
                    lease = await a.acquire(name, ttl=10.0, wait=0)
                    late = proxy.arm(Rule(LATE, "release", delay=1.5))
                    releasing = asyncio.ensure_future(lease.release())
                    assert await asyncio.to_thread(late.hit.wait, 5)
                    other = await b.acquire(name, ttl=10.0, wait=1.0)
                    claims = _claims(lease), _claims(other)
                    await asyncio.wait_for(releasing, 10)
                    await other.release()
                    return claims[0], claims[1], lease._life.state.value
            a_claims, b_claims, state = asyncio.run(main())
            assert state == "released"
    assert b_claims[0]
    assert b_claims[1] > 0
    assert b_claims[2]
    assert a_claims == (False, 0.0, False), f"A still claims the lock B holds: held, remaining, ensured = {a_claims}"
    assert lock_value(raw, name) is None


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_release_never_sent_then_retried_after_the_server_lost_the_key_reports_the_loss(name: str,
                                                                                       front: str) -> None:
    """The server dies while A holds; A's release is refused a connection (nothing sent); the server restarts
    empty and B takes the lock. A's release, called again, raises LockLost; B's key stays."""
    with RedisServer() as server:
        async def main() -> BaseException | None:
            a, b = fencelock.aio.connect(server.url), fencelock.aio.connect(server.url)
            try:
                lease = await a.acquire(name, ttl=10.0, wait=0)
                server.kill()
                with pytest.raises(fencelock.BackendError):
                    await lease.release()
                server.restart()
                other = await b.acquire(name, ttl=10.0, wait=0)
                try:
                    await lease.release()
                except fencelock.LockError as exc:
                    return exc
                finally:
                    assert lock_value(server.client(), name) == other.token  # (B's key was not touched)
                    await other.release()
                return None
            finally:
                await a.aclose()
                await b.aclose()

        if front == "asyncio":
            outcome = asyncio.run(main())
        else:
            a, b = fencelock.connect(server.url), fencelock.connect(server.url)
            try:
                lease = a.acquire(name, ttl=10.0, wait=0)
                server.kill()
                with pytest.raises(fencelock.BackendError):
                    lease.release()
                server.restart()
                other = b.acquire(name, ttl=10.0, wait=0)
                outcome = None
                try:
                    lease.release()
                except fencelock.LockError as exc:
                    outcome = exc
                assert lock_value(server.client(), name) == other.token
                other.release()
            finally:
                a.close()
                b.close()
    assert type(outcome) is fencelock.LockLost, f"the retried release said {outcome!r} while B held the lock"
