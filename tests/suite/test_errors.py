"""Every fencelock error survives pickling (multiprocessing, concurrent.futures, Celery's result backends) with its
type, message, lock name and attributes; its `args` carry the name, so a backend that rebuilds an error as
`cls(*args)` keeps it too. A lease attached to an error (`err.lease`, for a retry in this process) is not sent:
it holds connections and a lock's token, and means nothing in another process."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import pickle
from typing import Any

import pytest

import fencelock
from fencelock import _errors
from fencelock._redis.redlock_heal import NodeState
from fencelock.celery import Skipped
from fencelock.testing.servers import RedisServer

NODE = NodeState(node="redis://127.0.0.1:7000/0", reachable=False, ready=False, state="unreachable",
                 quarantine_left=None, quarantined_until=None, repairable=False)

ERRORS: list[Any] = [
    _errors.LockError("no task is running here", name="orders:1"),
    _errors.LockError("no lock named yet"),
    _errors.NotAcquired("held by another holder", name="orders:1"),
    _errors.AcquireTimeout("the wait of 2 s ran out", name="orders:1"),
    _errors.LockLost("the lease was lost", name="orders:1"),
    _errors.StaleFence("write with fence 3 rejected", name="orders:1", fence=3, highest=7),
    _errors.NotIndependent("two nodes are one server", name=None),
    _errors.BackendError("release failed on redis://127.0.0.1:6379/0", name="orders:1"),
    _errors.QuorumUnavailable("2 of 5 nodes answered", name="orders:1", nodes=(NODE,), retry_in=12.5),
    _errors.NotDurable("not confirmed", name="orders:1", wanted="1 replica", got="0 replicas"),
    Skipped("another run holds it", name="orders:1"),
]


def _same(before: BaseException, after: BaseException) -> None:
    assert type(after) is type(before)
    assert str(after) == str(before)
    assert after.args == before.args
    state = {k: v for k, v in vars(before).items() if k != "lease"}
    assert {k: v for k, v in vars(after).items() if k != "lease"} == state


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_every_error_survives_pickling_with_its_name_and_attributes(error: Any) -> None:
    again = pickle.loads(pickle.dumps(error))
    _same(error, again)
    if error.name is not None:
        assert error.name in error.args  # a `cls(*args)` rebuild keeps the name
        assert type(error)(*error.args).name == error.name
        assert f"(lock {error.name!r})" in str(again)


def test_an_error_that_carries_its_lease_pickles_without_it(standalone: RedisServer, name: str) -> None:
    """A release that failed attaches its lease (`err.lease.release()` retries it here); pickled, the error keeps
    everything else, and no token or connection leaves the process."""
    with fencelock.connect(standalone.url) as locks:
        lease = locks.acquire(name, ttl=5.0, wait=0)
        error = fencelock.BackendError("release failed", name=name)
        error.lease = lease
        data = pickle.dumps(error)
        assert lease.token.encode() not in data
        again = pickle.loads(data)
        _same(error, again)
        assert again.lease is None
        lease.release()


def _stale_write(url: str, name: str) -> None:
    """(in a worker process) raise the StaleFence of a guarded write behind the parent's"""
    import redis

    client = redis.Redis.from_url(url)
    try:
        fencelock.RedisGuard(client).set(name, 5, f"{{{name}}}:data", "late")
    finally:
        client.close()


def test_an_error_raised_in_a_worker_process_reaches_the_parent_whole(standalone: RedisServer, name: str) -> None:
    import redis

    client = redis.Redis.from_url(standalone.url)
    fencelock.RedisGuard(client).set(name, 10, f"{{{name}}}:data", "first")
    client.close()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        future = pool.submit(_stale_write, standalone.url, name)
        with pytest.raises(fencelock.StaleFence) as info:
            future.result(timeout=60)
    assert info.value.name == name
    assert (info.value.fence, info.value.highest) == (5, 10)
    assert f"(lock {name!r})" in str(info.value)
