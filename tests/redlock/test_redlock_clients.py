"""What a Redlock client does with its nodes and its own settings, on real nodes checked by an independent client:
a TTL longer than the repair delay is refused before anything is sent (in code and in `fencelock run`); a waiter
meeting a quarantine waits instead of asking again and again; two listed URLs that reach one server, or a replica,
are refused at first contact, naming both; clients listing the nodes in another order start one deployment
together; a node's state is told once per change, and one that only missed the node timeout is slow."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock._redis.redlock import deployment_id
from fencelock.testing.proxy import Proxy
from fencelock.testing.servers import RedisNodes, RedisServer
from fencelock.testing.timing import slack
from tests.conftest import initialise_redlock

from ._support import _holds
from .test_redlock_losses import _restart_empty

_COUNTERS: weakref.WeakKeyDictionary[RedisServer, Any] = weakref.WeakKeyDictionary()


def _calls(node: RedisServer) -> dict[str, int]:
    """Every command the server ran so far, by name (INFO commandstats, read by a client of the test's own, on one
    connection: a new one would count its own handshake)."""
    counter = _COUNTERS.get(node)
    if counter is None:
        counter = _COUNTERS[node] = node.client()
    stats: Any = counter.info("commandstats")
    return {name: int(entry["calls"]) for name, entry in stats.items()}


def _sent(before: dict[str, int], after: dict[str, int]) -> int:
    """Commands run between two `_calls`, leaving out INFO (the counting itself)."""
    return sum(after.get(k, 0) - before.get(k, 0) for k in after if k != "cmdstat_info")


def _scripts_run(before: dict[str, int], after: dict[str, int]) -> int:
    """Script calls between two `_calls` (a script's own commands count in commandstats too: not these)."""
    return sum(after.get(k, 0) - before.get(k, 0) for k in ("cmdstat_evalsha", "cmdstat_eval"))


def _quiet_calls(nodes: list[RedisServer]) -> list[dict[str, int]]:
    """Every node's `_calls`, once the client's background work (an eviction check after a first grant) is done."""
    now = [_calls(node) for node in nodes]
    while True:
        time.sleep(0.1)
        later = [_calls(node) for node in nodes]
        if all(_sent(a, b) == 0 for a, b in zip(now, later, strict=True)):
            return later
        now = later


@pytest.fixture
def nodes() -> Iterator[RedisNodes]:
    started = RedisNodes(3).start()
    yield started
    started.close()


# -- 3: a TTL longer than the repair delay ----------------------------------------------------------------------

def test_a_ttl_longer_than_the_repair_delay_is_refused_before_anything_is_sent(nodes: RedisNodes,
                                                                               name: str) -> None:
    """A lease could outlive a repaired node's quarantine: acquire, lock and extend refuse such a TTL with a
    ValueError naming the TTL, the repair delay and the lock, and no node runs a command."""
    locks = fencelock.connect(nodes.urls, repair_delay=2.0)
    lease = locks.acquire(name, ttl=2.0, wait=2.0)  # at most the delay: fine
    before = _quiet_calls(nodes.nodes)
    with pytest.raises(ValueError, match=r"ttl 3 s .* repair_delay of 2 s.*lock '") as acquired:
        locks.acquire(name + ":b", ttl=3.0, wait=0)
    assert name + ":b" in str(acquired.value)
    with pytest.raises(ValueError, match="repair_delay"), locks.lock(name + ":c", ttl=2.5):
        pass
    with pytest.raises(ValueError, match=r"ttl 2.5 s .* repair_delay of 2 s"):
        lease.extend(2.5)
    assert [_sent(b, _calls(node)) for b, node in zip(before, nodes.nodes, strict=True)] == [0, 0, 0]
    assert lease.remaining() > 0  # the refused extend changed nothing
    lease.release()
    locks.close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fencelock", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "FENCELOCK_URL": ""})


def test_fencelock_run_refuses_a_ttl_above_the_repair_delay_and_takes_repair_delay(nodes: RedisNodes,
                                                                                  name: str) -> None:
    """`fencelock run --ttl 120` on Redlock used the default 60 s delay silently; now it is exit 2 naming both,
    before any lock is taken; `--repair-delay` sets the delay (and is refused for a single Redis)."""
    urls = [arg for url in nodes.urls for arg in ("--url", url)]
    refused = _cli("run", "--ttl", "120", *urls, name, "--", sys.executable, "-c", "pass")
    assert refused.returncode == 2, refused.stderr
    assert "repair_delay" in refused.stderr
    assert "ttl 120 s" in refused.stderr
    assert not any(node.client().exists(redis_keys(name).lock) for node in nodes.nodes)
    ran = _cli("run", "--ttl", "120", "--repair-delay", "130", *urls, name, "--", sys.executable, "-c",
               "import os; print(os.environ['FENCELOCK_FENCE'])")
    assert ran.returncode == 0, ran.stderr
    assert int(ran.stdout) > 0
    single = _cli("run", "--repair-delay", "130", "--url", nodes.urls[0], name, "--", sys.executable, "-c", "pass")
    assert single.returncode == 2
    assert "Redlock only" in single.stderr


# -- 5: a waiter while a node is quarantined ---------------------------------------------------------------------

def test_a_waiter_during_a_quarantine_waits_instead_of_asking_the_nodes_again_and_again(name: str) -> None:
    """A node restarted empty (quarantined for 60 s), X's key on one of the others: a waiter used to try again at
    once, thousands of commands a second on the healthy node, pushing its hwm. Now it blocks until the holder's
    key could expire (or its deadline): a handful of attempts, counted on the healthy node."""
    a, b, c = (RedisServer(name=f"node{i}").start() for i in range(3))
    proxy = Proxy(c.host, c.port).start()
    urls = [a.url, b.url, f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=0.3"]
    try:
        x = fencelock.connect(urls)
        x.acquire(name + ":warm", ttl=1.0, wait=2.0).release()
        proxy.stall()
        held = x.acquire(name, ttl=30.0, wait=0)        # X holds {A, B}
        time.sleep(0.5)                                  # (C's client gave up: nothing of it reaches C later)
        proxy.heal()
        _restart_empty(a)                                # A is quarantined for 60 s; X's key is on B only
        y = fencelock.connect(urls)
        y.acquire(name + ":warm2", ttl=1.0, wait=2.0).release()   # (y's first contact, out of the count)
        (before,) = _quiet_calls([c])
        started = time.monotonic()
        with pytest.raises(fencelock.LockError):
            y.acquire(name, ttl=5.0, wait=2.0)
        took = time.monotonic() - started
        sent = _scripts_run(before, _calls(c))
        assert took >= 2.0                               # it waited for its whole wait ...
        assert sent < 60, sent                           # ... without asking again and again (was thousands)
        assert held.remaining() > 0
        assert _holds(b, name, held.token)
        x.close()
        y.close()
    finally:
        proxy.close()
        for server in (a, b, c):
            server.close()


# -- 7: nodes that are one server, or a replica -------------------------------------------------------------------

@pytest.fixture
def socket_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, str]]:
    path = str(tmp_path_factory.mktemp("sock") / "redis.sock")
    server = RedisServer(extra_args=["--unixsocket", path, "--unixsocketperm", "700"], name="sock").start()
    yield server, path
    server.close()


