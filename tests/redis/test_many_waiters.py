"""Many waiters through one client, on real servers: the waiters of one client on one name share a bounded number
of connections, and every one of them is granted in turn.

The invariants, each checked from outside by a client of the test's own that watches the server:
- no errors on a healthy server, however many tasks or threads of one client wait on one name;
- the server's `connected_clients` stays within a small bound while they wait;
- the grants never overlap: the server holds the token of the waiter that believes it holds the lock, grant and
  release alternate, and fences strictly increase.

Fair order, waiters that give up and a stalled server are in `test_many_waiters_order.py`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import fencelock
import fencelock.aio
from fencelock._logic.waiting import Room
from fencelock._sync.waiting import WaitingRooms
from fencelock.testing import ClusterDeployment, RedisDeployment, RedlockDeployment
from tests.conftest import RedisFamily, SharedDeployments, until

from ._support import eviction_checks

pytestmark = pytest.mark.alone  # (it loads one client to its limits: no other test runs beside it)

TASKS = 10_000
THREADS = 200
CONNECTIONS = 16
"""The most connections one client's waiters on one name may add on a server, however many they are: the head's
blocking wait, the room's gate (4 places), a release or two, the watchdog's pool, this test's own watchers, slack."""


@pytest.fixture(scope="module")
def server() -> Iterator[RedisDeployment]:
    """A Redis of this module's own: its `connected_clients` counts only this test's clients."""
    deployment = RedisDeployment.start()
    try:
        yield deployment
    finally:
        deployment.close()


class Clients:
    """The most clients each server had connected, polled from a thread with connections of its own."""

    def __init__(self, deployment: RedisFamily) -> None:
        self._raws = deployment.raws()
        self.baseline = self._now()
        self.peak = list(self.baseline)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _now(self) -> list[int]:
        counts = []
        for raw in self._raws:
            if isinstance(raw, redis.RedisCluster):  # one answer per node
                infos = raw.info("clients", target_nodes=redis.RedisCluster.ALL_NODES)
                counts += [int(infos[node]["connected_clients"]) for node in sorted(infos)]
            else:
                counts.append(int(raw.info("clients")["connected_clients"]))
        return counts

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = [max(a, b) for a, b in zip(self.peak, self._now(), strict=True)]

    def stop(self) -> list[int]:
        """How many connections each server had beyond the baseline, at most."""
        self._stop.set()
        self._thread.join()
        return [peak - base for peak, base in zip(self.peak, self.baseline, strict=True)]


class Grants:
    """Grant and release events in the order they happened, checked against the server as they happen."""

    def __init__(self, deployment: RedisFamily, name: str) -> None:
        self._deployment = deployment
        self._name = name
        self._guard = threading.Lock()
        self.events: list[tuple[str, int, Any]] = []
        self.wrong_holder = 0

    def granted(self, lease: Any, who: Any) -> None:
        if self._deployment.holder(self._name) != lease.token:  # the server must agree who holds it
            self.wrong_holder += 1
        with self._guard:
            self.events.append(("grant", lease.fence, who))

    def releasing(self, lease: Any, who: Any) -> None:
        with self._guard:
            self.events.append(("release", lease.fence, who))

    def check(self, count: int) -> list[Any]:
        """Every waiter granted once, never two at once, fences strictly increasing; returns who, in order."""
        assert self.wrong_holder == 0
        assert len(self.events) == 2 * count
        kinds = [kind for kind, _, _ in self.events]
        assert kinds == ["grant", "release"] * count, "two grants overlapped"
        grants = [(fence, who) for kind, fence, who in self.events if kind == "grant"]
        releases = [(fence, who) for kind, fence, who in self.events if kind == "release"]
        assert grants == releases  # each release is the one of the grant just before it
        fences = [fence for fence, _ in grants]
        assert all(a < b for a, b in itertools.pairwise(fences))
        order = [who for _, who in grants]
        assert len(set(order)) == count, "a waiter was granted twice"
        return order


# -- the room's rules (pure) -----------------------------------------------------------------------------------

def test_a_room_serves_its_head_and_passes_the_turn_on_in_arrival_order() -> None:
    room: Room[str] = Room(2)
    for seat in "abc":
        room.join(seat)
    assert room.head() == "a"
    assert room.leave("b") is None  # not the head: nobody's turn changes
    assert room.leave("a") == "c"   # the head left: the next one in arrival order is the head now
    assert room.leave("c") is None
    assert room.head() is None
    assert len(room) == 0
    assert room.seats() == []


def test_a_rooms_gate_hands_places_out_in_turn_and_the_head_goes_first() -> None:
    room: Room[str] = Room(1)
    for seat in "abc":
        room.join(seat)
    assert room.ask("b")          # a free place
    assert not room.ask("c")      # queued
    assert not room.ask("a")      # queued too, but the head goes before the others
    assert room.release() == "a"
    assert room.withdraw("c")     # gave up while asking: it holds no place
    assert not room.withdraw("c")
    assert room.release() is None  # nobody asks: the place is free
    assert room.ask("c")


