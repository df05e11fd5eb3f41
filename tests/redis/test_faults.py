"""Faults injected into the Redis family (SIGSTOP, SIGKILL, script cache loss), bad input, and credentials. What
every backend shares (a paused service, cancelled requests, bad input) is in the conformance suite."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

import fencelock
import fencelock.aio
from fencelock._redis.keys import redis_keys
from fencelock.testing.servers import RedisServer, free_port
from fencelock.testing.timing import slack
from tests.conftest import RedisFamily, lock_value, until


def test_a_dead_server_gives_a_backend_error_at_once(name: str) -> None:
    locks = fencelock.connect(f"redis://127.0.0.1:{free_port()}/0")
    started = time.monotonic()
    for wait in (0, 1.0, None):
        with pytest.raises(fencelock.BackendError, match="ConnectionError"):
            locks.acquire(name, wait=wait)
    assert time.monotonic() - started < slack(1.0)


def _down_errors(name: str, make: Any) -> tuple[list[str], list[float]]:
    """The messages and durations of an acquire on a server that is down, sync then asyncio (`make(front)` gives
    the connect target, a URL or a redis-py client)."""
    messages: list[str] = []
    took: list[float] = []
    started = time.monotonic()
    with fencelock.connect(make("sync")) as locks, pytest.raises(fencelock.BackendError) as info:
        locks.acquire(name, wait=1.0)
    took.append(time.monotonic() - started)
    messages.append(str(info.value))

    async def main() -> None:
        started = time.monotonic()
        async with fencelock.aio.connect(make("asyncio")) as locks:
            with pytest.raises(fencelock.BackendError) as info:
                await locks.acquire(name, wait=1.0)
        took.append(time.monotonic() - started)
        messages.append(str(info.value))

    asyncio.run(main())
    return messages, took


@pytest.mark.parametrize("given", ["url", "client"])
def test_a_down_server_gives_both_fronts_one_clear_error_in_bounded_time(name: str, given: str) -> None:
    """Invariant: sync and asyncio say the same (where, what), never a password, within the wait; a redis-py
    client passed in (whose default Retry backs off for seconds between connects) too."""
    import redis
    import redis.asyncio

    port = free_port()

    def make(front: str) -> Any:
        if given == "url":
            return f"redis://user:hunter2@127.0.0.1:{port}/0"
        kind = redis.Redis if front == "sync" else redis.asyncio.Redis
        return kind(host="127.0.0.1", port=port, username="user", password="hunter2")

    messages, took = _down_errors(name, make)
    where = f"redis://user:***@127.0.0.1:{port}/0" if given == "url" else f"redis at 127.0.0.1:{port}"
    for message in messages:
        assert "hunter2" not in message
        assert message.startswith(f"acquire failed on {where}: ConnectionError: Error 111 connecting to "
                                  f"127.0.0.1:{port}."), message
        assert message.endswith(f"(lock {name!r})")
    assert all(seconds < slack(1.5) for seconds in took), took


def test_a_down_cluster_gives_both_fronts_the_same_clear_error_in_bounded_time(name: str) -> None:
    """The sync Cluster client reads the layout at connect (so it fails there), asyncio's at the first request:
    both name the address (no password) and redis-py's error, within the connect timeout."""
    port = free_port()
    url = f"redis+cluster://user:hunter2@127.0.0.1:{port}?socket_timeout=0.5"
    shown = f"redis+cluster://user:***@127.0.0.1:{port}?socket_timeout=0.5"
    started = time.monotonic()
    with pytest.raises(fencelock.BackendError) as sync_error:
        fencelock.connect(url)
    took = [time.monotonic() - started]

    async def main() -> str:
        started = time.monotonic()
        async with fencelock.aio.connect(url) as locks:
            with pytest.raises(fencelock.BackendError) as info:
                await locks.acquire(name, wait=1.0)
        took.append(time.monotonic() - started)
        return str(info.value)

    for message in (str(sync_error.value), asyncio.run(main())):
        assert "hunter2" not in message
        assert f"{shown}: RedisClusterUnreachableError: Redis Cluster cannot be connected" in message, message
    assert all(seconds < slack(1.5) for seconds in took), took


def _release_while_stopped(server: RedisServer, name: str) -> tuple[fencelock.Locks, fencelock.Lease]:
    """Acquire, then try to release while the server is stopped: the release times out without a reply."""
    locks = fencelock.connect(server.url + "?socket_timeout=0.3")
    lease = locks.acquire(name, ttl=10.0, wait=0)
    # The release is written on a connection already made, so it reaches the stopped server: once the grant's
    # background check (eviction policy) has given its connection back. (One that must connect first never leaves
    # the client: that release is known not to have gone through.)
    channel: Any = locks.backend._channel  # type: ignore[attr-defined]
    until(lambda: channel._idle and len(channel._idle) == len(channel._open), 5.0, "the connections are idle")
    server.pause()
    try:
        with pytest.raises(fencelock.BackendError):
            lease.release()
        with pytest.raises(fencelock.LockLost, match="release may have gone through"):
            lease.extend()  # in doubt: nothing is sent
    finally:
        server.resume()
    return locks, lease


