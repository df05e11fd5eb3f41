"""`service_nodes`: which servers (and key spaces) lock-service URLs name, whatever their spelling. Pure."""

from __future__ import annotations

from fencelock._logic.urls import service_nodes


def test_one_server_spelled_differently_is_one_node() -> None:
    same = ["redis://127.0.0.1:6379/0", "redis://localhost", "redis://LOCALHOST:6379", "redis://[::1]:6379/0",
            "redis://user:secret@127.0.0.1/0", "redis://127.0.0.1:6379?db=0", "rediss://127.0.0.1:6379/0",
            "redis://user:***@127.0.0.1:6379/0", "redis://127.0.0.1:6379/00", "redis://127.0.0.1?db=000"]
    for url in same:
        assert service_nodes([url]) == {"redis 127.0.0.1:6379/0"}, url


def test_another_port_or_database_is_another_node() -> None:
    assert service_nodes(["redis://127.0.0.1:6380/0"]) == {"redis 127.0.0.1:6380/0"}
    assert service_nodes(["redis://127.0.0.1/1"]) == {"redis 127.0.0.1:6379/1"}
    assert not service_nodes(["redis://db.example:6379"]) & service_nodes(["redis://127.0.0.1:6379"])
    assert service_nodes(["redis://127.0.0.2:6379"]) == {"redis 127.0.0.2:6379/0"}   # (a server may bind only it)


def test_unix_sockets_compare_by_normalised_path() -> None:
    assert service_nodes(["unix:///run/redis//./redis.sock"]) == service_nodes(["unix:///run/redis/redis.sock?db=0"])
    assert service_nodes(["unix:///run/redis.sock?db=2"]) == {"unix /run/redis.sock/2"}


def test_redlock_etcd_and_zookeeper_name_every_member() -> None:
    nodes = service_nodes(["redis://h1:7000", "redis://h2:7000", "redis://h3:7000"])
    assert nodes == {"redis h1:7000/0", "redis h2:7000/0", "redis h3:7000/0"}
    assert service_nodes(["etcd://a:2379,b"]) == {"etcd a:2379", "etcd b:2379"}
    assert service_nodes(["etcds://a"]) == {"etcd a:2379"}
    assert service_nodes(["zookeeper://z1,z2:2182/locks/"]) == {"zookeeper z1:2181/locks", "zookeeper z2:2182/locks"}
    assert service_nodes(["not a url", "redis://:bad-port"]) == frozenset()
