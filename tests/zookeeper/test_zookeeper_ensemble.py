"""The ZooKeeper backend on a real three-member ensemble: a lease survives the loss of a minority of the members,
including the leader and the member its session is connected to, and the loss of a majority is a `BackendError`
in bounded time and a lease reported lost by the local clock, never before it could have expired.

One ensemble serves the module (`ensemble`); every test has its own chroot on it (`zk3`), and every member a test
killed is started again after it (`healthy`). The conformance suite runs on an ensemble too, from
`tests/suite/test_conformance.py` (`zookeeper3` in `conftest.BACKENDS`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock.testing.timing import slack
from fencelock.testing.zookeeper_ensemble import ZooKeeperEnsemble, ZooKeeperEnsembleDeployment
from tests.conftest import _require_zookeeper, until

TTL = 5.0
"""The holder's TTL in the failover tests. A renewal is due every TTL/3, so the lease may have only 2/3 of it (3.3 s)
left when a member dies: enough for an election (0.4-0.9 s here) and a reconnect to another member, with room for
a loaded machine. Its session's timeout is the next step of 2^(1/4) above it, 5.66 s."""


@pytest.fixture(scope="module")
def ensemble() -> Iterator[ZooKeeperEnsemble]:
    _require_zookeeper()
    with ZooKeeperEnsemble(3) as started:
        yield started


@pytest.fixture
def healthy(ensemble: ZooKeeperEnsemble) -> Iterator[ZooKeeperEnsemble]:
    """The module's ensemble with every member serving before the test, and again after it."""
    ensemble.wait_ready()
    yield ensemble
    for member in ensemble.members:
        if member.running:
            member.resume()
    for member in ensemble.members:
        if not member.running:
            member.spawn()
    ensemble.wait_ready()


@pytest.fixture
def zk3(healthy: ZooKeeperEnsemble) -> Iterator[ZooKeeperEnsembleDeployment]:
    deployment = ZooKeeperEnsembleDeployment(healthy)
    yield deployment
    deployment.close()


def _session(locks: fencelock.Locks) -> Any:
    """The one ZooKeeper session (`ZKSession`) a client has opened so far."""
    backend: Any = locks.backend
    sessions = {id(s): s for s in backend._sessions.values()}
    assert len(sessions) == 1, sessions
    return next(iter(sessions.values()))


def _history(locks: fencelock.Locks) -> list[tuple[float, str]]:
    """From now on, every state change of the client's session, with its monotonic time (for failure messages)."""
    seen: list[tuple[float, str]] = []
    _session(locks).client.add_listener(lambda state: seen.append((round(time.monotonic(), 3), str(state))))
    return seen


def _session_id(locks: fencelock.Locks) -> int:
    return int(_session(locks).client.client_id[0])


def _client_on(zk3: ZooKeeperEnsembleDeployment, role: str, name: str, ttl: float = TTL) -> fencelock.Locks:
    """A client whose session (for `ttl`) is connected to a member that is `role` ("leader" or "follower").

    kazoo picks a member at random, so this connects until it lands on one (2 in 3 or 1 in 3 per try)."""
    ensemble = zk3.ensemble
    for _ in range(40):
        locks = zk3.connect()
        locks.acquire(f"{name}:warm-up", ttl=ttl, wait=5.0).release()   # opens the session for `ttl`
        member = ensemble.member_of_session(_session_id(locks))
        if member is not None and ensemble.mode(member) == role:
            return locks
        locks.close()
    raise AssertionError(f"no session landed on a {role} in 40 tries")


