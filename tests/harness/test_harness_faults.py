"""The fault-injection pieces of the harness on real servers: the delaying/stalling proxy and the primary+replica
pair whose replication can be held back before a failover."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import redis

from fencelock.testing.proxy import Proxy
from fencelock.testing.servers import RedisPrimaryReplica, RedisServer
from fencelock.testing.timing import slack
from tests.conftest import _require_server_binary


@pytest.fixture
def through_proxy(own_server: RedisServer) -> Iterator[tuple[Proxy, redis.Redis]]:
    with Proxy(own_server.host, own_server.port, name="test") as proxy:
        client = redis.Redis(host=proxy.host, port=proxy.port, socket_timeout=2)
        yield proxy, client
        client.close()


def test_the_proxy_forwards_then_delays_every_byte(through_proxy: tuple[Proxy, redis.Redis]) -> None:
    proxy, client = through_proxy
    assert client.ping()
    proxy.delay = 0.3
    start = time.monotonic()
    assert client.set("k", "v")
    elapsed = time.monotonic() - start
    assert 0.55 <= elapsed < 0.6 + slack(1.4), elapsed  # 0.3 s out and 0.3 s back
    proxy.delay = 0.0
    assert client.get("k") == b"v"
    assert proxy.connections == 1


def test_a_stalled_proxy_delivers_nothing_until_it_heals(through_proxy: tuple[Proxy, redis.Redis],
                                                         own_server: RedisServer) -> None:
    proxy, client = through_proxy
    assert client.ping()
    impatient = redis.Redis(host=proxy.host, port=proxy.port, socket_timeout=0.3)
    assert impatient.ping()
    proxy.stall()
    with pytest.raises(redis.TimeoutError):
        impatient.set("dropped", "1")   # this client gives up and closes its connection
    patient = socket.create_connection((proxy.host, proxy.port), timeout=5)
    patient.sendall(b"*3\r\n$3\r\nSET\r\n$4\r\nheld\r\n$1\r\n1\r\n")
    time.sleep(0.2)
    direct = own_server.client()
    assert direct.get("held") is None, "a stalled proxy let a command through"
    proxy.heal()
    assert patient.recv(100) == b"+OK\r\n", "what an open connection held back is delivered when the stall ends"
    assert direct.get("held") == b"1"
    assert direct.get("dropped") is None, "a connection its client gave up on is dropped with what it held"
    patient.close()
    impatient.close()


def test_a_write_held_back_from_the_replica_is_lost_when_it_is_promoted() -> None:
    _require_server_binary()
    with RedisPrimaryReplica() as pair:
        primary, replica = pair.primary.client(), pair.replica.client()
        primary.set("before", "1")
        pair.wait_in_sync(5)
        assert replica.get("before") == b"1"
        pair.pause_replication()
        primary.set("after", "1")
        time.sleep(0.1)
        assert replica.get("after") is None
        pair.fail_over()
        assert not pair.primary.running
        promoted = pair.replica.client()
        assert promoted.get("before") == b"1"
        assert promoted.get("after") is None
        assert promoted.set("new", "1")  # a primary now, not a read-only replica
