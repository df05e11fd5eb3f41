"""The ZooKeeper backend when its server fails: a server absent, stopped or stalled with a create on the wire gives
a BackendError within the timeout and leaves no node behind; a holder process frozen past its session loses the
lock and the fence rejects its late write; a restart within the session keeps the lease. Tests that stop the
server have a server of their own (`own_zk`)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import fencelock
from fencelock._zk.rules import Session
from fencelock.testing.proxy import Proxy
from fencelock.testing.timing import slack
from fencelock.testing.zookeeper import ZooKeeperDeployment, ZooKeeperServer, four_letter_word
from tests.conftest import _require_zookeeper, until


def test_no_server_is_a_backend_error_within_the_timeout(name: str) -> None:
    with socket.socket() as probe:  # a port where nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    locks = fencelock.connect(f"zookeeper://127.0.0.1:{port}/x?timeout=0.5")
    started = time.monotonic()
    with pytest.raises(fencelock.BackendError) as info:
        locks.acquire(name, wait=0)
    assert time.monotonic() - started < 0.5 + slack(1.0)
    assert info.value.name == name
    locks.close()


def test_a_stopped_server_is_a_backend_error_within_the_timeout(own_zk: ZooKeeperDeployment, name: str) -> None:
    locks = fencelock.connect(own_zk.target + "?timeout=0.5")
    lease = locks.acquire(name, ttl=5.0, wait=0)
    own_zk.pause()
    started = time.monotonic()
    with pytest.raises(fencelock.BackendError):
        locks.acquire(name + ":2", ttl=5.0, wait=0)
    with pytest.raises(fencelock.BackendError):
        lease.release()
    assert time.monotonic() - started < 2 * 0.5 + slack(2.0)
    own_zk.resume()
    lease.release()  # it kept its token: released once the server answers
    assert own_zk.nodes(name) == []
    locks.close()


def _session(locks: fencelock.Locks) -> Any:
    backend: Any = locks.backend
    return next(iter(backend._sessions.values()))


def test_an_attempt_during_a_suspended_session_leaves_no_node(own_zk: ZooKeeperDeployment, name: str) -> None:
    locks = fencelock.connect(own_zk.target + "?timeout=0.5")
    locks.acquire(name + ":warm", ttl=1.0, wait=0).release()  # a session of 1.19 s: suspended after 0.8 s
    session = _session(locks)
    own_zk.pause()
    until(lambda: session.state is Session.SUSPENDED, 5.0, "kazoo saw the connection drop")
    with pytest.raises(fencelock.BackendError, match="suspended"):
        locks.acquire(name, ttl=1.0, wait=0)
    own_zk.resume()
    until(lambda: session.connected, 10.0, "the session came back")
    time.sleep(0.3)
    assert own_zk.nodes(name) == []
    locks.close()


def test_an_attempt_whose_answer_never_came_leaves_no_node(own_zk: ZooKeeperDeployment, name: str) -> None:
    """The server stalls with the create on the wire: the create lands after we gave up, and is then undone."""
    locks = fencelock.connect(own_zk.target + "?timeout=0.3")
    locks.acquire(name + ":warm", ttl=10.0, wait=0).release()  # a long session: it stays CONNECTED
    own_zk.pause()
    with pytest.raises(fencelock.BackendError):
        locks.acquire(name, ttl=10.0, wait=0)
    own_zk.resume()
    until(lambda: own_zk.nodes(name) == [], 5.0, "the late node was deleted")
    time.sleep(0.3)
    assert own_zk.nodes(name) == []
    lease = locks.acquire(name, ttl=10.0, wait=0)  # and the lock is free
    lease.release()
    locks.close()


_HOLDER = textwrap.dedent("""
    import sqlite3, sys
    import fencelock
    url, name, db = sys.argv[1:4]
    locks = fencelock.connect(url)
    lease = locks.acquire(name, ttl=1.0, wait=0, renew=True)
    print(lease.fence, flush=True)
    sys.stdin.readline()               # the parent stops us here, and wakes us much later
    conn = sqlite3.connect(db, isolation_level=None)
    guard = fencelock.SQLGuard(paramstyle="qmark")
    try:
        conn.execute("BEGIN IMMEDIATE")
        guard.check(conn.cursor(), name, lease.fence)
        conn.execute("UPDATE account SET owner = 'old holder'")
        conn.execute("COMMIT")
        print("written", flush=True)
    except fencelock.StaleFence as exc:
        conn.execute("ROLLBACK")
        print("stale", exc.fence, exc.highest, flush=True)
