"""Lease liveness on real servers: renewal keeps a lease alive, and loss reaches the holder at once, through the
flag, `ensure()`, the `on_lost` callback, the asyncio body's cancellation and the sync block's exit."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import fencelock
from fencelock._logic.keys import redis_keys
from fencelock.testing.servers import RedisServer

from .conftest import Deployment, lock_value


def _steal(deployment: Deployment, name: str, how: str) -> None:
    """Another client deletes the key, or overwrites it with its own token, behind the holder's back."""
    for raw in deployment.raws():
        if how == "delete":
            raw.delete(redis_keys(name).lock)
        else:
            raw.set(redis_keys(name).lock, "someone-else", px=60_000)


def test_renewal_keeps_a_one_second_lease_alive_through_five_seconds_of_work(deployment: Deployment,
                                                                            name: str) -> None:
    locks = fencelock.connect(deployment.url)
    with locks.lock(name, ttl=1.0, wait=0) as lease:
        for _ in range(50):
            time.sleep(0.1)
            lease.ensure()
        assert deployment.holder(name) == lease.token
        assert lease.remaining() > 0.5
    assert deployment.holder(name) is None
    assert locks.watchdog.renewals >= 12  # every ttl/3 for 5 s: about 15
    locks.close()


def test_explicit_leases_renew_only_when_asked(deployment: Deployment, name: str) -> None:
    locks = fencelock.connect(deployment.url)
    plain = locks.acquire(name, ttl=0.5, wait=0)
    renewed = locks.acquire(name + ":r", ttl=0.5, wait=0, renew=True)
    time.sleep(1.0)
    assert plain.lost  # its validity ran out: nobody renewed it
    assert not renewed.lost
    assert deployment.holder(name + ":r") == renewed.token
    renewed.release()
    with pytest.raises(fencelock.LockLost):
        plain.release()
    locks.close()


@pytest.mark.parametrize("how", ["delete", "overwrite"])
def test_a_stolen_lock_is_noticed_within_one_renewal_interval_sync(deployment: Deployment, name: str,
                                                                  how: str) -> None:
    locks = fencelock.connect(deployment.url)
    told: list[float] = []
    with pytest.raises(fencelock.LockLost), locks.lock(name, ttl=1.5, wait=0,  # noqa: PT012
                                                       on_lost=lambda _: told.append(time.monotonic())) as lease:
        time.sleep(0.1)
        stolen_at = time.monotonic()
        _steal(deployment, name, how)
        while not lease.lost and time.monotonic() < stolen_at + 2.0:
            time.sleep(0.01)
        noticed = time.monotonic() - stolen_at
        with pytest.raises(fencelock.LockLost):
            lease.ensure()
        # The body goes on (a thread cannot be interrupted safely); leaving it raises LockLost.
    assert noticed <= 0.5 + 0.15  # within one renewal interval (ttl/3)
    assert len(told) == 1          # called once, although the exit saw the loss too
    locks.close()


def test_ensure_raises_once_the_lease_is_lost(deployment: Deployment, name: str) -> None:
    locks = fencelock.connect(deployment.url)
    lease = locks.acquire(name, ttl=1.5, wait=0, renew=True)
    lease.ensure()
    _steal(deployment, name, "delete")
    time.sleep(0.7)
    assert lease.lost
    with pytest.raises(fencelock.LockLost, match="deleted or taken"):
        lease.ensure()
    locks.close()


def test_asyncio_body_is_cancelled_with_lock_lost(deployment: Deployment, name: str) -> None:
    async def main() -> None:
        locks = fencelock.aio.connect(deployment.url)
        told: list[str] = []
        reached_end = False
        started = time.monotonic()

        async def critical_section() -> None:
            nonlocal reached_end
            async with locks.lock(name, ttl=1.5, wait=0, on_lost=lambda lease: told.append(lease.name)):
                await asyncio.sleep(0.1)
                _steal(deployment, name, "overwrite")
                await asyncio.sleep(5.0)  # cancelled long before this ends
                reached_end = True

        with pytest.raises(fencelock.LockLost) as info:
            await critical_section()
        assert not reached_end
        assert time.monotonic() - started < 0.1 + 0.5 + 0.3
        assert isinstance(info.value.__cause__, asyncio.CancelledError)
        assert told == [name]
        # The task itself is not left cancelled: it carries on after handling LockLost.
        await asyncio.sleep(0.01)
        await locks.aclose()

    asyncio.run(main())


def test_asyncio_cancel_on_lost_can_be_turned_off(deployment: Deployment, name: str) -> None:
    async def main() -> None:
        locks = fencelock.aio.connect(deployment.url)
        finished = False

        async def critical_section() -> None:
            nonlocal finished
            async with locks.lock(name, ttl=1.5, wait=0, cancel_on_lost=False) as lease:
                _steal(deployment, name, "delete")
                await asyncio.sleep(0.8)
                assert lease.lost
                finished = True

        with pytest.raises(fencelock.LockLost):
            await critical_section()
        assert finished
        await locks.aclose()

    asyncio.run(main())