def test_a_failure_passes_to_the_waiters_behind_once_and_not_to_those_with_an_answer_of_their_own() -> None:
    """The room's own bookkeeping (no server): who is failed by another waiter's BackendError."""
    rooms = WaitingRooms()
    head, answered, waiting = rooms.seat("n", False), rooms.seat("n", False), rooms.seat("n", False)
    with head.gate():
        pass
    with waiting.gate():
        pass
    head.fail(fencelock.BackendError("the server failed", name="n"))
    with answered.gate():  # its own request got through after the failure: it keeps waiting
        pass
    assert answered.wait_turn(0.01) is False
    with pytest.raises(fencelock.BackendError, match="met by an earlier waiter") as raised:
        waiting.wait_turn(None)
    assert raised.value.name == "n"
    later = rooms.seat("n", False)
    waiting.fail(raised.value)  # passed on once only: a waiter who came since met no failure
    with later.gate():
        pass
    assert later.wait_turn(0.01) is False
    for seat in (head, answered, waiting, later):
        seat.leave()
    assert len(rooms) == 0


def test_a_forked_child_does_not_wait_behind_its_parents_waiters(server: RedisDeployment, name: str) -> None:
    """A thread of the parent waits on `name` when the process forks. In the child that waiter does not exist:
    the child's own waiter, on the same client, blocks on the server itself and is woken by the release (behind
    a ghost it would wait out its whole wait, 3 s, and take the lock only at its last attempt)."""
    locks = fencelock.connect(server.target)
    holder = fencelock.connect(server.target)
    try:
        holder.acquire(name, ttl=30.0, wait=0)

        def parent_waiter() -> None:  # (it may time out, or win once the child has stolen the key: either way)
            try:
                locks.acquire(name, ttl=5.0, wait=3.0).release()
            except fencelock.LockError:
                pass

        thread = threading.Thread(target=parent_waiter)
        thread.start()
        deadline = time.monotonic() + 5.0
        while len(locks._rooms) == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                server.steal(name)
                other = fencelock.connect(server.target)
                held = other.acquire(name, ttl=30.0, wait=3.0)  # the parent's waiter may take it first: it lets go
                timer = threading.Timer(0.3, held.release)
                timer.start()
                started = time.monotonic()
                locks.acquire(name, ttl=5.0, wait=3.0).release()
                code = 0 if time.monotonic() - started < 2.0 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        thread.join(10.0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        locks.close()
        holder.close()


# -- many waiters ------------------------------------------------------------------------------------------------

def test_ten_thousand_tasks_of_one_client_are_each_granted_once_in_turn_over_a_few_connections(
        server: RedisDeployment, name: str) -> None:
    """Before, every waiting task opened a connection of its own: most failed with connection timeouts."""

    async def main() -> list[int]:
        grants = Grants(server, name)
        clients = Clients(server)
        locks = fencelock.aio.connect(server.target)
        errors: list[BaseException] = []
        try:
            holder = await locks.acquire(name, ttl=60.0, wait=0)

            async def waiter(i: int) -> None:
                try:
                    async with locks.lock(name, wait=120.0) as lease:  # default ttl and renewal
                        grants.granted(lease, i)
                        grants.releasing(lease, i)
                except Exception as exc:
                    errors.append(exc)

            tasks = [asyncio.ensure_future(waiter(i)) for i in range(TASKS)]
            await asyncio.sleep(1.0)  # all of them refused once, and waiting
            started = time.monotonic()
            await holder.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 120.0)
            print(f"{TASKS} grants in {time.monotonic() - started:.1f} s")
        finally:
            await locks.aclose()
            extra = clients.stop()
        assert errors == []
        assert max(extra) <= CONNECTIONS, extra
        return grants.check(TASKS)

    asyncio.run(main())
    assert server.holder(name) is None