@pytest.mark.parametrize("alias", ["unix", "0.0.0.0", "[::ffff:127.0.0.1]"])
def test_two_urls_of_one_server_are_refused_at_first_contact_naming_both(
        socket_server: tuple[RedisServer, str], nodes: RedisNodes, name: str, alias: str) -> None:
    """Names connect() cannot tell apart (a socket and a TCP port, 0.0.0.0, an IPv4-mapped address) reach one
    server: its run_id, in its first reply, gives it away. The acquire raises NotIndependent (a ValueError)
    naming both URLs, and no lock is left on any server (it used to be granted by that server twice over)."""
    server, path = socket_server
    first = f"unix://{path}" if alias == "unix" else f"redis://{alias}:{server.port}/0"
    second = f"redis://127.0.0.1:{server.port}/0"
    locks = fencelock.connect([first, second, nodes.urls[0]])
    with pytest.raises(ValueError, match="reach one server") as refused:   # (it used to be granted)
        locks.acquire(name, ttl=1.0, wait=0)
    assert isinstance(refused.value, fencelock.NotIndependent)
    text = str(refused.value)
    assert first in text or path in text
    assert second in text
    deadline = time.monotonic() + slack(2.0)
    while any(r.client().exists(redis_keys(name).lock) for r in (server, nodes.nodes[0])):
        assert time.monotonic() < deadline, "a give-back did not land"
        time.sleep(0.02)
    with pytest.raises(ValueError, match="reach one server"):
        locks.status(name)                            # every later request says so too
    locks.close()


