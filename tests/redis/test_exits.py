"""Every way out of a lease stops its renewal: a `with` / `async with` exit whose release fails or is cancelled,
and an explicit `release()` that fails. The key is then freed by its TTL at the latest, and the error carries
the lease, whose `release()` works once the server answers again.

Invariant, checked by an independent client on the server itself: after the exit, the key's PTTL never goes up
again (nobody renews it), and the key is gone within its TTL. The faults are real: a proxy stalls the client's
connection, so that the release times out and is dropped with the connection, or the exit is cancelled
while its release waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock.testing.proxy import Proxy
from fencelock.testing.servers import RedisServer
from tests.conftest import until

TTL = 4.5            # renewed every 1.5 s while held
WATCH = 2.2          # longer than a renewal interval: a renewal that still ran would show in it


@pytest.fixture
def proxy(own_server: RedisServer) -> Iterator[Proxy]:
    with Proxy(own_server.host, own_server.port) as running:
        yield running


def _url(proxy: Proxy, socket_timeout: float) -> str:
    return f"redis://127.0.0.1:{proxy.port}/0?socket_timeout={socket_timeout}"


def _pttl(raw: redis.Redis, name: str) -> int:
    value: Any = raw.pttl(redis_keys(name).lock)
    return int(value)


def assert_not_renewed(raw: redis.Redis, name: str, watch: float = WATCH) -> int:
    """PTTL sampled for `watch` seconds never rises (no renewal landed) and falls by at least the time watched;
    returns the last PTTL seen (> 0: the key is still there)."""
    first = _pttl(raw, name)
    assert first > 0, "the key should still be there right after the failed exit"
    last = first
    started = time.monotonic()
    while time.monotonic() - started < watch:
        time.sleep(0.05)
        now = _pttl(raw, name)
        assert now <= last, f"the key's TTL went up from {last} to {now} ms after the exit: it was renewed"
        last = now
    # (PTTL is whole milliseconds, sampled on the server's clock: a few ms either way are its rounding, not a renewal.)
    assert last <= first - int(watch * 1000) + 20, (first, last)
    return last


def assert_freed_within_ttl(raw: redis.Redis, name: str, exited_at: float) -> None:
    while raw.exists(redis_keys(name).lock):
        assert time.monotonic() < exited_at + TTL + 1.0, "the key outlived its TTL after the exit"
        time.sleep(0.05)


def test_a_with_exit_whose_release_fails_stops_renewal_and_the_error_carries_the_lease(
        own_server: RedisServer, proxy: Proxy, name: str) -> None:
    raw = own_server.client()
    with fencelock.connect(_url(proxy, 0.3)) as locks:
        with pytest.raises(fencelock.BackendError) as info, locks.lock(name, ttl=TTL) as lease:
            proxy.stall()
        proxy.heal()
        assert info.value.lease is lease
        assert_not_renewed(raw, name)
        # Its release may have gone through (no answer came): it claims nothing, until a release settles it.
        assert not lease.held
        with pytest.raises(fencelock.LockLost, match="may be released"):
            lease.ensure()
        info.value.lease.release()
        assert not raw.exists(redis_keys(name).lock)
        assert not lease.held


def test_a_with_exit_whose_release_fails_frees_the_key_by_its_ttl(own_server: RedisServer, proxy: Proxy,
                                                                  name: str) -> None:
    raw = own_server.client()
    with fencelock.connect(_url(proxy, 0.3)) as locks:
        with pytest.raises(fencelock.BackendError), locks.lock(name, ttl=TTL):
            proxy.stall()
        exited_at = time.monotonic()
        proxy.heal()
        assert_freed_within_ttl(raw, name, exited_at)
        # and the lock is usable again at once by the next holder
        with locks.lock(name, ttl=TTL, wait=0) as again:
            assert again.held


def test_an_explicit_release_that_fails_stops_renewal(own_server: RedisServer, proxy: Proxy, name: str) -> None:
    raw = own_server.client()
    with fencelock.connect(_url(proxy, 0.3)) as locks:
        lease = locks.acquire(name, ttl=TTL, renew=True)
        proxy.stall()
        with pytest.raises(fencelock.BackendError) as info:
            lease.release()
        proxy.heal()
        assert info.value.lease is lease
        assert_not_renewed(raw, name)
        lease.release()
        assert not raw.exists(redis_keys(name).lock)


def test_an_async_with_exit_whose_release_fails_stops_renewal(own_server: RedisServer, proxy: Proxy,
                                                              name: str) -> None:
    raw = own_server.client()

    async def main() -> None:
        async with fencelock.aio.connect(_url(proxy, 0.3)) as locks:
            with pytest.raises(fencelock.BackendError) as info:
                async with locks.lock(name, ttl=TTL) as lease:
                    proxy.stall()
            proxy.heal()
            assert info.value.lease is lease
            await asyncio.to_thread(assert_not_renewed, raw, name)
            await info.value.lease.release()
            assert not raw.exists(redis_keys(name).lock)

    asyncio.run(main())


def test_an_async_with_exit_cancelled_during_its_release_stops_renewal(own_server: RedisServer, proxy: Proxy,
                                                                       name: str) -> None:
    raw = own_server.client()

    async def main() -> None:
        async with fencelock.aio.connect(_url(proxy, 5.0)) as locks:
            leases: list[fencelock.aio.Lease] = []
            releasing = asyncio.Event()

            async def holder() -> None:
                async with locks.lock(name, ttl=TTL) as lease:
                    leases.append(lease)
                    proxy.stall()
                    releasing.set()  # the exit's release starts now, and waits on the stalled connection

            task = asyncio.create_task(holder())
            await releasing.wait()
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            exited_at = time.monotonic()
            proxy.heal()
            await asyncio.to_thread(assert_not_renewed, raw, name)
            await leases[0].release()  # the lease stayed releasable
            assert not raw.exists(redis_keys(name).lock)
            assert time.monotonic() < exited_at + TTL

    asyncio.run(main())


def _stall(proxies: list[Proxy]) -> None:
    for proxy in proxies:
        proxy.stall()


def test_a_redlock_exit_whose_release_fails_never_renews_on_any_node(name: str) -> None:
    """Redlock: the stalled release may still be delivered when the connections heal (its channels keep them);
    either way no node's key is renewed after the exit, and the lease's release then succeeds."""
    from fencelock.testing.servers import RedisNodes
    from tests.conftest import _require_server_binary

    _require_server_binary()
    with RedisNodes(3) as nodes:
        proxies = [Proxy(node.host, node.port).start() for node in nodes.nodes]
        try:
            raws = [node.client() for node in nodes.nodes]
            with fencelock.connect([_url(proxy, 0.3) for proxy in proxies], node_timeout=0.3) as locks:
                with pytest.raises(fencelock.BackendError) as info, locks.lock(name, ttl=TTL) as lease:
                    _stall(proxies)
                for proxy in proxies:
                    proxy.heal()
                assert info.value.lease is lease
                last = [_pttl(raw, name) for raw in raws]   # -2: the late release already deleted it there
                started = time.monotonic()
                while time.monotonic() - started < WATCH:
                    time.sleep(0.05)
                    now = [_pttl(raw, name) for raw in raws]
                    assert all(b <= a for a, b in zip(last, now, strict=True)), (last, now)
                    last = now
                info.value.lease.release()
                key = redis_keys(name).lock
                present = [bool(raw.exists(key)) for raw in raws]
                assert sum(present) <= len(raws) // 2, present  # the release was confirmed by a majority
                # The other nodes' releases end in the background: the key goes well before its TTL would end it.
                for raw, there in zip(raws, present, strict=True):
                    left = raw.pttl(key) / 1000.0 if there else 0.0
                    if left > 0.5:
                        until(lambda raw=raw: not raw.exists(key), left - 0.3, "a minority node's release")
        finally:
            for proxy in proxies:
                proxy.close()