@pytest.mark.parametrize("fair", [False, True])
def test_two_hundred_threads_of_one_sync_client_are_each_granted_once_in_turn_over_a_few_connections(
        server: RedisDeployment, name: str, fair: bool) -> None:
    grants = Grants(server, name)
    clients = Clients(server)
    locks = fencelock.connect(server.target)
    errors: list[BaseException] = []
    try:
        holder = locks.acquire(name, ttl=60.0, wait=0)

        def waiter(i: int) -> None:
            try:
                with locks.lock(name, wait=120.0, fair=fair) as lease:
                    grants.granted(lease, i)
                    grants.releasing(lease, i)
            except Exception as exc:
                errors.append(exc)

        threads = [threading.Thread(target=waiter, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        holder.release()
        for thread in threads:
            thread.join(120.0)
    finally:
        locks.close()
        extra = clients.stop()
    assert errors == []
    assert max(extra) <= CONNECTIONS, extra
    grants.check(THREADS)


@pytest.mark.parametrize(("kind", "fair"), [("redis", False), ("redis", True), ("cluster", False),
                                            ("cluster", True), ("redlock", False)])  # (Redlock has no fair mode)
def test_waiters_of_one_client_share_connections_on_every_redis_kind(shared_deployments: SharedDeployments,
                                                                    kind: str, fair: bool, name: str) -> None:
    """Single Redis, Cluster (where the wait and the attempt are two requests) and Redlock (whose waiters block
    on one home node, over redis-py's pool): few connections per node, every waiter granted once, in turn."""
    deployment = shared_deployments.get(kind)
    assert isinstance(deployment, RedisDeployment | ClusterDeployment | RedlockDeployment)
    count = 300

    async def main() -> None:
        grants = Grants(deployment, name)
        clients = Clients(deployment)
        locks = deployment.aconnect()
        errors: list[BaseException] = []
        try:
            holder = await locks.acquire(name, ttl=60.0, wait=0)

            async def waiter(i: int) -> None:
                try:
                    async with locks.lock(name, wait=120.0, fair=fair) as lease:
                        grants.granted(lease, i)
                        grants.releasing(lease, i)
                except Exception as exc:
                    errors.append(exc)

            tasks = [asyncio.ensure_future(waiter(i)) for i in range(count)]
            await asyncio.sleep(1.0)
            await holder.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 120.0)
        finally:
            await locks.aclose()
            extra = clients.stop()
        assert errors == []
        assert max(extra) <= CONNECTIONS, extra
        grants.check(count)

    asyncio.run(main())


def _calls(deployment: RedisDeployment, command: str) -> int:
    stats: Any = deployment.raw().info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_lone_waiter_keeps_its_one_write_hand_off(server: RedisDeployment, name: str) -> None:
    """One waiter per client (the common case): a refused attempt, then one BLPOP with the acquire behind it,
    woken by the release. No request more than before the room existed."""
    holder_client = fencelock.connect(server.target)
    locks = fencelock.connect(server.target)
    raw = server.raw()
    try:
        # Each client's one eviction check (after its first grant) runs before the count begins.
        raw.config_set("slowlog-log-slower-than", 0)
        raw.slowlog_reset()
        holder = holder_client.acquire(name, ttl=30.0, wait=0)
        locks.acquire(name + ":warm", ttl=30.0, wait=0).release()
        until(lambda: eviction_checks(raw) == 2, 5.0, "both clients' eviction checks")
        raw.config_set("slowlog-log-slower-than", 10000)
        raw.config_resetstat()
        got: list[Any] = []
        thread = threading.Thread(target=lambda: got.append(locks.acquire(name, ttl=30.0, wait=20.0)))
        thread.start()
        deadline = time.monotonic() + 5.0
        while _calls(server, "blpop") < 1:
            assert time.monotonic() < deadline, "the waiter never blocked"
            time.sleep(0.005)
        time.sleep(0.1)  # (it is blocked in BLPOP now)
        holder.release()
        thread.join(10.0)
        assert got
        assert got[0].fence > holder.fence  # the next grant (fences follow the clock: no longer holder's + 1)
        assert server.holder(name) == got[0].token
        # The waiter's refused attempt, the release, the waiter's acquire: three scripts; one BLPOP.
        assert _calls(server, "evalsha") == 3
        assert _calls(server, "blpop") == 1
        got[0].release()
    finally:
        holder_client.close()
        locks.close()


@pytest.mark.parametrize("fair", [False, True])
def test_waiters_behind_the_head_send_nothing_while_they_wait(server: RedisDeployment, name: str,
                                                               fair: bool) -> None:
    """100 waiters of one client wait 4 s on a held lock (more than two blocking periods of 1.5 s). Only the head
    blocks and tries again; the others sent their first attempt (fair: and one refresh per blocking period, which
    keeps their queue entries). Before, every waiter blocked and tried again each period."""
    count = 100
    holder_client = fencelock.connect(server.target)
    locks = fencelock.connect(server.target)
    raw = server.raw()
    try:
        # Each client's one eviction check (after its first grant) runs before the count begins.
        raw.config_set("slowlog-log-slower-than", 0)
        raw.slowlog_reset()
        holder = holder_client.acquire(name, ttl=30.0, wait=0)
        locks.acquire(name + ":warm", ttl=30.0, wait=0).release()
        until(lambda: eviction_checks(raw) == 2, 5.0, "both clients' eviction checks")
        raw.config_set("slowlog-log-slower-than", 10000)
        raw.config_resetstat()
        fences: list[int] = []

        def waiter() -> None:
            with locks.lock(name, ttl=30.0, wait=60.0, fair=fair) as lease:
                fences.append(lease.fence)

        threads = [threading.Thread(target=waiter) for _ in range(count)]
        for thread in threads:
            thread.start()
        time.sleep(4.0)
        blocked, scripts = _calls(server, "blpop"), _calls(server, "evalsha")
        holder.release()
        for thread in threads:
            thread.join(30.0)
        assert len(fences) == count  # each granted once, in turn: strictly increasing in grant order
        assert fences == sorted(set(fences))
        assert fences[0] > holder.fence
        assert blocked <= 4  # the head alone: one block per period (old: every waiter, each period)
        if fair:
            assert scripts <= count * 4 + 10
        else:
            assert scripts <= count + 10
    finally:
        holder_client.close()
        locks.close()
