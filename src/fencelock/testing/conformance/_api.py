"""The API on a healthy service: grants, fences, tokens, `wait`, the context, `extend`, release, and bad input."""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from typing import Any

import pytest

import fencelock

from ..deployment import Deployment
from ..timing import slack
from ._helpers import BAD_ARGUMENTS, BAD_NAMES, _ttl


class ApiTests:
    """The API, its errors and its refusal of bad input; part of `ConformanceSuite`."""

    # -- the API ------------------------------------------------------------------------------------------------

    def test_acquire_gives_a_fenced_lease_and_release_frees_the_lock(self, locks: fencelock.Locks, name: str,
                                                                      deployment: Deployment) -> None:
        asked = time.monotonic()
        lease = locks.acquire(name, ttl=5.0, wait=0)
        assert lease.name == name
        assert isinstance(lease.fence, int)
        assert lease.fence >= 1
        assert len(lease.token) == 32
        assert int(lease.token, 16) >= 0
        # Validity counts from before the request was sent, less the drift (1 % of the TTL + 2 ms): at most
        # 5 - 0.052 s, and at least that from the moment we asked, however long the acquire took.
        remaining, now = lease.remaining(), time.monotonic()
        assert asked + 5.0 - 0.052 - now <= remaining <= 5.0 - 0.052
        assert deployment.holder(name) == lease.token
        assert lease.held
        lease.release()
        assert deployment.holder(name) is None
        assert lease.remaining() == 0.0
        assert not lease.held

    def test_no_repr_or_error_message_shows_the_token(self, locks: fencelock.Locks, name: str,
                                                      deployment: Deployment) -> None:
        lease = locks.acquire(name, ttl=5.0, wait=0)
        assert name in repr(lease)
        assert lease.token not in repr(lease)
        assert lease.token not in str(lease)
        assert lease.token not in repr(locks)
        with pytest.raises(fencelock.NotAcquired) as busy:
            locks.acquire(name, wait=0)
        deployment.steal(name)
        with pytest.raises(fencelock.LockLost) as lost:
            lease.release()
        for error in (busy.value, lost.value):
            assert lease.token not in str(error)
            assert lease.token not in repr(error)
            assert error.name == name

    def test_fences_strictly_increase_with_every_grant(self, locks: fencelock.Locks, name: str) -> None:
        fences = []
        for _ in range(30):
            with locks.lock(name, ttl=5.0, wait=0) as lease:
                fences.append(lease.fence)
        assert fences == sorted(set(fences))
        assert len(fences) == 30

    def test_tokens_are_unique_per_acquisition(self, locks: fencelock.Locks, name: str) -> None:
        tokens = set()
        for _ in range(200):
            lease = locks.acquire(name, ttl=5.0, wait=0)
            tokens.add(lease.token)
            lease.release()
        assert len(tokens) == 200

    def test_a_held_lock_is_refused_with_wait_zero(self, locks: fencelock.Locks, name: str) -> None:
        with locks.lock(name, ttl=5.0):
            with pytest.raises(fencelock.NotAcquired) as info:
                locks.acquire(name, wait=0)
            assert not isinstance(info.value, fencelock.AcquireTimeout)
            assert info.value.name == name

    def test_wait_is_one_deadline_for_all_retries(self, locks: fencelock.Locks, name: str) -> None:
        with locks.lock(name, ttl=10.0):
            # One refused attempt's cost on this deployment, now: a replicated write is an fsync on a majority
            # (etcd, ZooKeeper), which a busy 2-core machine can stretch to tens of milliseconds.
            attempt = 0.0
            for _ in range(3):
                started = time.monotonic()
                with pytest.raises(fencelock.NotAcquired):
                    locks.acquire(name, wait=0)
                attempt = max(attempt, time.monotonic() - started)
            for wait in (0.05, 0.3, 1.0):
                started = time.monotonic()
                with pytest.raises(fencelock.AcquireTimeout) as info:
                    locks.acquire(name, wait=wait)
                took = time.monotonic() - started
                # One deadline: never less than `wait`, and past it by at most the attempt that started just
                # before it plus giving up (a retry loop with a deadline per attempt would overrun by `wait`
                # per retry).
                assert wait <= took < wait + slack(0.1) + 2 * attempt, (wait, took, attempt)
                assert info.value.name == name

    def test_the_context_body_never_runs_without_the_lock(self, locks: fencelock.Locks, name: str) -> None:
        ran = False
        with locks.lock(name, ttl=5.0), pytest.raises(fencelock.NotAcquired), locks.lock(name, wait=0):
            ran = True
        assert not ran

    def test_the_context_releases_on_exit_even_when_the_body_raises(self, locks: fencelock.Locks, name: str,
                                                                     deployment: Deployment) -> None:
        with pytest.raises(RuntimeError, match="boom"), locks.lock(name, ttl=5.0):
            raise RuntimeError("boom")
        assert deployment.holder(name) is None

    def test_extend_resets_the_ttl_and_the_validity(self, locks: fencelock.Locks, name: str,
                                                    deployment: Deployment) -> None:
        first = _ttl(deployment, 0.5)
        lease = locks.acquire(name, ttl=first, wait=0)
        time.sleep(0.6 * first)
        asked = time.monotonic()
        lease.extend(ttl=5.0)
        remaining, now = lease.remaining(), time.monotonic()
        assert asked + 5.0 - 0.052 - now <= remaining <= 5.0 - 0.052  # from before the request, less drift
        assert lease.ttl == 5.0
        server_ttl = deployment.ttl_left(name)
        # The server keeps at least what the lease claims, less the time the look took (a new client connection
        # to a 3-member ensemble can take a few hundred ms on a busy machine).
        assert server_ttl is None or server_ttl > remaining - (time.monotonic() - now) - slack(0.1), server_ttl
        time.sleep(0.6 * first + deployment.expiry_slack)
        assert deployment.holder(name) == lease.token  # outlived the first TTL
        lease.release()

    def test_a_second_release_does_nothing(self, locks: fencelock.Locks, name: str) -> None:
        lease = locks.acquire(name, ttl=5.0, wait=0)
        lease.release()
        lease.release()
        other = locks.acquire(name, ttl=5.0, wait=0)  # a new holder is not disturbed by a late double release
        lease.release()
        with pytest.raises(fencelock.NotAcquired):
            locks.acquire(name, wait=0)
        other.release()

    def test_an_expired_lease_taken_by_another_raises_lock_lost_and_leaves_the_new_holder_alone(
            self, locks: fencelock.Locks, name: str, deployment: Deployment) -> None:
        old = locks.acquire(name, ttl=_ttl(deployment, 0.1), wait=0)
        time.sleep(old.ttl + 0.05 + deployment.expiry_slack)
        new = locks.acquire(name, ttl=5.0, wait=0)
        assert new.fence > old.fence
        with pytest.raises(fencelock.LockLost) as info:
            old.release()
        assert info.value.name == name
        with pytest.raises(fencelock.LockLost):
            old.extend()
        assert deployment.holder(name) == new.token
        new.release()

    def test_an_expired_lease_nobody_took_still_reports_loss_on_release(self, locks: fencelock.Locks, name: str,
                                                                        deployment: Deployment) -> None:
        lease = locks.acquire(name, ttl=_ttl(deployment, 0.05), wait=0)
        time.sleep(lease.ttl + 0.05 + deployment.expiry_slack)
        with pytest.raises(fencelock.LockLost, match="expired"):
            lease.release()

    def test_leases_sharing_a_client_across_threads_cannot_release_each_other(
            self, locks: fencelock.Locks, name: str, deployment: Deployment) -> None:
        """redis-py's async Lock kept the token in a thread-local: one task released another's lock."""
        first = locks.acquire(name, ttl=_ttl(deployment, 0.1), wait=0)
        time.sleep(first.ttl + 0.05 + deployment.expiry_slack)
        second: list[fencelock.Lease] = []
        thread = threading.Thread(target=lambda: second.append(locks.acquire(name, ttl=5.0, wait=0)))
        thread.start()
        thread.join()
        with pytest.raises(fencelock.LockLost):
            first.release()
        with pytest.raises(fencelock.NotAcquired):
            locks.acquire(name, wait=0)  # still held by the second thread's lease
        second[0].release()

    def test_names_with_odd_characters_work_as_given(self, locks: fencelock.Locks) -> None:
        for odd in ("}", "{", "{}", "a}b{c", "%7B", "orders:{42}", "a/b/../c", "ü 1"):
            with locks.lock(odd, ttl=5.0, wait=0) as lease:
                assert lease.name == odd
                with pytest.raises(fencelock.NotAcquired):
                    locks.acquire(odd, wait=0)

    # -- asyncio ------------------------------------------------------------------------------------------------

    def test_asyncio_has_the_same_api(self, deployment: Deployment, name: str) -> None:
        async def main() -> None:
            locks = deployment.aconnect()
            async with locks:
                lease = await locks.acquire(name, ttl=5.0, wait=0)
                assert deployment.holder(name) == lease.token
                assert lease.token not in repr(lease)
                with pytest.raises(fencelock.NotAcquired):
                    await locks.acquire(name, wait=0)
                asked = time.monotonic()
                await lease.extend(2.0)
                remaining, now = lease.remaining(), time.monotonic()
                assert asked + 2.0 - 0.022 - now <= remaining <= 2.0 - 0.022  # from before the request, less drift
                await lease.release()
                assert deployment.holder(name) is None
                async with locks.lock(name, ttl=5.0, wait=0) as second:
                    assert second.fence > lease.fence
                with pytest.raises(fencelock.AcquireTimeout):
                    async with locks.lock(name, ttl=5.0), locks.lock(name, wait=0.2):
                        pass

        asyncio.run(main())

    def test_asyncio_a_client_belongs_to_the_event_loop_that_first_used_it(self, deployment: Deployment,
                                                                           name: str) -> None:
        """Under another loop (a module's client, a second `asyncio.run`) it refuses at once, before anything is
        sent, instead of failing or hanging on connections and a watchdog of a loop that is not running."""
        locks = deployment.aconnect()
        ttl = _ttl(deployment, 1.0)
        first = asyncio.new_event_loop()

        async def hold() -> Any:
            async with locks.lock(name, ttl=ttl, wait=slack(5.0)) as lease:
                await asyncio.sleep(ttl * 1.2)  # past its TTL: renewed by this loop's watchdog
                lease.ensure()
                assert deployment.holder(name) == lease.token
            return await locks.acquire(name + ":kept", ttl=ttl * 10, wait=0)

        try:
            kept = first.run_until_complete(hold())

            async def elsewhere() -> None:
                with pytest.raises(fencelock.LockError, match="event loop") as refused:
                    await locks.acquire(name, wait=0)
                assert type(refused.value) is fencelock.LockError
                assert refused.value.name == name
                with pytest.raises(fencelock.LockError, match="event loop"):
                    await kept.release()
                with pytest.raises(fencelock.LockError, match="event loop"):
                    await locks.status(name)

            asyncio.run(elsewhere())
            assert deployment.holder(name) is None
            assert deployment.holder(name + ":kept") == kept.token  # refused, and kept: it can still be released
            first.run_until_complete(kept.release())
            assert deployment.holder(name + ":kept") is None
        finally:
            first.run_until_complete(locks.aclose())
            first.close()

    def test_a_closed_client_refuses_new_work_before_anything_is_sent(self, deployment: Deployment,
                                                                      name: str) -> None:
        """Its watchdog has stopped, so a lease it granted would be neither renewed nor reported lost."""
        locks = deployment.connect()
        locks.close()
        alocks = deployment.aconnect()
        asyncio.run(alocks.aclose())

        def refused(call: Any) -> None:
            with pytest.raises(fencelock.LockError, match="closed") as info:
                call()
            assert type(info.value) is fencelock.LockError
            assert info.value.name == name

        refused(lambda: locks.acquire(name, wait=0))
        refused(lambda: locks.lock(name, wait=0).__enter__())
        refused(lambda: locks.status(name))
        refused(lambda: locks.force_release(name))
        refused(lambda: asyncio.run(alocks.acquire(name, wait=0)))
        refused(lambda: asyncio.run(alocks.lock(name, wait=0).__aenter__()))
        refused(lambda: asyncio.run(alocks.status(name)))
        with pytest.raises(fencelock.LockError, match="closed"):
            locks.list()
        assert deployment.holder(name) is None

    # -- bad input ----------------------------------------------------------------------------------------------

    def test_bad_input_is_refused_before_anything_is_sent(self, own_deployment: Deployment, name: str) -> None:
        """While the service is stalled: anything sent would hang until a `BackendError`, so an instant
        ValueError/TypeError that names the argument and the lock proves nothing was sent."""
        deployment = own_deployment
        locks = deployment.connect()
        lease = locks.acquire(name + ":held", ttl=10.0, wait=0)  # a connection exists, and goes silent below
        bad_ttl = rf"ttl .*lock '{re.escape(lease.name)}'"

        async def main() -> None:
            alocks = deployment.aconnect()
            try:
                deployment.pause()
                try:
                    started = time.monotonic()
                    for kwargs, error, arg in BAD_ARGUMENTS:
                        where = rf"{arg} .*lock '{re.escape(name)}'"
                        with pytest.raises(error, match=where):
                            locks.acquire(name, **kwargs)
                        with pytest.raises(error, match=where):
                            locks.lock(name, **kwargs)
                        with pytest.raises(error, match=where):
                            await alocks.acquire(name, **kwargs)
                        with pytest.raises(error, match=where):
                            alocks.lock(name, **kwargs)
                    for bad, error in BAD_NAMES:
                        with pytest.raises(error, match="name"):
                            locks.acquire(bad)
                        with pytest.raises(error, match="name"):
                            locks.lock(bad)
                        with pytest.raises(error, match="name"):
                            await alocks.acquire(bad)
                    with pytest.raises(TypeError, match=rf"on_lost .*lock '{re.escape(name)}'"):
                        locks.acquire(name, on_lost=42)  # type: ignore[arg-type]
                    with pytest.raises(TypeError, match="fair must be True or False"):
                        locks.acquire(name, fair="yes")  # type: ignore[arg-type]
                    for bad_ttl_value in (0, -1, math.nan, True):
                        with pytest.raises((ValueError, TypeError), match=bad_ttl):
                            lease.extend(bad_ttl_value)
                    took = time.monotonic() - started
                    assert took < slack(1.0), f"bad input took {took:.2f} s to refuse: something was sent"
                finally:
                    deployment.resume()
            finally:
                await alocks.aclose()

        try:
            asyncio.run(main())
            assert lease.remaining() > 8.0  # the lease was kept through the refused extends
            lease.release()
        finally:
            locks.close()
