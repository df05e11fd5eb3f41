"""Liveness: renewal, the loss signal (sync and asyncio), forked children, and a stalled service."""

from __future__ import annotations

import asyncio
import os
import time
import warnings

import pytest

import fencelock

from ..deployment import Deployment
from ..timing import slack
from ._helpers import _ttl, _wait_until


class LivenessTests:
    """Leases renewed, lost and reported on time, whatever the process or the service does; part of
    `ConformanceSuite`."""

    # -- renewal and the loss signal ----------------------------------------------------------------------------

    def test_renewal_keeps_a_short_lease_alive_through_five_times_its_ttl(self, deployment: Deployment,
                                                                          name: str) -> None:
        ttl = _ttl(deployment, 1.0)
        locks = deployment.connect()
        try:
            with locks.lock(name, ttl=ttl, wait=0) as lease:
                for _ in range(50):
                    time.sleep(ttl / 10)
                    lease.ensure()
                assert deployment.holder(name) == lease.token
                assert lease.remaining() > ttl / 2
            assert deployment.holder(name) is None
            assert locks.watchdog.renewals >= 12  # every ttl/3 for 5 TTLs: about 15
        finally:
            locks.close()

    def test_a_renewed_lease_extended_to_a_shorter_ttl_is_renewed_at_the_new_ttls_pace(
            self, deployment: Deployment, name: str) -> None:
        short = _ttl(deployment, 0.5)
        locks = deployment.connect()
        try:
            lease = locks.acquire(name, ttl=8 * short, wait=0, renew=True)
            lease.extend(ttl=short)
            time.sleep(3 * short)  # the old pace (every 8/3 of it) would come after the new TTL had run out
            assert not lease.lost
            assert deployment.holder(name) == lease.token
            lease.release()
        finally:
            locks.close()

    def test_explicit_leases_renew_only_when_asked(self, deployment: Deployment, name: str) -> None:
        ttl = _ttl(deployment, 0.5)
        locks = deployment.connect()
        try:
            plain = locks.acquire(name, ttl=ttl, wait=0)
            renewed = locks.acquire(name + ":r", ttl=ttl, wait=0, renew=True)
            time.sleep(2 * ttl)
            assert plain.lost  # its validity ran out: nobody renewed it
            assert not renewed.lost
            assert deployment.holder(name + ":r") == renewed.token
            renewed.release()
            with pytest.raises(fencelock.LockLost):
                plain.release()
        finally:
            locks.close()

    def test_a_stolen_lock_is_noticed_within_one_renewal_interval_sync(self, deployment: Deployment,
                                                                       name: str) -> None:
        ttl = _ttl(deployment, 1.5)
        locks = deployment.connect()
        told: list[float] = []
        try:
            with pytest.raises(fencelock.LockLost), locks.lock(  # noqa: PT012
                    name, ttl=ttl, wait=0, on_lost=lambda _: told.append(time.monotonic())) as lease:
                time.sleep(0.1)
                stolen_at = time.monotonic()
                deployment.steal(name)
                while not lease.lost and time.monotonic() < stolen_at + 2 * ttl:
                    time.sleep(0.01)
                noticed = time.monotonic() - stolen_at
                with pytest.raises(fencelock.LockLost):
                    lease.ensure()
                # The body goes on (a thread cannot be interrupted safely); leaving it raises LockLost.
            assert noticed <= ttl / 3 + slack(0.15)  # within one renewal interval (ttl/3)
            assert len(told) == 1             # called once, although the exit saw the loss too
        finally:
            locks.close()

    def test_ensure_raises_once_the_lease_is_lost(self, deployment: Deployment, name: str) -> None:
        ttl = _ttl(deployment, 1.5)
        locks = deployment.connect()
        try:
            lease = locks.acquire(name, ttl=ttl, wait=0, renew=True)
            lease.ensure()
            stolen_at = time.monotonic()
            deployment.steal(name)
            # The next renewal (ttl/3) hears that the key is gone; on a busy machine a renewal that got no answer
            # in time is retried while validity remains, and the retry hears it.
            while not lease.lost and time.monotonic() < stolen_at + 0.9 * ttl:
                time.sleep(0.01)
            assert lease.lost
            with pytest.raises(fencelock.LockLost, match="deleted or taken"):
                lease.ensure()
        finally:
            locks.close()

    def test_asyncio_body_is_cancelled_with_lock_lost(self, deployment: Deployment, name: str) -> None:
        ttl = _ttl(deployment, 1.5)

        async def main() -> None:
            locks = deployment.aconnect()
            told: list[str] = []
            reached_end = False
            started = time.monotonic()

            async def critical_section() -> None:
                nonlocal reached_end
                async with locks.lock(name, ttl=ttl, wait=0, on_lost=lambda lease: told.append(lease.name)):
                    await asyncio.sleep(0.1)
                    deployment.steal(name)
                    await asyncio.sleep(5.0 * ttl)  # cancelled long before this ends
                    reached_end = True

            try:
                with pytest.raises(fencelock.LockLost) as info:
                    await critical_section()
                assert not reached_end
                assert time.monotonic() - started < 0.1 + ttl / 3 + slack(0.3)
                assert isinstance(info.value.__cause__, asyncio.CancelledError)
                assert told == [name]
                # The task itself is not left cancelled: it carries on after handling LockLost.
                await asyncio.sleep(0.01)
            finally:
                await locks.aclose()

        asyncio.run(main())

    def test_asyncio_cancel_on_lost_can_be_turned_off(self, deployment: Deployment, name: str) -> None:
        ttl = _ttl(deployment, 1.5)

        async def main() -> None:
            locks = deployment.aconnect()
            finished = False

            async def critical_section() -> None:
                nonlocal finished
                async with locks.lock(name, ttl=ttl, wait=0, cancel_on_lost=False) as lease:
                    deployment.steal(name)
                    await asyncio.sleep(ttl / 3 + 0.3)
                    assert lease.lost
                    finished = True

            try:
                with pytest.raises(fencelock.LockLost):
                    await critical_section()
                assert finished
            finally:
                await locks.aclose()

        asyncio.run(main())

    # -- fork ---------------------------------------------------------------------------------------------------

    @staticmethod
    def _fork() -> int:
        with warnings.catch_warnings():  # Python 3.12 warns about forking a process that has threads
            warnings.simplefilter("ignore", DeprecationWarning)
            return os.fork()

    def test_a_forked_child_never_releases_its_parents_lease(self, locks: fencelock.Locks, name: str,
                                                             deployment: Deployment) -> None:
        lease = locks.acquire(name, ttl=10.0, wait=0)
        pid = self._fork()
        if pid == 0:  # the child: an explicit release is refused, and leaving the context releases nothing
            code = 3
            try:
                code = 0
                try:
                    lease.release()
                    code = 1
                except fencelock.LockError:
                    pass
                try:
                    lease.extend()
                    code = 2
                except fencelock.LockError:
                    pass
                with lease:
                    pass
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert deployment.holder(name) == lease.token
        lease.release()

    def test_a_forked_child_never_renews_its_parents_leases(self, deployment: Deployment, name: str) -> None:
        ttl = _ttl(deployment, 0.6)
        locks = deployment.connect()
        try:
            parent = locks.acquire(name, ttl=ttl, wait=0, renew=True)
            pid = self._fork()
            if pid == 0:
                code = 3
                try:
                    child = locks.acquire(name + ":child", ttl=ttl, wait=0, renew=True)  # the child's own watchdog
                    time.sleep(2.5 * ttl)
                    code = 1 if child.lost else 0
                    child.release()
                finally:
                    os._exit(code)
            locks.watchdog.close()  # the parent stops renewing; only the child could keep `parent` alive now
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, "the child's own lease was not renewed"
            assert parent.lost  # and the child did not renew its parent's lease, which expired
            _wait_until(lambda: deployment.holder(name) is None, deployment.expiry_slack + 0.5,
                        "the expiry of the parent's lease")
        finally:
            locks.close()

    # -- a stalled service ------------------------------------------------------------------------------------

    def test_asyncio_cancelling_acquire_after_the_request_went_out_leaves_no_lock(self, own_deployment: Deployment,
                                                                                  name: str) -> None:
        deployment = own_deployment

        async def main() -> None:
            locks = deployment.aconnect()
            try:
                warm = await locks.acquire(name + ":warm", wait=0)
                await warm.release()
                first = await locks.acquire(name, ttl=10.0, wait=0)
                await first.release()
                deployment.pause()
                try:
                    task = asyncio.ensure_future(locks.acquire(name, ttl=10.0, wait=None))
                    await asyncio.sleep(0.2)  # the acquire is on the wire, the servers are frozen
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                finally:
                    deployment.resume()
                # The servers now run the acquire (granting it); the undo follows it and gives the lock back, long
                # before the 10 s TTL. (A look for "no key" could come before a server ran the frozen request.)
                lease = await locks.acquire(name, ttl=5.0, wait=slack(5.0))
                assert lease.fence > first.fence
                await lease.release()
                # Nothing is left behind: a release returns at its quorum, the other nodes' parts land just after.
                ends = time.monotonic() + slack(2.0)
                for _ in range(1000):
                    if (deployment.holder(name) is None and not deployment.leftovers(name)) or time.monotonic() > ends:
                        break
                    await asyncio.sleep(0.02)
                assert deployment.holder(name) is None
                assert not deployment.leftovers(name), deployment.leftovers(name)
            finally:
                await locks.aclose()

        asyncio.run(main())

    def test_asyncio_cancelling_release_leaves_the_lease_releasable(self, own_deployment: Deployment,
                                                                    name: str) -> None:
        deployment = own_deployment

        async def main() -> None:
            locks = deployment.aconnect()
            try:
                lease = await locks.acquire(name, ttl=10.0, wait=0)
                deployment.pause()
                try:
                    task = asyncio.ensure_future(lease.release())
                    await asyncio.sleep(0.2)
                    task.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await task
                finally:
                    deployment.resume()
                await lease.release()  # no error: released now, or by the cancelled call, never lost
                assert deployment.holder(name) is None
            finally:
                await locks.aclose()

        asyncio.run(main())

    def test_a_paused_service_gives_a_backend_error_in_bounded_time(self, own_deployment: Deployment,
                                                                    name: str) -> None:
        deployment = own_deployment
        locks = deployment.connect()
        try:
            locks.acquire(name + ":warm", ttl=5.0, wait=0)  # a pooled connection exists and goes silent below
            deployment.pause()
            try:
                started = time.monotonic()
                with pytest.raises(fencelock.BackendError) as info:
                    locks.acquire(name, ttl=5.0, wait=1.0)
                took = time.monotonic() - started
                assert took < 1.0 + deployment.stall_timeout + slack(0.5), took
                assert info.value.name == name
                # the client library's error is chained; Redlock's names how many nodes answered instead
                assert (isinstance(info.value.__cause__, Exception)
                        or isinstance(info.value, fencelock.QuorumUnavailable))
            finally:
                deployment.resume()
        finally:
            locks.close()

    def test_a_paused_service_makes_the_lease_lost_on_time(self, own_deployment: Deployment, name: str) -> None:
        """The network gives no answer at all: the local monotonic clock still says when the lease is gone."""
        deployment = own_deployment
        locks = deployment.connect()
        told: list[float] = []
        try:
            lease = locks.acquire(name, ttl=_ttl(deployment, 1.0), wait=0, renew=True,
                                  on_lost=lambda _: told.append(time.monotonic()))
            deployment.pause()
            try:
                paused_at = time.monotonic()
                valid_until = lease._valid_until
                while not told and time.monotonic() < paused_at + 3.0 * lease.ttl:
                    time.sleep(0.01)
                assert told, "on_lost was not called while the service was paused"
                assert lease.lost
                assert valid_until - 0.05 <= told[0] <= valid_until + 0.15
            finally:
                deployment.resume()
            with pytest.raises(fencelock.LockLost):
                lease.release()
        finally:
            locks.close()