def test_a_failed_release_keeps_the_token_and_can_be_retried(own_server: RedisServer, name: str) -> None:
    """redis-py's sync Lock dropped the token before the server confirmed: the lock could never be released."""
    locks, lease = _release_while_stopped(own_server, name)
    assert lease.remaining() == 0.0  # its release may have gone through: it claims nothing until it is settled
    assert not lease.held
    assert lock_value(own_server.client(), name) == lease.token
    lease.release()
    assert lock_value(own_server.client(), name) is None
    locks.close()


def test_a_release_that_got_no_reply_is_not_reported_as_a_loss_if_the_key_went(own_server: RedisServer,
                                                                              name: str) -> None:
    """A release timed out; by the retry the key is gone and nobody took the lock: our release did its job
    (or the key expired after it was sent in time); either way no other holder was ever granted."""
    locks, lease = _release_while_stopped(own_server, name)
    own_server.client().delete(redis_keys(name).lock)  # as if the timed-out release had run
    lease.release()
    lease.release()
    locks.close()


def test_a_release_that_got_no_reply_and_finds_a_new_holder_is_released(own_server: RedisServer, name: str) -> None:
    """The retry finds another token: our first release most likely ran and a waiter took the lock after it
    (decision 2026-12-05-release-retried-with-a-waiter). Released, and the new holder's key is untouched."""
    locks, lease = _release_while_stopped(own_server, name)
    own_server.client().delete(redis_keys(name).lock)  # as if the timed-out release had run
    other = locks.acquire(name, ttl=10.0, wait=0)
    lease.release()
    assert lock_value(own_server.client(), name) == other.token
    other.release()
    locks.close()


def test_acquire_survives_a_server_restart_between_calls(own_server: RedisServer, name: str) -> None:
    locks = fencelock.connect(own_server.url)
    before = locks.acquire(name + ":before", ttl=5.0, wait=0)  # leaves a pooled connection
    before.release()
    own_server.kill()
    own_server.restart()  # the pooled connection is now dead; one retry on a fresh one is safe
    assert own_server.client().dbsize() == 0  # the server came back empty (no persistence)
    lease = locks.acquire(name, ttl=5.0, wait=0)
    assert lease.fence > before.fence  # the clock floor, not a counter started again at 1
    lease.release()
    locks.close()


def test_scripts_are_loaded_again_after_the_server_forgets_them(locks: fencelock.Locks, name: str,
                                                                deployment: RedisFamily) -> None:
    first = locks.acquire(name, ttl=5.0, wait=0)
    first.release()
    for raw in deployment.raws():
        raw.script_flush()
    with locks.lock(name, ttl=5.0, wait=0) as lease:
        assert lease.fence > first.fence


# -- bad input: rejected before anything is sent (on a stalled service, too: see the conformance suite) -----------

NOWHERE = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens: anything actually sent would be a BackendError


@pytest.mark.parametrize(("kwargs", "error", "arg"), [
    ({"ttl": 0}, ValueError, "ttl"), ({"ttl": -1.0}, ValueError, "ttl"), ({"ttl": math.nan}, ValueError, "ttl"),
    ({"ttl": math.inf}, ValueError, "ttl"), ({"ttl": True}, TypeError, "ttl"), ({"ttl": "30"}, TypeError, "ttl"),
    ({"ttl": None}, TypeError, "ttl"), ({"wait": -1}, ValueError, "wait"), ({"wait": math.nan}, ValueError, "wait"),
    ({"wait": False}, TypeError, "wait"), ({"wait": "5"}, TypeError, "wait"),
])
def test_bad_arguments_are_rejected_before_anything_is_sent(kwargs: dict[str, Any], error: type[Exception],
                                                            arg: str) -> None:
    locks = fencelock.connect(NOWHERE)
    with pytest.raises(error, match=rf"{arg} .*lock 'orders:42'"):
        locks.acquire("orders:42", **kwargs)
    with pytest.raises(error, match=rf"{arg} .*lock 'orders:42'"):
        locks.lock("orders:42", **kwargs)

    async def main() -> None:
        with pytest.raises(error, match=rf"{arg} .*lock 'orders:42'"):
            await fencelock.aio.connect(NOWHERE).acquire("orders:42", **kwargs)

    asyncio.run(main())