def test_a_replica_listed_as_a_node_is_refused_at_first_contact_naming_its_master(nodes: RedisNodes,
                                                                                 name: str) -> None:
    """A replica of a listed node answers READONLY: it used to be called "unreachable", sending a new deployment
    into quarantine. Its role, asked at once, gives it away: NotIndependent names it and its master."""
    a, b, c = nodes.nodes
    # Redis 7 waits 5 s before a diskless full sync by default; without it the link is up at once.
    a.client().config_set("repl-diskless-sync-delay", 0)
    replica: Any = c.client()
    replica.execute_command("REPLICAOF", a.host, a.port)
    deadline = time.monotonic() + slack(10.0)
    while c.client().info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    locks = fencelock.connect(nodes.urls)
    with pytest.raises(ValueError, match="is a replica") as refused:       # (it used to be granted)
        locks.acquire(name, ttl=1.0, wait=0)
    assert isinstance(refused.value, fencelock.NotIndependent)
    text = str(refused.value)
    assert c.url in text
    assert a.url in text
    assert not any(node.client().exists(redis_keys(name).lock) for node in (a, b))
    locks.close()
    nodes_cli = subprocess.run([sys.executable, "-m", "fencelock", "nodes",
                                *[arg for url in nodes.urls for arg in ("--url", url)]],
                               capture_output=True, text=True, timeout=60)
    assert nodes_cli.returncode == 2, nodes_cli.stderr
    assert "is a replica" in nodes_cli.stderr


# -- 8: the nodes listed in another order -------------------------------------------------------------------------

def test_clients_listing_the_nodes_in_another_order_start_one_new_deployment_together(nodes: RedisNodes,
                                                                                      name: str) -> None:
    """Two clients look at a new deployment at once, one listing the nodes the other way round. They must claim
    the nodes for the same deployment (the digest of the nonces used to follow each client's order: the second
    client's claims failed, and the deployment sat in quarantine). The second finishes what the first claimed."""
    forward = fencelock.connect(nodes.urls)
    backward = fencelock.connect(nodes.urls[::-1])
    ahead: Any = forward.backend
    behind: Any = backward.backend
    views = ahead._look(1.0)
    back_views = behind._look(1.0)
    assert deployment_id(views) == deployment_id(back_views)
    for i in range(3):
        assert ahead._mark(i, views[i], "claim", deployment_id(views))  # the first claims every node ...
    assert behind._mark_new(back_views, 1.0)                              # ... the second marks them all
    claims = {node.client().hget("fencelock:redlock:incarnation", "claim") for node in nodes.nodes}
    assert len(claims) == 1
    assert None not in claims
    assert all(node.client().get("fencelock:redlock:node") for node in nodes.nodes)
    lease = backward.acquire(name, ttl=1.0, wait=0)   # at once: no quarantine
    lease.release()
    forward.close()
    backward.close()


# -- 9: what is told about nodes, and how often --------------------------------------------------------------------

def test_a_waited_out_quarantine_is_told_once_per_node_state_not_at_every_retry(name: str) -> None:
    """Two of four nodes restarted empty (quorum 3): an acquire that waits out their 2 s quarantine used to log a
    WARNING node_out for each at every retry (dozens); now once per node and state."""
    four = RedisNodes(4).start()
    told: list[fencelock.LockEvent] = []
    unsubscribe = fencelock.subscribe(told.append)
    try:
        locks = fencelock.connect(four.urls, repair_delay=2.0)
        locks.acquire(name + ":warm", ttl=1.0, wait=2.0).release()
        for node in four.nodes[:2]:
            _restart_empty(node)
        lease = locks.acquire(name, ttl=1.0, wait=10.0)
        lease.release()
        out = [e for e in told if e.kind == "node_out" and e.name == name]
        per_node: dict[str, list[str]] = {}
        for event in out:
            where, _, state = str(event.error).partition(": ")
            per_node.setdefault(where, []).append(state.split(",")[0].split(" (")[0])
        assert set(per_node) <= {four.urls[0], four.urls[1]}, per_node
        for states in per_node.values():
            assert len(states) == len(set(states)) <= 3, per_node   # each state once (was every retry)
        locks.close()
    finally:
        unsubscribe()
        four.close()


def test_a_node_that_only_missed_the_node_timeout_is_slow_not_unreachable(name: str) -> None:
    """A node whose replies take longer than the node timeout, but answer the longer look, is "slow"."""
    a, b, c = (RedisServer(name=f"node{i}").start() for i in range(3))
    proxy = Proxy(c.host, c.port).start()
    urls = [a.url, b.url, f"redis://127.0.0.1:{proxy.port}/0"]
    try:
        fencelock.connect(urls).acquire(name + ":warm", ttl=1.0, wait=2.0).release()
        _restart_empty(a)
        proxy.delay = 0.06                              # C: 0.12 s a round trip: within the 1 s look, not 0.05
        locks = fencelock.connect(urls, node_timeout=0.05)
        with pytest.raises(fencelock.QuorumUnavailable) as caught:
            locks.acquire(name, ttl=1.0, wait=0)
        states = [state.state for state in caught.value.nodes]
        assert states[2] == "slow", states
        assert f"{urls[2]}: slow" in str(caught.value)
        assert f"{urls[2]}: unreachable" not in str(caught.value)
        locks.close()
    finally:
        proxy.close()
        for server in (a, b, c):
            server.close()