def _children_on(ensemble: ZooKeeperEnsemble, i: int, directory: str) -> list[str]:
    """The lock's queue as member `i` itself has it (a client of that member alone, after a `sync`)."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError

    from fencelock._zk.rules import child_name, queue
    client = KazooClient(hosts=ensemble.members[i].address, timeout=5.0)
    client.start(timeout=5)
    try:
        client.sync(directory)
        try:
            return [child_name(child) for child in queue(client.get_children(directory))]
        except NoNodeError:
            return []
    finally:
        client.stop()
        client.close()


class _Waiter:
    """`locks.acquire(name, wait=...)` in a thread of its own: its lease, or its error, once it returns."""

    def __init__(self, locks: fencelock.Locks, name: str, wait: float, ttl: float = TTL) -> None:
        self.lease: fencelock.Lease | None = None
        self.error: BaseException | None = None
        self.returned_at = 0.0   # monotonic: when acquire returned or raised
        self._thread = threading.Thread(target=self._run, args=(locks, name, wait, ttl), daemon=True)
        self._thread.start()

    def _run(self, locks: fencelock.Locks, name: str, wait: float, ttl: float) -> None:
        try:
            self.lease = locks.acquire(name, ttl=ttl, wait=wait)
        except BaseException as exc:
            self.error = exc
        self.returned_at = time.monotonic()

    @property
    def blocked(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _fail_over(zk3: ZooKeeperEnsembleDeployment, name: str, holder_role: str, kill: str) -> None:
    """A lease is held (renewed) and a waiter is queued behind it; a member is SIGKILLed (`kill`: "leader" or
    "holder's": the member the holder's session is connected to). The lease must stay ours past its TTL, its node
    must be the head of the queue on both survivors, the waiter must still wait, and take the lock with a larger
    fence once the holder releases."""
    ensemble = zk3.ensemble
    lost: list[float] = []
    holder_locks = _client_on(zk3, holder_role, name)
    waiter_locks = zk3.connect()
    try:
        lease = holder_locks.acquire(name, ttl=TTL, wait=0, renew=True, on_lost=lambda _: lost.append(1.0))
        sid = _session_id(holder_locks)
        holder_member = ensemble.member_of_session(sid)
        assert holder_member is not None
        waiter = _Waiter(waiter_locks, name, wait=60.0)
        until(lambda: zk3.queued(name) == 1, 10.0, "the waiter is queued behind the holder")
        victim = ensemble.leader() if kill == "leader" else holder_member
        assert ensemble.mode(victim) == (holder_role if kill != "leader" else "leader")

        history = _history(holder_locks)
        killed_at = time.monotonic()
        ensemble.kill(victim)
        ensemble.wait_ready(10.0)  # the two survivors serve, one of them leads

        # The session moves to (or stays on) a survivor, and is the same session: its nodes are still there.
        until(lambda: _session(holder_locks).connected and ensemble.member_of_session(sid) is not None, 10.0,
               f"the holder's session is connected to a survivor (killed at {killed_at:.3f}: {history})")
        assert _session_id(holder_locks) == sid
        moved_to = ensemble.member_of_session(sid)
        assert moved_to is not None
        assert moved_to != victim
        if kill != "leader" or holder_member == victim:
            assert moved_to != holder_member
        survivors = [i for i in range(ensemble.size) if i != victim]
        for i in survivors:
            queue = _children_on(ensemble, i, zk3._directory(name))
            assert len(queue) == 2, (i, queue)
            assert queue[0].startswith(lease.token + "-"), i

        # Past one TTL after the kill: only renewals confirmed after the failover can have kept the lease.
        time.sleep(max(0.0, killed_at + TTL + 0.5 - time.monotonic()))
        assert not lease.lost, f"killed at {killed_at:.3f}, session states {history}"
        assert lost == []
        lease.ensure()
        assert lease.remaining() > TTL / 3
        assert zk3.holder(name) == lease.token
        assert waiter.error is None, waiter.error
        assert waiter.blocked

        old_fence = lease.fence
        lease.release()
        waiter.join(10.0)
        assert waiter.error is None, waiter.error
        assert waiter.lease is not None
        assert waiter.lease.fence > old_fence
        assert zk3.holder(name) == waiter.lease.token
        waiter.lease.release()
        assert zk3.nodes(name) == []
    finally:
        holder_locks.close()
        waiter_locks.close()


def test_a_lease_survives_the_leader_being_killed(zk3: ZooKeeperEnsembleDeployment, name: str) -> None:
    """The leader dies while the holder's session is on a follower: the survivors elect a new leader, which takes
    over the session with its nodes."""
    _fail_over(zk3, name, holder_role="follower", kill="leader")


@pytest.mark.parametrize("role", ["follower", "leader"])
def test_a_lease_survives_the_member_its_session_is_on_being_killed(zk3: ZooKeeperEnsembleDeployment, name: str,
                                                                    role: str) -> None:
    """The member the holder is connected to dies (a follower: no election; the leader: an election as well):
    kazoo moves the session to a survivor within its timeout, and the session's ephemeral nodes go with it."""
    _fail_over(zk3, name, holder_role=role, kill="holder's")


def test_a_lease_survives_the_member_its_session_is_on_freezing(zk3: ZooKeeperEnsembleDeployment, name: str) -> None:
    """A member that stops answering (SIGSTOP: a GC pause, a stalled VM) is worse than a dead one: the connection
    stays open. kazoo takes every request it sends for a ping, so while renewals keep going out it never
    notices. fencelock drops a connection on which a request got no answer within the URL's `timeout`, and kazoo
    moves the session to another member. Here `timeout` is 1 s against a 6 s TTL: a renewal that hits the
    frozen member is retried on a live one long before the lease's validity runs out. (Without that drop, the
    renewal and its retries, 1.5 s apart, kept kazoo from ever pinging, and the lease was lost.)"""
    ensemble = zk3.ensemble
    ttl = 6.0
    fast = ZooKeeperEnsembleDeployment(ensemble, zk3.chroot)
    fast.target += "?timeout=1"
    holder_locks = _client_on(fast, "follower", name, ttl)
    lost: list[float] = []
    try:
        lease = holder_locks.acquire(name, ttl=ttl, wait=0, renew=True, on_lost=lambda _: lost.append(1.0))
        sid = _session_id(holder_locks)
        frozen = ensemble.member_of_session(sid)
        assert frozen is not None
        until(lambda: lease.remaining() < ttl * 2 / 3 + 0.1, ttl, "a renewal is about to be due")
        history = _history(holder_locks)
        ensemble.pause(frozen)
        paused_at = time.monotonic()
        try:
            until(lambda: _session(holder_locks).connected and ensemble.member_of_session(sid) not in (None, frozen),
                   ttl, f"the session moved to a live member (paused at {paused_at:.3f}: {history})")
            time.sleep(max(0.0, paused_at + ttl * 1.2 - time.monotonic()))
            assert lost == [], f"paused at {paused_at:.3f}, session states {history}"
            lease.ensure()
            assert _session_id(holder_locks) == sid
            assert zk3.holder(name) == lease.token
        finally:
            ensemble.resume(frozen)
        lease.release()
        assert zk3.nodes(name) == []
    finally:
        holder_locks.close()


def test_a_frozen_member_never_gives_the_lock_to_two_holders(zk3: ZooKeeperEnsembleDeployment, name: str) -> None:
    """The member the holder is connected to is stopped (SIGSTOP) just before a renewal is due, the worst moment.

    kazoo notices a silent server only when its read timeout (2/3 of the session timeout) passes, so here the
    lease may be kept (the session moved in time) or reported lost (its validity ran out first; the session may
    even expire). Either way the lock is never held twice: the waiter, on another member, is granted only after
    the holder's lease was reported lost, and never while the holder still claims it."""
    ensemble = zk3.ensemble
    ttl = 3.0  # short against the request timeout (2 s): a renewal retried after the drop may come too late
    lost_at: list[float] = []
    holder_locks = _client_on(zk3, "follower", name, ttl)
    waiter_locks = _client_on(zk3, "leader", name + ":w", ttl)
    try:
        lease = holder_locks.acquire(name, ttl=ttl, wait=0, renew=True,
                                     on_lost=lambda _: lost_at.append(time.monotonic()))
        frozen = ensemble.member_of_session(_session_id(holder_locks))
        assert frozen is not None
        waiter = _Waiter(waiter_locks, name, wait=30.0, ttl=ttl)
        until(lambda: zk3.queued(name) == 1, 10.0, "the waiter is queued behind the holder")
        until(lambda: lease.remaining() < ttl * 2 / 3 + 0.1, ttl, "a renewal is about to be due")
        ensemble.pause(frozen)
        claimed_until = 0.0  # the latest moment the holder's lease has claimed to be valid until
        deadline = time.monotonic() + ttl + 2.0  # past the session timeout (3.36 s): kept, moved or expired
        while time.monotonic() < deadline and waiter.blocked:
            now = time.monotonic()
            left = lease.remaining()
            if left > 0:
                claimed_until = max(claimed_until, now + left)
            time.sleep(0.005)
        if not waiter.blocked:
            assert waiter.error is None, waiter.error
            assert lease.lost, "the waiter was granted the lock while the holder still claimed it"
            assert waiter.returned_at >= claimed_until, claimed_until - waiter.returned_at
        ensemble.resume(frozen)
        if lease.lost:
            waiter.join(15.0)
            assert waiter.error is None, waiter.error
            assert waiter.lease is not None
            assert waiter.lease.fence > lease.fence
            assert waiter.returned_at >= claimed_until, claimed_until - waiter.returned_at
            assert lost_at[0] >= claimed_until   # reported on time, by the local clock
            waiter.lease.release()
        else:  # kept: the session moved to a survivor in time, and the waiter still waits
            assert zk3.holder(name) == lease.token
            assert waiter.blocked
            lease.release()
            waiter.join(10.0)
            assert waiter.lease is not None
            waiter.lease.release()
    finally:
        holder_locks.close()
        waiter_locks.close()


def test_a_waiter_on_a_member_that_freezes_waits_on_and_gets_the_lock(zk3: ZooKeeperEnsembleDeployment,
                                                                       name: str) -> None:
    """The probe: with the leader frozen (SIGSTOP) longer than the request timeout, waiters whose session was on it
    failed ("listing failed ... TimeoutError") with most of their wait left. A look at the queue that gets no
    answer drops the connection; kazoo moves the session to a live member, the waiter looks again there, within
    its wait, and keeps its place."""
    ensemble = zk3.ensemble
    fast = ZooKeeperEnsembleDeployment(ensemble, zk3.chroot)
    fast.target += "?timeout=1"
    holder_locks = _client_on(fast, "follower", name)
    waiter_locks = _client_on(fast, "leader", name + ":w")
    try:
        lease = holder_locks.acquire(name, ttl=TTL, wait=0, renew=True)
        waiter = _Waiter(waiter_locks, name, wait=30.0)
        until(lambda: zk3.queued(name) == 1, 10.0, "the waiter is queued behind the holder")
        frozen = ensemble.member_of_session(_session_id(waiter_locks))
        assert frozen is not None
        ensemble.pause(frozen)
        try:
            # Past the request timeout (1 s) and a waiter's next look at the queue (at most every TTL/4).
            until(lambda: ensemble.member_of_session(_session_id(waiter_locks)) not in (None, frozen), 10.0,
                  "the waiter's session moved to a live member")
            time.sleep(1.0)
            assert waiter.error is None, waiter.error
            assert waiter.blocked
        finally:
            ensemble.resume(frozen)
        lease.release()
        waiter.join(10.0)
        assert waiter.error is None, waiter.error
        assert waiter.lease is not None
        assert waiter.lease.fence > lease.fence
        waiter.lease.release()
        assert zk3.nodes(name) == []
    finally:
        holder_locks.close()
        waiter_locks.close()


def test_a_first_connection_succeeds_within_the_timeout_with_a_member_frozen(zk3: ZooKeeperEnsembleDeployment,
                                                                            name: str) -> None:
    """The probe: a fresh client whose kazoo tried the frozen member first failed after exactly the timeout,
    although two members served. Each member now gets a third of the timeout to answer its handshake."""
    ensemble = zk3.ensemble
    frozen = (ensemble.leader() + 1) % ensemble.size  # a follower: no election
    ensemble.pause(frozen)
    try:
        for i in range(6):  # kazoo tries the members in a random order: the frozen one first, 1 time in 3
            locks = fencelock.connect(zk3.target + "?timeout=1.5")
            try:
                started = time.monotonic()
                locks.acquire(f"{name}:{i}", ttl=TTL, wait=0).release()
                assert time.monotonic() - started < 1.5 + slack(0.5)
            finally:
                locks.close()
    finally:
        ensemble.resume(frozen)


def test_with_one_member_down_the_lock_works(zk3: ZooKeeperEnsembleDeployment, name: str) -> None:
    ensemble = zk3.ensemble
    down = (ensemble.leader() + 1) % ensemble.size   # a follower: no election, one member fewer
    ensemble.kill(down)
    ensemble.wait_ready(10.0)
    for i in range(2):  # a client that knows all three members, one of which refuses connections
        locks = zk3.connect()
        try:
            first = locks.acquire(f"{name}:{i}", ttl=5.0, wait=5.0)
            with pytest.raises(fencelock.NotAcquired):
                locks.acquire(f"{name}:{i}", ttl=5.0, wait=0)
            first.release()
            second = locks.acquire(f"{name}:{i}", ttl=5.0, wait=0)
            assert second.fence > first.fence
            second.release()
            assert zk3.nodes(f"{name}:{i}") == []
        finally:
            locks.close()


def test_with_a_majority_down_acquire_fails_in_bounded_time_and_a_held_lease_is_lost_by_its_clock(
        zk3: ZooKeeperEnsembleDeployment, name: str) -> None:
    ensemble = zk3.ensemble
    ttl = 2.0
    holder_locks = zk3.connect()
    lost_at: list[float] = []
    try:
        lease = holder_locks.acquire(name, ttl=ttl, wait=0, renew=True,
                                     on_lost=lambda _: lost_at.append(time.monotonic()))
        fence = lease.fence
        leader = ensemble.leader()
        victims = [leader, (leader + 1) % ensemble.size]
        # The longest the lease can claim from here: what it says now (a renewal confirmed later only adds).
        claimed_until = time.monotonic() + lease.remaining()
        for i in victims:
            ensemble.kill(i)
        killed_at = time.monotonic()
        until(lambda: ensemble.mode(next(i for i in range(3) if i not in victims)) is None, 5.0,
               "the last member stops serving (no quorum)")

        # An acquire, on the client that holds a session and on a new one, is a BackendError, not a wait.
        for locks in (holder_locks, zk3.connect()):
            started = time.monotonic()
            with pytest.raises(fencelock.BackendError) as info:
                locks.acquire(f"{name}:other", ttl=ttl, wait=10.0)
            took = time.monotonic() - started
            assert info.value.name == f"{name}:other"
            assert took < 2.0 + slack(2.0), took   # the URL's timeout (2 s), with room for a loaded machine
            if locks is not holder_locks:
                locks.close()

        # Nobody can tell the holder its node is still there: the lease is lost once its validity runs out,
        # by the local clock, and not before.
        until(lambda: lease.lost, ttl + 3.0, "the lease is reported lost")
        assert len(lost_at) == 1
        assert lost_at[0] >= claimed_until, (lost_at[0] - claimed_until)
        assert lost_at[0] - killed_at < ttl + 1.0, lost_at[0] - killed_at
        with pytest.raises(fencelock.LockLost):
            lease.ensure()

        # The quorum comes back: the session survived, and the client deletes the node it no longer claims.
        for i in victims:
            ensemble.members[i].spawn()
        ensemble.wait_ready(20.0)
        until(lambda: zk3.nodes(name) == [], 10.0, "the node of the lost lease is deleted")
        after = holder_locks.acquire(name, ttl=ttl, wait=5.0)
        assert after.fence > fence
        after.release()
    finally:
        holder_locks.close()


def test_the_ensemble_harness(ensemble: ZooKeeperEnsemble) -> None:
    """Three members, one leader, every port distinct, each member in its own directory, every PID ours."""
    leader = ensemble.wait_ready()
    modes = [ensemble.mode(i) for i in range(ensemble.size)]
    assert modes.count("leader") == 1
    assert modes.count("follower") == 2
    assert modes[leader] == "leader"
    assert ensemble.url("/a") == "zookeeper://" + ",".join(m.address for m in ensemble.members) + "/a"
    assert len({m.dir for m in ensemble.members}) == 3
    assert all(pid is not None for pid in ensemble.pids())
    with open(ensemble.members[0].config_path) as f:
        config = f.read()
    assert "tickTime=100\n" in config
    assert config.count("server.") == 3
    with pytest.raises(ValueError, match="size"):
        ZooKeeperEnsemble(1)