@pytest.mark.parametrize(("bad", "error"), [("", ValueError), (None, TypeError), (42, TypeError),
                                            (b"orders", TypeError)])
def test_bad_names_are_rejected_before_anything_is_sent(bad: Any, error: type[Exception]) -> None:
    locks = fencelock.connect(NOWHERE)
    with pytest.raises(error, match="name"):
        locks.acquire(bad)
    with pytest.raises(error, match="name"):
        locks.lock(bad)


@pytest.mark.parametrize("url", ["", "localhost:6379", "http://127.0.0.1", "redis://127.0.0.1:70000",
                                 "redis://127.0.0.1/x", "redis://127.0.0.1?nonsense=1", 6379])
def test_malformed_urls_fail_at_connect(url: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="url"):
        fencelock.connect(url)
    with pytest.raises((ValueError, TypeError), match="url"):
        fencelock.aio.connect(url)


def test_the_wrong_kind_of_redis_client_is_a_type_error(deployment: RedisFamily) -> None:
    import redis.asyncio

    with pytest.raises(TypeError, match=r"fencelock\.aio\.connect"):
        fencelock.connect(redis.asyncio.Redis())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"fencelock\.connect"):
        fencelock.aio.connect(deployment.redis_target())


# -- credentials ----------------------------------------------------------------------------------------------

def test_acl_user_and_password_come_in_through_the_url(own_server: RedisServer, name: str) -> None:
    admin: Any = own_server.client()
    admin.execute_command("ACL", "SETUSER", "app", "on", ">s3cret-pw", "~fencelock:*", "+@all")
    locks = fencelock.connect(f"redis://app:s3cret-pw@127.0.0.1:{own_server.port}/0")
    with locks.lock(name, ttl=5.0, wait=0) as lease:
        assert lease.fence >= 1
    locks.close()
    wrong = fencelock.connect(f"redis://app:wrong-pw@127.0.0.1:{own_server.port}/0")
    with pytest.raises(fencelock.BackendError) as info:
        wrong.acquire(name, wait=0)
    assert "wrong-pw" not in str(info.value)
    assert "s3cret" not in str(info.value)
    wrong.close()