def test_an_acquire_cancelled_while_nodes_are_stopped_tells_no_node_out(name: str) -> None:
    """Three of five nodes stopped: a cancelled asyncio acquire's round still runs to its end in the background (its
    undo follows it), and found no quorum there. That is not news about the nodes (the caller gave up, and what it
    had not sent was never sent): no `node_out` event. An acquire that is not cancelled still tells it."""
    five = RedisNodes(5).start()
    told: list[fencelock.LockEvent] = []
    unsubscribe = fencelock.subscribe(told.append)
    try:
        initialise_redlock(five.urls)
        for node in five.nodes[2:]:
            node.pause()

        async def main() -> None:
            async with fencelock.aio.connect(five.urls, node_timeout=0.3) as locks:
                task = asyncio.ensure_future(locks.acquire(name, ttl=5.0, wait=0))
                await asyncio.sleep(0.1)  # the round is on the wire
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await asyncio.sleep(0.6)  # its round ended by now (the node timeout), in the background
                assert [e for e in told if e.kind == "node_out"] == []
                with pytest.raises(fencelock.QuorumUnavailable):
                    await locks.acquire(name + ":other", ttl=5.0, wait=0)
                assert {e.name for e in told if e.kind == "node_out"} == {name + ":other"}

        asyncio.run(main())
    finally:
        unsubscribe()
        for node in five.nodes[2:]:
            node.resume()
        five.close()


def test_a_server_error_is_reported_as_such_and_not_waited_out(name: str) -> None:
    """Three of five nodes refuse every write (OOM: maxmemory reached). They answer: they are not "unreachable",
    and waiting will not make them grant. The error names the server's answer and comes at once, not after the
    whole wait (it used to say "unreachable" and retry for the wait's 3 s)."""
    five = RedisNodes(5).start()
    try:
        initialise_redlock(five.urls)
        for node in five.nodes[2:]:
            node.client().config_set("maxmemory", "1")
        with fencelock.connect(five.urls) as locks:
            started = time.monotonic()
            with pytest.raises(fencelock.QuorumUnavailable) as caught:
                locks.acquire(name, ttl=5.0, wait=3.0)
            assert time.monotonic() - started < slack(1.0)
            text = str(caught.value)
            assert f"{five.urls[2]}: server error: OOM" in text, text
            assert "unreachable" not in text, text
            assert [state.state for state in caught.value.nodes] == ["ready", "ready", "error", "error", "error"]
            assert caught.value.retry_in is None
    finally:
        for node in five.nodes[2:]:
            node.client().config_set("maxmemory", "0")
        five.close()


def test_an_extend_refused_by_servers_names_their_error(name: str) -> None:
    """On three of five nodes a key fencelock writes has been overwritten with another type while a lease is held:
    its extend cannot reach a quorum, and the error names what those servers answered (WRONGTYPE), not only how
    many nodes it reached."""
    five = RedisNodes(5).start()
    try:
        initialise_redlock(five.urls)
        with fencelock.connect(five.urls) as locks:
            lease = locks.acquire(name, ttl=5.0, wait=0)
            for node in five.nodes[2:]:
                node.client().set("fencelock:redlock:ttls", "not a sorted set")
            with pytest.raises(fencelock.QuorumUnavailable) as caught:
                lease.extend()
            assert f"{five.urls[2]}: server error: WRONGTYPE" in str(caught.value), str(caught.value)
    finally:
        five.close()


def test_sync_a_round_whose_thread_woke_late_reads_the_replies_received_in_time(
        nodes: RedisNodes, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sync client's one thread reading a round's replies is kept from running past the node timeout (the
    interpreter busy with other threads): the replies that came in meanwhile are read, the lock is granted in that
    round, and no node is reported out. Before, the round ended at the deadline with its replies unread: every node
    was reported slow, and their identities asked again."""
    from fencelock._redis.channel import readable
    from fencelock._sync import _multiplex

    initialise_redlock(nodes.urls)
    told: list[fencelock.LockEvent] = []
    locks = fencelock.connect(nodes.urls, node_timeout=0.1)
    locks.acquire(f"{name}:warm", ttl=5.0, wait=2.0).release()  # (connections open, nodes known)
    starved: list[float] = []

    def late_once(socks: list[Any], timeout: float) -> list[Any]:
        if not starved:
            starved.append(timeout)
            time.sleep(timeout + 0.15)  # woke 0.15 s past the node timeout: every reply is in by now
            return []
        return readable(socks, timeout)

    monkeypatch.setattr(_multiplex, "readable", late_once)
    unsubscribe = fencelock.subscribe(told.append)
    try:
        lease = locks.acquire(name, ttl=5.0, wait=0)
        lease.release()
    finally:
        unsubscribe()
        locks.close()
    assert starved, "the round never waited for its replies"
    assert [event.describe() for event in told if event.kind == "node_out"] == []
