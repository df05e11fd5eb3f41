"""Requests whose outcome the client never learned (a reply lost or late, an asyncio cancellation) on a real etcd,
with a `Proxy` holding the replies back: a move of our key to a longer lease is never undone by revoking the lease
it may be on, and is settled by reading the key; a release sent again after one that may have gone through is a
release, not a loss. An independent client reads the server."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock._async import _concurrency
from fencelock._logic.admission import Urgency
from fencelock.testing.etcd import EtcdServer
from fencelock.testing.proxy import Proxy
from tests.conftest import until
from tests.etcd.helpers import keys_of, lease_keys, lease_ttl


@pytest.fixture
def proxy(etcd_server: EtcdServer) -> Iterator[Proxy]:
    with Proxy("127.0.0.1", etcd_server.members[0].client_port) as started:
        yield started


def _lease_of(etcd_server: EtcdServer, name: str, token: str) -> int:
    """The lease our key is on, as the server has it."""
    [kv] = [kv for kv in keys_of(etcd_server, name) if kv["value"] == _b64(token)]
    return int(kv["lease"])


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _slow_after_grant(locks: Any, proxy: Proxy, delay: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the next lease grant's answer on, every byte through `proxy` is `delay` s late: the move that follows
    the grant reaches the server, and its answer comes late."""
    gateway = locks.backend._gateway
    grant = gateway.grant

    async def grant_then_slow(*args: Any, **kwargs: Any) -> Any:
        answer = await grant(*args, **kwargs)
        proxy.delay = delay
        return answer

    def grant_then_slow_sync(*args: Any, **kwargs: Any) -> Any:
        answer = grant(*args, **kwargs)
        proxy.delay = delay
        return answer

    is_async = asyncio.iscoroutinefunction(grant)
    monkeypatch.setattr(gateway, "grant", grant_then_slow if is_async else grant_then_slow_sync)


# -- extend past the lease's TTL: the move ----------------------------------------------------------------------