def test_a_stopped_server_makes_the_lease_lost_on_time(own_deployment: Deployment, name: str) -> None:
    """The network gives no answer at all: the local monotonic clock still says when the lease is gone."""
    locks = fencelock.connect(own_deployment.url)
    told: list[float] = []
    lease = locks.acquire(name, ttl=1.0, wait=0, renew=True, on_lost=lambda _: told.append(time.monotonic()))
    own_deployment.pause()
    try:
        paused_at = time.monotonic()
        valid_until = lease._valid_until
        while not told and time.monotonic() < paused_at + 3.0:
            time.sleep(0.01)
        assert told, "on_lost was not called while the server was stopped"
        assert lease.lost
        assert valid_until - 0.05 <= told[0] <= valid_until + 0.15
    finally:
        own_deployment.resume()
    with pytest.raises(fencelock.LockLost):
        lease.release()
    locks.close()


def test_a_renewal_in_flight_at_release_leaves_no_key(own_server: RedisServer, name: str) -> None:
    locks = fencelock.connect(own_server.url + "?socket_timeout=1.0")
    lease = locks.acquire(name, ttl=1.5, wait=0, renew=True)
    time.sleep(0.3)
    own_server.pause()
    time.sleep(0.4)  # the renewal due at 0.5 s is now on the wire, unanswered
    assert lease._in_flight is not None
    threading.Timer(0.2, own_server.resume).start()
    lease.release()  # waits for that renewal's answer, then releases
    time.sleep(0.1)
    assert lock_value(own_server.client(), name) is None
    locks.close()


def test_ten_thousand_leases_are_renewed_in_batches_and_the_process_exits_promptly(own_server: RedisServer) -> None:
    code = textwrap.dedent(f"""
        import time, fencelock
        locks = fencelock.connect({own_server.url!r})
        started = time.monotonic()
        leases = [locks.acquire(f"many:{{i}}", ttl=3.0, wait=0, renew=True) for i in range(10_000)]
        took = time.monotonic() - started
        cpu_before = time.process_time()
        time.sleep(4.0)
        cpu = time.process_time() - cpu_before
        lost = sum(lease.lost for lease in leases)
        print(took, cpu, lost, locks.watchdog.renewals, locks.backend.renewal_requests, flush=True)
        exit_started = time.monotonic()
    """)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    took, cpu, lost, renewals, requests = (float(x) for x in done.stdout.split())
    assert lost == 0
    assert renewals >= 10_000  # each lease renewed at least once in 4 s (every second)
    assert requests * 100 >= renewals * 0.99  # 100 leases per script call at most ...
    assert requests <= renewals / 100 * 1.5 + 10  # ... and close to that: batches are full
    assert cpu < 4.0 * 0.25  # renewing 10,000 leases took well under a quarter of one core
    # The process does not hang on its leases: it exits right after its last line.
    assert time.monotonic() - started < took + 4.0 + 10.0
    keys: Any = own_server.client().keys("fencelock:{many:*}:lock")
    assert len(keys) == 10_000  # left to expire by their TTL: the exit did not release them, nor hang on them


def test_a_forked_child_never_renews_its_parents_leases(own_server: RedisServer) -> None:
    code = textwrap.dedent(f"""
        import os, time, fencelock
        locks = fencelock.connect({own_server.url!r})
        parent = locks.acquire("parent", ttl=0.6, wait=0, renew=True)
        pid = os.fork()
        if pid == 0:
            try:
                child = locks.acquire("child", ttl=0.6, wait=0, renew=True)  # the child's own watchdog
                time.sleep(1.5)
                print("child", child.lost, flush=True)
            finally:
                os._exit(0)
        locks.watchdog.close()  # the parent stops renewing; only a child could keep "parent" alive now
        os.waitpid(pid, 0)
        print("parent", parent.lost, flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert "child False" in done.stdout   # the child renewed its own lease
    assert "parent True" in done.stdout   # and not its parent's, which expired
    assert lock_value(own_server.client(), "parent") is None


def test_renewal_goes_on_after_the_server_forgets_its_scripts(deployment: Deployment, name: str) -> None:
    locks = fencelock.connect(deployment.url)
    leases = [locks.acquire(f"{name}:{i}", ttl=0.9, wait=0, renew=True) for i in range(150)]
    time.sleep(0.4)  # one renewal went through: the scripts were loaded
    for raw in deployment.raws():
        raw.script_flush()
    time.sleep(1.2)  # longer than the TTL: only renewals after the flush keep the leases
    assert not any(lease.lost for lease in leases)
    assert all(deployment.holder(lease.name) == lease.token for lease in leases[:10])
    for lease in leases:
        lease.release()
    locks.close()
