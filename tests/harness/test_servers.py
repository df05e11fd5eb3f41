"""Tests for fencelock.testing.servers: real redis-server / valkey-server processes, no mocks."""

from __future__ import annotations

import os
import socket
import time

import pytest
import redis

from fencelock.testing.servers import (
    RedisClusterServers,
    RedisServer,
    find_server_binary,
    free_port,
)
from fencelock.testing.timing import slack


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_find_server_binary_honours_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FENCELOCK_REDIS_SERVER", "/opt/custom/redis-server")
    assert find_server_binary() == "/opt/custom/redis-server"
    monkeypatch.delenv("FENCELOCK_REDIS_SERVER")
    assert os.access(find_server_binary(), os.X_OK)


def test_start_and_ping() -> None:
    with RedisServer() as srv:
        assert srv.pid is not None
        assert srv.host == "127.0.0.1"
        assert srv.url == f"redis://127.0.0.1:{srv.port}/0"
        assert os.path.isdir(srv.dir)
        assert srv.client().ping() is True
        with redis.Redis.from_url(srv.url) as by_url:
            assert by_url.ping() is True


def test_pause_times_out_and_resume_recovers() -> None:
    with RedisServer() as srv:
        c = srv.client(socket_timeout=0.3)
        c.set("k", "v")
        srv.pause()
        t0 = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            c.get("k")
        assert time.monotonic() - t0 < slack(1.0)  # one attempt, no hidden retries
        srv.resume()
        assert c.get("k") == b"v"


def test_kill_restart_non_durable_loses_keys() -> None:
    with RedisServer() as srv:
        c = srv.client()
        c.set("k", "v")
        port, old_pid = srv.port, srv.pid
        srv.kill()
        assert srv.pid is None
        srv.restart()
        assert (srv.port, srv.url) == (port, f"redis://127.0.0.1:{port}/0")
        assert srv.pid != old_pid
        assert c.get("k") is None
        assert c.dbsize() == 0


def test_kill_restart_durable_keeps_key_and_ttl() -> None:
    with RedisServer(durable=True) as srv:
        c = srv.client()
        c.set("k", "v", px=60_000)
        c.set("forever", "x")
        srv.kill()
        srv.restart()
        assert c.get("k") == b"v"
        assert 50_000 < c.pttl("k") <= 60_000
        assert c.get("forever") == b"x"
        assert c.pttl("forever") == -1


def test_restart_after_graceful_stop_and_while_clients_held_connections() -> None:
    with RedisServer(durable=True) as srv:
        c = srv.client()
        c.set("k", "v")
        srv.stop()
        srv.restart()  # the port may have sockets in TIME_WAIT: must not matter
        assert c.get("k") == b"v"
        srv.restart()  # restart of a running server = stop + start
        assert c.get("k") == b"v"


def test_explicit_port_in_use_fails_fast_with_log() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        srv = RedisServer(port=port)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="Address already in use"):
            srv.start()
        assert time.monotonic() - t0 < slack(5.0)
        assert srv.port == port
        srv.close()


def test_an_automatic_port_taken_before_the_first_start_is_chosen_again_and_then_kept() -> None:
    srv = RedisServer()
    try:
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", srv.port))
            holder.listen()
            taken = srv.port
            srv.start()
            assert srv.port != taken
            assert srv.client().ping() is True
        srv.kill()
        with socket.socket() as holder:  # once served on, the port is the server's: a later start keeps it
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # our client's connection is in TIME_WAIT
            holder.bind(("127.0.0.1", srv.port))
            holder.listen()
            port = srv.port
            with pytest.raises(RuntimeError, match="Address already in use"):
                srv.start()
            assert srv.port == port
    finally:
        srv.close()


def test_close_is_idempotent_and_leaves_no_process() -> None:
    srv = RedisServer().start()
    pid = srv.pid
    assert pid is not None
    srv.pause()  # close must also end a SIGSTOPped server
    srv.close()
    srv.close()
    assert _gone(pid)
    assert srv.pid is None
    assert not os.path.exists(srv.dir)
    with pytest.raises(RuntimeError):
        srv.restart()


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_cluster_of_three_masters() -> None:
    cluster = RedisClusterServers(3).start()
    try:
        assert len(cluster.nodes) == 3
        assert cluster.url == f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}"
        rc = cluster.client()
        keys = [f"key:{i}" for i in range(30)]
        for k in keys:
            rc.set(k, k)
        assert [rc.get(k) for k in keys] == [k.encode() for k in keys]
        # The keys really are spread over all three masters (slots on every node).
        per_node = [n.client().dbsize() for n in cluster.nodes]
        assert sum(per_node) == len(keys)
        assert all(count > 0 for count in per_node)
        for node in cluster.nodes:
            info = node.client().cluster("info")
            assert info["cluster_state"] == "ok"
        pids = [n.pid for n in cluster.nodes]
    finally:
        cluster.close()
    cluster.close()
    assert all(p is not None and _gone(p) for p in pids)
    assert not any(os.path.exists(n.dir) for n in cluster.nodes)
