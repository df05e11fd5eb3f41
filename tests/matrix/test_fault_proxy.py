"""The instrument itself: each fault of `FaultProxy` does to the k-th matching request what it says, on a real
Redis, and nothing to the others."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from fencelock._etcd import txn
from fencelock._etcd.rules import Kv
from fencelock.testing.faults import CLOSE, LATE, LOSE, PAUSE, RESET_AFTER, RESET_BEFORE, FaultProxy, Rule, parse_frame
from fencelock.testing.framing import HTTP, ZOOKEEPER, etcd_request
from fencelock.testing.servers import RedisServer


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(name="proxy-check") as started:
        yield started


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", server.port) as started:
        yield started


def _client(proxy: FaultProxy) -> redis.Redis:
    return redis.Redis(port=proxy.port, socket_timeout=0.3, socket_connect_timeout=0.3, retry=Retry(NoBackoff(), 0))


def _set_three(proxy: FaultProxy, key: str) -> list[object]:
    """SET key:1..3 on one connection; the outcome of each (True, or the exception)."""
    client = _client(proxy)
    outcomes: list[object] = []
    for i in (1, 2, 3):
        try:
            outcomes.append(client.set(f"{key}:{i}", "v"))
        except redis.RedisError as exc:
            outcomes.append(type(exc))
    client.close()
    return outcomes


@pytest.mark.parametrize(("kind", "ran", "outcome"), [
    (LOSE, True, redis.TimeoutError),
    (LATE, True, redis.TimeoutError),
    (RESET_BEFORE, False, redis.ConnectionError),
    (RESET_AFTER, True, redis.ConnectionError),
    (CLOSE, False, redis.ConnectionError),
])
def test_a_fault_hits_the_kth_matching_request_only(proxy: FaultProxy, server: RedisServer, kind: str, ran: bool,
                                                    outcome: type[Exception]) -> None:
    key = f"proxy:{kind}"
    rule = proxy.arm(Rule(kind, "set", nth=2, delay=0.5 if kind == LATE else 0.0))
    outcomes = _set_three(proxy, key)
    assert rule.hit.wait(1)
    assert rule.request is not None
    assert rule.request.args[1] == f"{key}:2".encode()
    assert outcomes == [True, outcome, True]  # redis-py drops a connection that failed, and connects anew
    assert bool(server.client().exists(f"{key}:2")) is ran
    assert rule.done.wait(2)


def test_a_late_reply_comes_after_its_delay(proxy: FaultProxy) -> None:
    proxy.arm(Rule(LATE, "get", delay=0.2))
    client = redis.Redis(port=proxy.port, socket_timeout=2)
    started = time.monotonic()
    assert client.get("proxy:late") is None
    assert time.monotonic() - started >= 0.2
    client.close()


def test_a_paused_server_runs_the_request_when_it_resumes(proxy: FaultProxy, server: RedisServer) -> None:
    events: list[str] = []

    def pause() -> None:
        server.pause()
        events.append("paused")

    def resume() -> None:
        server.resume()
        events.append("resumed")

    rule = proxy.arm(Rule(PAUSE, "set", delay=0.3, on_pause=pause, on_resume=resume))
    client = redis.Redis(port=proxy.port, socket_timeout=2)
    assert client.set("proxy:pause", "v")
    assert events == ["paused", "resumed"]
    assert rule.done.is_set()
    client.close()


def test_close_idle_closes_only_idle_connections(proxy: FaultProxy) -> None:
    idle = _client(proxy)
    idle.ping()
    busy = redis.Redis(port=proxy.port, socket_timeout=2)
    proxy.arm(Rule(LATE, "get", delay=0.5))
    reader = threading.Thread(target=busy.get, args=("proxy:busy",))
    reader.start()
    time.sleep(0.2)
    assert proxy.close_idle() == 1
    reader.join()  # the busy one still got its reply
    assert proxy.names()[-1] == "get"
    idle.close()
    busy.close()


def test_resp_frames_are_read_whole() -> None:
    assert parse_frame(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n") == (20, [b"GET", b"k"])
    assert parse_frame(b"*2\r\n$3\r\nGET\r\n$1\r\n") is None
    assert parse_frame(b"%1\r\n+a\r\n:1\r\n") == (12, [b"a", b"1"])
    assert parse_frame(b"$-1\r\n") == (5, None)


def test_zookeeper_frames_are_read_whole_and_named_by_their_operation() -> None:
    header = (7).to_bytes(4, "big") + (15).to_bytes(4, "big")  # xid 7, create2
    frame = len(header + b"body").to_bytes(4, "big") + header + b"body"
    assert ZOOKEEPER.split(frame + b"\x00\x00") == (len(frame), header + b"body")
    assert ZOOKEEPER.split(frame[:-1]) is None
    assert ZOOKEEPER.request(0, frame, b"connect request")[0] == "connect"  # a connection's first frame
    assert ZOOKEEPER.request(1, frame, header + b"body")[0] == "create2"
    notification = (-1).to_bytes(4, "big", signed=True) + bytes(12)
    assert not ZOOKEEPER.is_reply(3, b"", notification)  # a watch firing answers no request
    assert ZOOKEEPER.is_reply(3, b"", header + bytes(12))
    assert ZOOKEEPER.is_reply(0, b"", notification[:4])  # the connect response


def _post(path: str, body: bytes) -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (path.encode(), len(body)) + body


def test_http_messages_are_read_whole_and_a_stream_in_parts() -> None:
    request = _post("/v3/lease/grant", b'{"TTL": 2}')
    assert HTTP.split(request + b"POST")[0] == len(request)  # type: ignore[index]
    assert HTTP.split(request[:-1]) is None
    assert HTTP.request(0, request, HTTP.split(request)[1])[0] == "grant"  # type: ignore[index]
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    end, first = HTTP.split(head + b"3\r\nabc\r\n2\r\nd")  # type: ignore[misc]
    assert (end, first.body, HTTP.is_reply(0, b"", first), HTTP.streaming(first)) == (len(head) + 8, b"abc", True, True)
    end, rest = HTTP.split(b"2\r\nde\r\n0\r\n\r\n")  # type: ignore[misc]
    assert (rest.body, HTTP.is_reply(1, b"", rest), HTTP.continues(rest), HTTP.streaming(rest)) == (b"de", False, True,
                                                                                                   False)
    whole = head + b"3\r\nabc\r\n0\r\n\r\n"
    assert HTTP.split(whole)[0] == len(whole)  # type: ignore[index]
    assert not HTTP.streaming(HTTP.split(whole)[1])  # type: ignore[index]


def test_etcd_transactions_are_named_by_what_they_do() -> None:
    def name(body: dict[str, object]) -> str:
        return etcd_request("/v3/kv/txn", json.dumps(body).encode())

    kv = Kv(b"d/1", 5, 7, b"t")
    assert name(txn.join(b"d/1", "t", 7, b"d/")) == "acquire"
    assert name(txn.look(b"d/1", b"d/", 5)) == "look"
    assert name(txn.check([b"d/1"])) == "check"
    assert name(txn.move(b"d/1", "t", 5, 8, 1)) == "move"
    assert name(txn.release(b"d/1", "t", 5, b"d/", b"d")) == "release"
    assert name(txn.count_newer(b"d/", 5)) == "release"
    assert name(txn.force_release(kv, b"d")) == "force_release"
    assert etcd_request("/v3/kv/range", b"{}") == "range"
    assert etcd_request("/version", b"") == "version"