""")


def test_a_frozen_holder_process_loses_its_session_and_its_late_write_is_rejected(
        zk: ZooKeeperDeployment, name: str, tmp_path: Any) -> None:
    db = str(tmp_path / "store.db")
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE account (owner TEXT)")
    conn.execute("INSERT INTO account VALUES ('nobody')")
    guard = fencelock.SQLGuard(paramstyle="qmark")
    guard.create_table(conn.cursor())
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, zk.target, name, db], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        old_fence = int(child.stdout.readline())
        os.kill(child.pid, signal.SIGSTOP)  # a GC pause, swap, a stalled VM: its session stops being renewed
        locks = zk.connect()
        started = time.monotonic()
        lease = locks.acquire(name, ttl=5.0, wait=10.0)
        took = time.monotonic() - started
        assert took < 1.19 + slack(1.8), took  # the session timeout for ttl=1 s is 1.19 s, the TTL clock 1 s
        assert lease.fence > old_fence
        conn.execute("BEGIN IMMEDIATE")
        guard.check(conn.cursor(), name, lease.fence)
        conn.execute("UPDATE account SET owner = 'new holder'")
        conn.execute("COMMIT")
        os.kill(child.pid, signal.SIGCONT)
        child.stdin.write("go\n")
        child.stdin.flush()
        answer = child.stdout.readline().split()
        assert answer == ["stale", str(old_fence), str(lease.fence)]
        assert conn.execute("SELECT owner FROM account").fetchone() == ("new holder",)
        assert zk.holder(name) == lease.token
        lease.release()
        locks.close()
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait(10)
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()


def test_a_lease_outlives_a_server_restart_within_its_session(own_zk: ZooKeeperDeployment, name: str) -> None:
    """ZooKeeper keeps sessions in its transaction log: a server killed and restarted within the session timeout
    gives the session back, and the lease's node with it."""
    locks = fencelock.connect(own_zk.target)
    lease = locks.acquire(name, ttl=10.0, wait=0, renew=True)
    own_zk.server.kill()
    own_zk.server.start()
    until(lambda: _session(locks).connected, 10.0, "the session came back")
    lease.extend()
    assert own_zk.holder(name) == lease.token
    assert not lease.lost
    lease.release()
    assert own_zk.nodes(name) == []
    locks.close()


def test_a_handshake_without_an_answer_is_given_up_within_the_timeout(own_zk: ZooKeeperDeployment, name: str) -> None:
    """A server that accepts a connection and never answers its handshake (one starting up, or frozen) holds the
    session for at most the URL's timeout, not for kazoo's whole session timeout: the client tries again and again,
    and the lease survives once the server answers."""
    with Proxy(own_zk.server.host, own_zk.server.port, name="zk-handshake") as proxy:
        locks = fencelock.connect(f"zookeeper://{proxy.host}:{proxy.port}{own_zk.chroot}?timeout=0.5")
        lease = locks.acquire(name, ttl=10.0, wait=0, renew=True)
        proxy.stall()
        with pytest.raises(fencelock.BackendError):
            lease.extend()  # no answer within 0.5 s: the connection is dropped, and kazoo reconnects
        first = proxy.connections
        until(lambda: proxy.connections >= first + 3, slack(5.0),
              "three more connections, each given up after its handshake got no answer")
        proxy.heal()
        until(lambda: _session(locks).connected, slack(5.0), "the session came back")
        lease.extend()
        assert not lease.lost
        assert own_zk.holder(name) == lease.token
        lease.release()
        locks.close()


def test_the_harness_chooses_a_new_port_when_its_first_was_taken_and_pause_stops_every_thread() -> None:
    _require_zookeeper()
    with socket.socket() as holder:
        server = ZooKeeperServer(name="zk-port")
        try:
            holder.bind(("127.0.0.1", server.port))
            holder.listen()
            taken = server.port
            server.start()
            assert server.port != taken
            server.pause()
            assert server.paused
            assert four_letter_word(server.host, server.port, "srvr", timeout=0.5) == ""
            server.resume()
            assert "Zookeeper version" in four_letter_word(server.host, server.port, "srvr")
            pid = server.pid
            server.kill()
            assert server.pid is None
            assert server.exit_code == -signal.SIGKILL
            server.restart()
            assert server.pid not in (None, pid)
        finally:
            server.close()
        assert not os.path.exists(server.dir)


def test_the_first_call_after_a_pause_that_left_a_renewal_unanswered_rides_out_the_reconnect(
        own_zk: ZooKeeperDeployment, name: str) -> None:
    """A renewal with no answer makes fencelock drop the connection (its member is silent). Once the server is
    back, a new `wait=0` acquire waits for the reconnect instead of failing "suspended": only the attempts of a call
    that met the silence itself skip that wait, which keeps a paused server's error within one timeout (the matrix
    soak found the first call after a 0.6-0.8 s pause failing)."""
    locks = fencelock.connect(own_zk.target + "?timeout=0.5")
    try:
        held = locks.acquire(name, ttl=10.0, wait=0, renew=0.1)
        session = _session(locks)
        outcome: list[Any] = []
        own_zk.pause()
        try:
            until(lambda: session.silent, 5.0, "a renewal went unanswered and fencelock dropped the connection")
            # A new call starts while the server is still stopped, and the server comes back within its timeout.
            caller = threading.Thread(target=lambda: outcome.append(_attempt(locks, name + ":after")))
            caller.start()
            time.sleep(0.1)
        finally:
            own_zk.resume()
        caller.join(10.0)
        assert outcome, "the call did not end"
        assert not isinstance(outcome[0], BaseException), outcome  # the same client, not rebuilt
        outcome[0].release()
        with contextlib.suppress(fencelock.LockError):
            held.release()
    finally:
        locks.close()


def _attempt(locks: fencelock.Locks, name: str) -> Any:
    try:
        return locks.acquire(name, ttl=10.0, wait=0)
    except fencelock.LockError as exc:
        return exc