def test_a_move_whose_answer_was_lost_never_revokes_our_key_and_is_settled_by_the_next_extend(
        etcd_server: EtcdServer, proxy: Proxy, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    locks = fencelock.connect(f"etcd://127.0.0.1:{proxy.port}?timeout=1")
    other = fencelock.connect(etcd_server.url)
    granted: list[fencelock.Lease] = []
    try:
        lease = locks.acquire(name, ttl=5.0, wait=0)
        first = _lease_of(etcd_server, name, lease.token)
        waiter = threading.Thread(target=lambda: granted.append(other.acquire(name, ttl=5.0, wait=30.0)))
        waiter.start()
        until(lambda: len(keys_of(etcd_server, name)) == 2, 5.0, "the waiter queued")
        # The move reaches the server 0.7 s after it was sent, within the 1 s timeout; its answer comes at 1.4 s.
        _slow_after_grant(locks, proxy, 0.7, monkeypatch)
        with pytest.raises(fencelock.BackendError):
            lease.extend(ttl=20.0)
        monkeypatch.undo()
        proxy.delay = 0.0
        until(lambda: proxy.held_back == 0, 5.0, "everything the client sent reached the server")
        # The move went through: our key is on the new lease, and still there. Nobody else was granted.
        assert _b64(lease.token) in [kv["value"] for kv in keys_of(etcd_server, name)], "our key was revoked"
        moved = _lease_of(etcd_server, name, lease.token)
        assert moved != first
        assert lease_ttl(etcd_server, moved) > 15
        assert not granted
        assert lease.held
        assert not lease.lost
        assert keys_of(etcd_server, name)[0]["value"] == _b64(lease.token)
        lease.extend()  # reads where the key is, adopts the new lease, ends the old one
        assert _lease_of(etcd_server, name, lease.token) == moved
        assert lease_ttl(etcd_server, first) == -1
        assert not granted
        lease.release()
        waiter.join(10.0)
        assert granted
        assert granted[0].fence > lease.fence
        assert lease_keys(etcd_server, moved) == []
        granted[0].release()
    finally:
        proxy.delay = 0.0
        other.close()
        locks.close()


def test_asyncio_an_extend_cancelled_during_its_move_is_settled_by_the_next_renewal(
        etcd_server: EtcdServer, proxy: Proxy, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe: the cancelled move left the key on the new lease while the client renewed the old one, found the
    key "not ours", reported the lease lost and revoked the old lease; the waiter then waited out the new TTL."""

    async def main() -> None:
        locks = fencelock.aio.connect(f"etcd://127.0.0.1:{proxy.port}?timeout=5")
        other = fencelock.aio.connect(etcd_server.url)
        try:
            lease = await locks.acquire(name, ttl=3.0, wait=0, renew=True)
            first = _lease_of(etcd_server, name, lease.token)
            waiter = asyncio.ensure_future(other.acquire(name, ttl=5.0, wait=30.0))
            await asyncio.to_thread(until, lambda: len(keys_of(etcd_server, name)) == 2, 5.0, "the waiter queued")
            _slow_after_grant(locks, proxy, 1.0, monkeypatch)
            extend = asyncio.ensure_future(lease.extend(ttl=20.0))
            await asyncio.to_thread(until, lambda: _lease_of(etcd_server, name, lease.token) != first, 5.0,
                                    "the move was applied")
            extend.cancel()  # its answer is still on its way back
            with pytest.raises(asyncio.CancelledError):
                await extend
            monkeypatch.undo()
            proxy.delay = 0.0
            moved = _lease_of(etcd_server, name, lease.token)
            await asyncio.sleep(2.0)  # two renewals at least (every second)
            assert not lease.lost
            assert lease.held
            assert not waiter.done()
            assert _lease_of(etcd_server, name, lease.token) == moved  # the renewals adopted the lease it is on
            assert lease_ttl(etcd_server, first) == -1
            await lease.release()
            taken = await asyncio.wait_for(waiter, 3.0)  # at the release, not when the 20 s lease runs out
            assert taken.fence > lease.fence
            await taken.release()
        finally:
            proxy.delay = 0.0
            await other.aclose()
            await locks.aclose()

    asyncio.run(main())


class _LateMove:
    """The next move of our key (`txn.move` to another lease) is sent, and reaches the server late: the client is
    told its answer was lost, and the move lands just before the `lands_before`-th request the client sends after
    it (1: before the settle's read), or at `land()` if the client sent fewer."""

    def __init__(self, locks: Any, lands_before: int, monkeypatch: pytest.MonkeyPatch) -> None:
        gateway = locks.backend._gateway
        self._txn, self._revoke = gateway.txn, gateway.revoke
        self._lands_before = lands_before
        self._sent_after = 0
        self.stashed: dict[str, Any] | None = None
        self.landed: bool | None = None  # whether the late move was applied, once it landed

        def txn(body: dict[str, Any], what: str, name: str | None, urgency: Any, again: bool = True) -> Any:
            self._count()
            if self.stashed is None and self.landed is None and _moves_to_another_lease(body, locks, name):
                self.stashed = body
                raise fencelock.BackendError("the move's answer was lost (injected)", name=name)
            return self._txn(body, what, name, urgency, again)

        def revoke(*args: Any, **kwargs: Any) -> Any:
            self._count()
            return self._revoke(*args, **kwargs)

        monkeypatch.setattr(gateway, "txn", txn)
        monkeypatch.setattr(gateway, "revoke", revoke)

    def _count(self) -> None:
        if self.stashed is not None:
            self._sent_after += 1
            if self._sent_after == self._lands_before:
                self.land()

    def land(self) -> None:
        if self.stashed is not None:
            body, self.stashed = self.stashed, None
            try:
                self.landed = bool(self._txn(body, "extend", None, Urgency.RENEWAL).get("succeeded"))
            except fencelock.BackendError:
                self.landed = False  # its lease was revoked: the server refused it


def _moves_to_another_lease(body: dict[str, Any], locks: Any, name: str | None) -> bool:
    puts = [op["request_put"] for op in body.get("success", ()) if "request_put" in op]
    helds = list(locks.backend._held.values())
    return bool(puts) and len(helds) == 1 and int(puts[0].get("lease", 0)) not in (0, helds[0].lease)


@pytest.mark.parametrize("lands_before", [1, 2, 3, 4])
def test_a_move_that_lands_at_any_point_of_its_settling_never_leaves_a_lease_claiming_a_key_the_server_dropped(
        etcd_server: EtcdServer, name: str, lands_before: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two-worker matrix run (pause, extend to a longer TTL): the move's answer was lost, the settle read our key
    still on the old lease and revoked the new one, and the move, still on its way, landed in between: the revoke
    took our key, while the lease claimed 20 s. Here the move lands before each request of the settle in turn, and
    after all of them. Whatever the order, the lease claims no more than the server keeps, the client knows which
    lease its key is on, and the lock goes on working: extended, released, and taken next by a waiter."""
    locks = fencelock.connect(etcd_server.url)
    other = fencelock.connect(etcd_server.url)
    granted: list[fencelock.Lease] = []
    try:
        lease = locks.acquire(name, ttl=5.0, wait=0, renew=False)
        waiter = threading.Thread(target=lambda: granted.append(other.acquire(name, ttl=5.0, wait=30.0)))
        waiter.start()
        until(lambda: len(keys_of(etcd_server, name)) == 2, 5.0, "the waiter queued")
        late = _LateMove(locks, lands_before, monkeypatch)
        try:
            lease.extend(ttl=20.0)
        except fencelock.BackendError:
            pass  # the move's outcome was still unknown to the client, or it was voided: both keep the old lease
        monkeypatch.undo()
        late.land()  # (a move still on its way lands now, after the whole settle)
        assert late.landed is not None, "the test never held a move back"
        assert lease.held
        assert not lease.lost
        ours = [kv for kv in keys_of(etcd_server, name) if kv["value"] == _b64(lease.token)]
        assert ours, f"the lease claims {lease.remaining():.1f} s, but the server dropped our key"
        on = int(ours[0]["lease"])
        backend: Any = locks.backend
        assert backend._held[lease.token].lease == on, "the client lost track of the lease our key is on"
        assert lease.remaining() <= lease_ttl(etcd_server, on) + 1.0  # (the server's TTL is whole seconds)
        assert not granted
        lease.extend()  # the lock goes on working, without a rebuilt client (it raises if lost)
        assert lease.held
        lease.release()
        waiter.join(10.0)
        assert granted
        assert granted[0].fence > lease.fence
        granted[0].release()
    finally:
        other.close()
        locks.close()


# -- a release sent again -----------------------------------------------------------------------------------------

def test_asyncio_a_release_sent_again_after_a_cancelled_one_went_through_is_released_not_lost(
        etcd_server: EtcdServer, proxy: Proxy, name: str) -> None:
    async def main() -> None:
        locks = fencelock.aio.connect(f"etcd://127.0.0.1:{proxy.port}?timeout=5")
        other = fencelock.aio.connect(etcd_server.url)
        try:
            lease = await locks.acquire(name, ttl=10.0, wait=0)
            waiter = asyncio.ensure_future(other.acquire(name, ttl=10.0, wait=20.0))
            await asyncio.to_thread(until, lambda: len(keys_of(etcd_server, name)) == 2, 5.0, "the waiter queued")
            proxy.delay = 1.0
            release = asyncio.ensure_future(lease.release())
            await asyncio.to_thread(until, lambda: keys_of(etcd_server, name)[0]["value"] != _b64(lease.token),
                                    5.0, "the release was applied")
            release.cancel()  # its answer is still on its way back
            with pytest.raises(asyncio.CancelledError):
                await release
            proxy.delay = 0.0
            taken = await asyncio.wait_for(waiter, 5.0)  # the waiter queued behind us holds the lock now
            await lease.release()  # sent again, as the README says: it finds our key gone, by our own release
            assert not lease.lost
            with pytest.raises(fencelock.LockLost, match="released"):
                lease.ensure()
            await taken.release()
        finally:
            proxy.delay = 0.0
            await other.aclose()
            await locks.aclose()

    asyncio.run(main())


def test_a_release_sent_again_after_one_whose_answer_was_lost_is_released_not_lost(
        etcd_server: EtcdServer, proxy: Proxy, name: str) -> None:
    locks = fencelock.connect(f"etcd://127.0.0.1:{proxy.port}?timeout=1")
    other = fencelock.connect(etcd_server.url)
    try:
        lease = locks.acquire(name, ttl=10.0, wait=0)
        granted: list[fencelock.Lease] = []
        waiter = threading.Thread(target=lambda: granted.append(other.acquire(name, ttl=10.0, wait=20.0)))
        waiter.start()
        until(lambda: len(keys_of(etcd_server, name)) == 2, 5.0, "the waiter queued")
        proxy.delay = 0.7  # the release reaches the server within the 1 s timeout; its answer comes at 1.4 s
        with pytest.raises(fencelock.BackendError) as info:
            lease.release()
        assert info.value.lease is lease
        proxy.delay = 0.0
        waiter.join(5.0)
        assert granted  # our release went through: the waiter behind us got the lock
        lease.release()
        assert not lease.lost
        granted[0].release()
    finally:
        proxy.delay = 0.0
        other.close()
        locks.close()


# -- close right after cancelled acquires -------------------------------------------------------------------------

def test_asyncio_close_right_after_acquires_cancelled_in_flight_gives_their_keys_back_and_leaves_nothing_running(
        etcd_server: EtcdServer, proxy: Proxy, name: str) -> None:
    """The acquires' requests are on the wire when their callers cancel them, and `aclose()` follows at once. It
    waits for those requests and for the give-back that follows each: when it returns, no task of fencelock's is
    left running (one left would connect after the close, and its socket be left open when the loop ends), and no
    key of theirs is left on the server."""
    names = [f"{name}:{i}" for i in range(5)]

    async def main() -> list[asyncio.Future[Any]]:
        locks = fencelock.aio.connect(f"etcd://127.0.0.1:{proxy.port}?timeout=5")
        await (await locks.acquire(f"{name}:warm", ttl=5.0, wait=0)).release()  # (connections open, version asked)
        proxy.delay = 0.5
        tasks = [asyncio.ensure_future(locks.acquire(each, ttl=10.0, wait=0)) for each in names]
        await asyncio.to_thread(until, lambda: proxy.held_back > 0, 5.0, "the acquires' requests are on the wire")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await locks.aclose()
        await asyncio.sleep(0)
        loop = asyncio.get_running_loop()  # (not a task an earlier test's loop left behind in this process)
        return [task for task in _concurrency._background if not task.done() and task.get_loop() is loop]

    try:
        running = asyncio.run(main())
    finally:
        proxy.delay = 0.0
    assert running == [], f"{len(running)} tasks still running after aclose(): {running[:3]}"
    assert [each for each in names if keys_of(etcd_server, each)] == []


def test_a_release_refused_a_connection_leaves_no_doubt_and_is_released_once_the_server_is_back(name: str) -> None:
    """The member is down: the release is refused a connection, so nothing was sent. The error says so to the
    lease (it is not "unsure": a later "taken" would be a loss, not this release's doing), and the release, called
    again once the member is back, deletes our key (decision 2026-12-06-release-claims-nothing)."""
    from fencelock._errors import never_sent

    with EtcdServer() as server:
        locks = fencelock.connect(f"{server.url}?timeout=1")
        try:
            lease = locks.acquire(name, ttl=30.0, wait=0)
            server.kill(0)
            with pytest.raises(fencelock.BackendError) as failed:
                lease.release()
            assert never_sent(failed.value), repr(failed.value)
            assert lease._life.uncertain_at is None  # (no doubt: the server did nothing)
            assert not lease.held  # (the holder asked to be let go: it claims nothing)
            server.restart(0)
            lease.release()
            assert keys_of(server, name) == []
        finally:
            locks.close()
