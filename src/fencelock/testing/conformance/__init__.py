"""One behavioural suite that every fencelock backend must pass, unchanged: `ConformanceSuite`.

fencelock runs it on a single Redis, a Redis Cluster, Redlock, etcd and ZooKeeper; a third-party backend runs it
the same way. The suite talks to the service only through the public API and a `Deployment`
(`fencelock.testing.Deployment`): `holder(name)` to look behind fencelock's back, `steal(name)` to take a lock away
from its holder, `pause()`/`resume()` to stall the service. It covers the API (acquire, release, `lock()`,
extend, `remaining()`, a `repr` that hides the token), the errors, bad input (refused before anything is sent),
`wait` deadlines, mutual exclusion under contention (threads, tasks and processes), strictly increasing fences,
the release of a lost lease, `SQLGuard` (on SQLite) rejecting a stale writer, asyncio cancellation, the loss
signal, renewal, `fair=True` (honoured or refused, per `Deployment.supports_fair`), fork safety, and a paused
service giving `BackendError` in bounded time. What reads a backend's own storage (keys, scripts, queues) is
that backend's own tests' business.

Running it on your backend
--------------------------
Subclass `Deployment` (four methods: `holder`, `steal`, `pause`, `resume`; say `min_ttl` if your leases are
coarser than 10 ms), then subclass `ConformanceSuite` in a test module and give it a `deployment` fixture::

    # tests/test_conformance.py
    import pytest
    from fencelock.testing import Deployment
    from fencelock.testing.conformance import ConformanceSuite

    class MyDeployment(Deployment):
        kind = "mine"
        def holder(self, name): ...     # the token holding `name`, read from your servers; None if free
        def steal(self, name): ...      # delete the lock behind its holder's back
        def pause(self): ...            # SIGSTOP your servers
        def resume(self): ...           # SIGCONT them

    @pytest.fixture(scope="session")
    def my_service():
        with MyDeployment(start_my_servers()) as deployment:   # `close()` stops what it started
            yield deployment

    class TestMyBackend(ConformanceSuite):
        @pytest.fixture
        def deployment(self, my_service):
            return my_service

and run `pytest`. Start the service in a session- or module-scoped fixture, as here, and hand it to the class's
`deployment` (pytest 9 deprecates class-scoped fixtures written as methods). Tests that pause the service ask for
`own_deployment`; by default that is `deployment`, resumed in a `finally`. Override `own_deployment` as well to give
those tests servers of their own. Put `pytest.register_assert_rewrite("fencelock.testing.conformance")` in your
`conftest.py` for pytest's detailed assertion messages. The suite needs pytest and nothing else: no markers, no
plugins, no fixtures of yours but `deployment`.

What the suite reads from your `Deployment` besides the four methods (see `fencelock.testing.deployment`):

- `min_ttl`: tests that let a lease run out use at least this TTL (etcd: 1 s).
- `expiry_slack`: how late the service may free a lease nobody renewed; waits for an expiry add it.
- `stall_timeout`: how long one request to a paused service may take to fail; the bound for `BackendError`.
- `supports_fair`: if True, four fair waiters must be served in arrival order; if False, `fair=True` must be
  refused with a `ValueError` before anything is sent.
- `ttl_left(name)`, `leftovers(name)`, `queued(name)`: optional look-ups (None: cannot tell). With them the suite
  also checks the server's TTL after `extend`, that a cancelled acquire left nothing behind, and it waits for fair
  waiters to be queued instead of sleeping 0.3 s between them.

The suite assumes what fencelock promises on every backend: a lease that nobody renews is gone from the service
`ttl` (+ `expiry_slack`) after it was granted, even while its client stays connected; `steal(name)` is noticed
by the holder's watchdog within one renewal interval (`ttl / 3`); and `connect()` gives a client whose requests
to a paused service fail with `BackendError` within `stall_timeout`.

Adding a backend to fencelock's own suite
-----------------------------------------
`tests/conftest.py` keeps a registry, `BACKENDS`: a kind mapped to a function that starts a deployment (and calls
`pytest.skip`, or `pytest.fail` in CI, when the server is not installed; see `redis_deployment` there). One more
line, for instance `"etcd": etcd_deployment,`, runs every test of this suite on it (`tests/test_conformance.py`).
Each function is called once for the session's shared deployment of its kind, and once for every test that asks
for `own_deployment` (these are stopped after the test). `pytest tests/test_conformance.py -k etcd` runs the
suite on that backend alone.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import multiprocessing
import os
import re
import sqlite3
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

import fencelock

from .deployment import Deployment

__all__ = ["ConformanceSuite"]

BAD_ARGUMENTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"ttl": 0}, ValueError, "ttl"), ({"ttl": -1.0}, ValueError, "ttl"), ({"ttl": math.nan}, ValueError, "ttl"),
    ({"ttl": math.inf}, ValueError, "ttl"), ({"ttl": True}, TypeError, "ttl"), ({"ttl": "30"}, TypeError, "ttl"),
    ({"ttl": None}, TypeError, "ttl"), ({"wait": -1}, ValueError, "wait"), ({"wait": math.nan}, ValueError, "wait"),
    ({"wait": False}, TypeError, "wait"), ({"wait": "5"}, TypeError, "wait"),
]
"""Arguments every client refuses, the error, and the argument its message names (with the lock)."""

BAD_NAMES: list[tuple[Any, type[Exception]]] = [("", ValueError), (None, TypeError), (42, TypeError),
                                                (b"orders", TypeError)]


def _ttl(deployment: Deployment, ttl: float) -> float:
    """`ttl`, or the service's shortest TTL if that is longer (for tests that let a lease run out)."""
    return max(deployment.min_ttl, ttl)


