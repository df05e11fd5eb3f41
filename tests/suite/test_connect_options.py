"""`connect()` refuses Redlock's options (`node_timeout`, `repair`, `repair_delay`) for every other kind of target,
where they would be silently ignored, before anything is sent; Redlock still takes them, and their defaults stay
accepted everywhere.

Each target points at a loopback socket that listens but is never served: that no connection reached it proves the
refusal came before anything was sent (the synchronous Redis Cluster client would otherwise ask for the cluster's
layout at once)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import fencelock
from fencelock.testing.servers import free_port

OPTIONS: list[dict[str, Any]] = [
    {"node_timeout": 0.2},
    {"repair": False},
    {"repair": True},          # given, even as Redlock's default value: it would act on nothing here
    {"repair_delay": 5.0},
    {"node_timeout": 0.2, "repair": False, "repair_delay": 5.0},
]

KINDS = {
    "redis": ("redis://127.0.0.1:{port}/0", "a single Redis"),
    "cluster": ("redis+cluster://127.0.0.1:{port}", "a Redis Cluster"),
    "etcd": ("etcd://127.0.0.1:{port}", "etcd"),
    "zookeeper": ("zookeeper://127.0.0.1:{port}", "ZooKeeper"),
}


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening socket nobody serves: `nothing_connected` tells whether a client reached it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def nothing_connected(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_redlock_options_are_refused_for_other_urls_before_anything_is_sent(
        kind: str, options: dict[str, Any], listener: socket.socket) -> None:
    template, shown = KINDS[kind]
    url = template.format(port=listener.getsockname()[1])
    for connect in (fencelock.connect, fencelock.aio.connect):
        with pytest.raises(ValueError, match="to Redlock only") as info:
            connect(url, **options)
        message = str(info.value)
        for option in options:
            assert option in message, message
        assert f"not to {shown}:" in message, message
        assert "3 or more" in message, message
    assert nothing_connected(listener)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_redlock_options_are_refused_with_a_redis_py_client(options: dict[str, Any],
                                                           listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    client = redis.Redis(host="127.0.0.1", port=port)
    aclient = redis.asyncio.Redis(host="127.0.0.1", port=port)
    try:
        with pytest.raises(ValueError, match=r"Redlock only .* not to a redis-py client"):
            fencelock.connect(client, **options)
        with pytest.raises(ValueError, match=r"Redlock only .* not to a redis-py client"):
            fencelock.aio.connect(aclient, **options)
    finally:
        client.close()
        asyncio.run(aclient.aclose())
    assert nothing_connected(listener)


@pytest.mark.parametrize("kind", sorted(set(KINDS) - {"cluster"}))
def test_the_defaults_stay_accepted_for_every_url(kind: str, listener: socket.socket) -> None:
    url = KINDS[kind][0].format(port=listener.getsockname()[1])
    # Not given, or given as None (which means "Redlock's default"): nothing to refuse.
    fencelock.connect(url).close()
    fencelock.connect(url, node_timeout=None, repair=None, repair_delay=None).close()

    async def main() -> None:
        await fencelock.aio.connect(url).aclose()

    asyncio.run(main())
    assert nothing_connected(listener)


def test_redlock_still_takes_its_options_and_checks_them(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    # three servers (one database each: databases of one server are not independent nodes); only the first listens
    urls = [f"redis://127.0.0.1:{p}/0" for p in (port, free_port(), free_port())]
    backend: Any
    for locks in (fencelock.connect(urls), fencelock.connect(urls, node_timeout=0.2, repair=False,
                                                             repair_delay=5.0)):
        backend = locks.backend
        locks.close()
    assert backend._repair is False
    assert backend._repair_delay_ms == 5000
    default: Any = fencelock.connect(urls, repair=True)
    assert default.backend._repair is True
    assert default.backend._repair_delay_ms == 60_000
    default.close()
    with pytest.raises(ValueError, match="node_timeout"):
        fencelock.connect(urls, node_timeout=-1)
    with pytest.raises(ValueError, match="repair_delay"):
        fencelock.connect(urls, repair_delay=float("nan"))
    with pytest.raises(TypeError, match="repair must be True or False"):
        fencelock.connect(urls, repair="yes")  # type: ignore[arg-type]
    assert nothing_connected(listener)