def test_asyncio_an_acquire_cancelled_in_its_back_off_leaves_no_key(own_server: RedisServer,
                                                                   monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The first attempt ran on the server but its reply was lost with a reset, and so was its one resend's; the
    acquire backs off to try again, and is cancelled there, outside any request. The attempt is forgotten all the
    same: the lock is free long before the key's TTL, and an independent client finds no key."""
    import fencelock._async.client as client_module
    from fencelock.testing.faults import RESET_AFTER, FaultProxy, Rule

    backing_off = asyncio.Event()

    async def long_back_off(seconds: float) -> None:
        backing_off.set()
        await asyncio.sleep(30.0)  # (the test cancels it)

    monkeypatch.setattr(client_module, "sleep", long_back_off)
    with FaultProxy("127.0.0.1", own_server.port) as proxy:

        async def main() -> None:
            locks = fencelock.aio.connect(f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=2")
            try:
                rules = [proxy.arm(Rule(RESET_AFTER, "acquire", nth=k)) for k in (1, 2)]
                task = asyncio.ensure_future(locks.acquire(name, ttl=30.0, wait=None))
                await asyncio.wait_for(backing_off.wait(), slack(5.0))
                assert all(rule.hit.is_set() for rule in rules)
                assert lock_value(own_server.client(), name) is not None  # the attempt ran: a key to forget
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                lease = await locks.acquire(name, ttl=5.0, wait=slack(5.0))
                await lease.release()
                assert lock_value(own_server.client(), name) is None
            finally:
                await locks.aclose()

        asyncio.run(main())


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_renewal_batch_that_fails_past_the_error_boundary_still_ends(own_server: RedisServer, name: str,
                                                                        front: str) -> None:
    """A renewal that fails with what no backend should raise (a client library's RuntimeError) counts as no
    answer: the lease is lost on time, `on_lost` is told, and its release does not wait for that batch for ever."""
    lost: list[Any] = []

    def broken(leases: Any) -> Any:
        raise RuntimeError("escaped the backend's error boundary")

    async def abroken(leases: Any) -> Any:
        broken(leases)

    if front == "sync":
        locks = fencelock.connect(own_server.url)
        locks.backend.extend_many = broken  # type: ignore[method-assign]
        lease = locks.acquire(name, ttl=0.3, wait=0, renew=True, on_lost=lost.append)
        time.sleep(0.45)
        assert lost == [lease]
        assert lease.lost
        with pytest.raises(fencelock.LockLost):
            lease.release()
        locks.close()
    else:
        async def main() -> None:
            alocks = fencelock.aio.connect(own_server.url)
            alocks.backend.extend_many = abroken  # type: ignore[method-assign]
            lease = await alocks.acquire(name, ttl=0.3, wait=0, renew=True, on_lost=lost.append)
            await asyncio.sleep(0.45)
            assert lost == [lease]
            with pytest.raises(fencelock.LockLost):
                await asyncio.wait_for(lease.release(), slack(1.0))
            await alocks.aclose()

        asyncio.run(main())


def _acquire_through(proxy_port: int, front: str, name: str, ttl: float) -> fencelock.Lease | fencelock.aio.Lease:
    url = f"redis://127.0.0.1:{proxy_port}/0?socket_timeout=5"
    if front == "sync":
        with fencelock.connect(url) as locks:
            return locks.acquire(name, ttl=ttl, wait=0)

    async def main() -> fencelock.aio.Lease:
        async with fencelock.aio.connect(url) as locks:
            return await locks.acquire(name, ttl=ttl, wait=0)

    return asyncio.run(main())


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_grant_that_came_after_its_ttl_is_given_back_and_tried_again_never_reported_busy(
        own_server: RedisServer, name: str, front: str) -> None:
    """A reply that took longer than the TTL: the key is given back (nobody held the lock), and with wait=0 the
    acquire tries once more at once and gets it, instead of claiming the lock "is held by another holder"."""
    from fencelock.testing.faults import LATE, FaultProxy, Rule

    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        rule = proxy.arm(Rule(LATE, "acquire", delay=0.3))
        since = time.monotonic()
        lease = _acquire_through(proxy.port, front, name, ttl=0.2)
        assert rule.hit.is_set()
        sent = [n for n in proxy.names(since) if n in ("acquire", "release")]
        runs = [n for k, n in enumerate(sent) if k == 0 or sent[k - 1] != n]  # (a NOSCRIPT's EVAL is the same run)
        assert runs == ["acquire", "release", "acquire"]
        # An independent client: the key is the second attempt's, with the same token (the grant is the lease's).
        assert lock_value(own_server.client(), name) == lease.token


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_grants_that_keep_coming_after_their_ttl_raise_backend_error_and_leave_no_key(
        own_server: RedisServer, name: str, front: str) -> None:
    from fencelock.testing.faults import LATE, FaultProxy, Rule

    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        for k in (1, 2):
            proxy.arm(Rule(LATE, "acquire", nth=k, delay=0.3))
        with pytest.raises(fencelock.BackendError, match="granted too late") as caught:
            _acquire_through(proxy.port, front, name, ttl=0.2)
        assert not isinstance(caught.value, fencelock.NotAcquired)
        assert caught.value.name == name
        assert lock_value(own_server.client(), name) is None  # both grants were given back, not left to the TTL


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_an_extend_confirmed_after_its_ttl_ran_out_raises_lock_lost_and_claims_nothing(
        own_server: RedisServer, name: str, front: str) -> None:
    """The server applied the extend, but its reply came after the TTL it asked for: the lease is lost by then,
    and extend() says so (before, it returned as if the lease had been extended)."""
    from fencelock.testing.faults import LATE, FaultProxy, Rule

    url_of = "redis://127.0.0.1:{}/0?socket_timeout=5"
    lost: list[object] = []
    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        if front == "sync":
            with fencelock.connect(url_of.format(proxy.port)) as locks:
                lease = locks.acquire(name, ttl=10.0, wait=0, on_lost=lost.append)
                rule = proxy.arm(Rule(LATE, "extend", delay=0.3))
                with pytest.raises(fencelock.LockLost, match="after its TTL") as caught:
                    lease.extend(0.2)
                assert lease.remaining() == 0.0
                with pytest.raises(fencelock.LockLost):
                    lease.ensure()
        else:
            async def main() -> tuple[Any, Any, Any]:
                async with fencelock.aio.connect(url_of.format(proxy.port)) as locks:
                    lease = await locks.acquire(name, ttl=10.0, wait=0, on_lost=lost.append)
                    rule = proxy.arm(Rule(LATE, "extend", delay=0.3))
                    with pytest.raises(fencelock.LockLost, match="after its TTL") as caught:
                        await lease.extend(0.2)
                    assert lease.remaining() == 0.0
                    with pytest.raises(fencelock.LockLost):
                        lease.ensure()
                    return lease, rule, caught

            lease, rule, caught = asyncio.run(main())
    assert rule.hit.is_set()
    assert caught.value.name == name
    assert lost == [lease]
    # An independent client: the key the late extend set has expired, and another holder may take the lock.
    assert lock_value(own_server.client(), name) is None