def _wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.01)


def _contend(target: Any, name: str, rounds: int, start: Any, results: Any) -> None:
    """One process of the contention test: take `name` `rounds` times; report (fence, entered, left) each time."""
    locks = fencelock.connect(target)
    out: list[tuple[int, float, float]] = []
    try:
        start.wait(60)
        for _ in range(rounds):
            with locks.lock(name, ttl=10.0, wait=30.0) as lease:
                entered = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
                time.sleep(0.002)
                out.append((lease.fence, entered, time.monotonic()))
    finally:
        locks.close()
        results.put(out)


class ConformanceSuite:
    """The behaviour every backend shares. Subclass it as `Test<Backend>` and give it a `deployment` fixture."""

    # -- fixtures (override `deployment`; the rest has defaults) -------------------------------------------------

    @pytest.fixture
    def deployment(self) -> NoReturn:
        pytest.fail("a ConformanceSuite subclass must define a `deployment` fixture that yields a "
                    "fencelock.testing.Deployment (see the fencelock.testing.conformance docstring)")

    @pytest.fixture
    def own_deployment(self, deployment: Deployment) -> Deployment:
        """The deployment for tests that pause the service. Override it to give them servers of their own."""
        return deployment

    @pytest.fixture
    def name(self, request: pytest.FixtureRequest) -> str:
        """A lock name no other test uses."""
        return f"conformance:{request.node.name}:{uuid.uuid4().hex[:8]}"

    @pytest.fixture
    def locks(self, deployment: Deployment) -> Iterator[fencelock.Locks]:
        client = deployment.connect()
        yield client
        client.close()

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
                slack = 0.1 + 2 * attempt
                assert wait <= took < wait + slack, (wait, took, attempt)
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
        assert server_ttl is None or server_ttl > 4.8, server_ttl
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
                    assert took < 1.0, f"bad input took {took:.2f} s to refuse: something was sent"
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

    # -- contention ---------------------------------------------------------------------------------------------

    def test_mutual_exclusion_and_fence_order_under_contention(self, deployment: Deployment, name: str) -> None:
        """Threads with their own clients contend; critical sections never overlap and fences follow grant order."""
        inside = 0
        overlaps = 0
        grants: list[int] = []
        guard = threading.Lock()

        def worker() -> None:
            nonlocal inside, overlaps
            client = deployment.connect()
            try:
                for _ in range(15):
                    with client.lock(name, ttl=5.0, wait=20.0) as lease:
                        with guard:
                            inside += 1
                            overlaps += inside > 1
                            grants.append(lease.fence)
                        time.sleep(0.001)
                        with guard:
                            inside -= 1
            finally:
                client.close()

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert overlaps == 0
        assert len(grants) == 60
        assert grants == sorted(grants)
        assert len(set(grants)) == 60

    def test_mutual_exclusion_and_fence_order_across_processes(self, deployment: Deployment, name: str) -> None:
        """Processes (spawned: nothing shared but the service) contend; their critical sections, timed on the one
        monotonic clock of the machine, never overlap, and each grant's fence is above the one before it."""
        ctx = multiprocessing.get_context("spawn")
        processes, rounds = 3, 10
        start = ctx.Event()
        results = ctx.Queue()
        workers = [ctx.Process(target=_contend, args=(deployment.target, name, rounds, start, results))
                   for _ in range(processes)]
        for worker in workers:
            worker.start()
        try:
            start.set()
            grants: list[tuple[int, float, float]] = []
            for _ in workers:
                grants += results.get(timeout=90)
        finally:
            for worker in workers:
                worker.join(30)
                if worker.is_alive():
                    worker.kill()
        assert [worker.exitcode for worker in workers] == [0] * processes
        assert len(grants) == processes * rounds
        grants.sort(key=lambda grant: grant[1])
        for (fence, _, left), (next_fence, entered, _) in itertools.pairwise(grants):
            assert left <= entered, f"fences {fence} and {next_fence} were held at the same time"
            assert next_fence > fence, f"fence {next_fence} was granted after {fence}"

    def test_a_waiter_is_woken_by_the_release_at_once(self, locks: fencelock.Locks, name: str) -> None:
        holder = locks.acquire(name, ttl=10.0, wait=0)
        timer = threading.Timer(0.6, holder.release)
        started = time.monotonic()
        timer.start()
        waiter = locks.acquire(name, ttl=5.0, wait=5.0)
        woke = time.monotonic() - started
        timer.join()
        assert 0.6 <= woke < 0.7, woke
        waiter.release()

    def test_a_waiter_retries_when_a_crashed_holders_lease_expires(self, locks: fencelock.Locks, name: str,
                                                                   deployment: Deployment) -> None:
        ttl = _ttl(deployment, 0.4)
        locks.acquire(name, ttl=ttl, wait=0)  # never released: the holder "crashed"
        started = time.monotonic()
        lease = locks.acquire(name, ttl=5.0, wait=5.0 + ttl)
        took = time.monotonic() - started
        assert ttl - 0.05 <= took < ttl + 0.15 + deployment.expiry_slack, took
        lease.release()

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

    # -- guards -------------------------------------------------------------------------------------------------

    def test_sql_guard_rejects_the_writer_that_paused_past_its_ttl(self, locks: fencelock.Locks, name: str,
                                                                   deployment: Deployment, tmp_path: Path) -> None:
        db = sqlite3.connect(tmp_path / "bank.db")
        guard = fencelock.SQLGuard()
        with db:
            db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner TEXT NOT NULL)")
            db.execute("INSERT INTO accounts VALUES (42, 'nobody')")
            guard.create_table(db.cursor())

        def write(fence: int, owner: str) -> None:
            with db:  # one transaction: the guard's check and the write commit together, or neither does
                cur = db.cursor()
                guard.check(cur, name, fence)
                cur.execute("UPDATE accounts SET owner = ? WHERE id = 42", (owner,))

        a = locks.acquire(name, ttl=_ttl(deployment, 0.2), wait=0)
        time.sleep(a.ttl + 0.1 + deployment.expiry_slack)  # A stops (a GC pause, a stalled VM) past its TTL
        assert a.remaining() == 0.0
        b = locks.acquire(name, ttl=5.0, wait=0)
        write(b.fence, "B")
        with pytest.raises(fencelock.StaleFence) as info:
            write(a.fence, "A")
        assert info.value.fence == a.fence
        assert info.value.highest == b.fence
        assert info.value.name == name
        assert db.execute("SELECT owner FROM accounts WHERE id = 42").fetchone() == ("B",)
        assert guard.highest(db.cursor(), name) == b.fence
        write(b.fence, "B again")  # the current holder may write many times
        b.release()
        db.close()

    # -- fair waiting -------------------------------------------------------------------------------------------

    def test_fair_waiters_are_served_in_arrival_order_or_fair_is_refused(self, locks: fencelock.Locks, name: str,
                                                                         deployment: Deployment) -> None:
        with pytest.raises(TypeError, match="fair must be True or False"):
            locks.acquire(name, fair="yes")  # type: ignore[arg-type]
        if not deployment.supports_fair:
            with pytest.raises(ValueError, match=r"fair=True .*lock"):
                locks.acquire(name, fair=True)
            with pytest.raises(ValueError, match=r"fair=True .*lock"):
                locks.lock(name, fair=True)
            return
        holder = locks.acquire(name, ttl=10.0, wait=0)
        order: list[int] = []

        def waiter(i: int) -> None:
            client = deployment.connect()
            try:
                with client.lock(name, ttl=5.0, wait=20.0, fair=True):
                    order.append(i)
                    time.sleep(0.01)
            finally:
                client.close()

        threads = []
        for i in range(4):
            threads.append(threading.Thread(target=waiter, args=(i,)))
            threads[-1].start()
            if deployment.queued(name) is None:
                time.sleep(0.3)  # the deployment cannot count its queue: give the waiter time to join it
            else:
                _wait_until(lambda i=i: (deployment.queued(name) or 0) >= i + 1, 5.0, f"waiter {i} joining")
        holder.release()
        for thread in threads:
            thread.join()
        assert order == list(range(4))

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
            assert noticed <= ttl / 3 + 0.15  # within one renewal interval (ttl/3)
            assert len(told) == 1             # called once, although the exit saw the loss too
        finally:
            locks.close()

    def test_ensure_raises_once_the_lease_is_lost(self, deployment: Deployment, name: str) -> None:
        ttl = _ttl(deployment, 1.5)
        locks = deployment.connect()
        try:
            lease = locks.acquire(name, ttl=ttl, wait=0, renew=True)
            lease.ensure()
            deployment.steal(name)
            time.sleep(ttl / 3 + 0.2)
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
                assert time.monotonic() - started < 0.1 + ttl / 3 + 0.3
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

    def test_asyncio_tasks_sharing_a_client_are_mutually_exclusive(self, deployment: Deployment,
                                                                   name: str) -> None:
        async def main() -> list[int]:
            locks = deployment.aconnect()
            inside = 0
            fences: list[int] = []

            async def task() -> None:
                nonlocal inside
                for _ in range(10):
                    async with locks.lock(name, ttl=5.0, wait=20.0) as lease:
                        inside += 1
                        assert inside == 1
                        fences.append(lease.fence)
                        await asyncio.sleep(0.001)
                        inside -= 1

            try:
                await asyncio.gather(*(task() for _ in range(5)))
            finally:
                await locks.aclose()
            return fences

        fences = asyncio.run(main())
        assert fences == sorted(fences)
        assert len(set(fences)) == 50

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
                # The servers now run the acquire (granting it); the undo follows it and gives the lock back.
                for _ in range(150):
                    await asyncio.sleep(0.02)
                    if deployment.holder(name) is None and not deployment.leftovers(name):
                        break
                assert deployment.holder(name) is None
                assert not deployment.leftovers(name), deployment.leftovers(name)
                lease = await locks.acquire(name, ttl=5.0, wait=0)
                assert lease.fence > first.fence
                await lease.release()
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
                assert took < 1.0 + deployment.stall_timeout + 0.5, took
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
