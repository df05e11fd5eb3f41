"""How `FaultProxy` reads a protocol: where each message ends, what a request is called, which server messages are
replies. RESP is `fencelock.testing.faults`' default; ZooKeeper's is here::

    with FaultProxy("127.0.0.1", server.port, framing=ZOOKEEPER) as proxy:
        proxy.arm(Rule(RESET_AFTER, "multi"))      # a release (delete + fence, one transaction) runs, then a reset

ZooKeeper's client protocol (Jute) sends every message as a 4-byte big-endian length and that many bytes. A
connection opens with the client's ConnectRequest (named ``"connect"``) and the server's ConnectResponse; each later
request starts with its xid and its operation code (named as ZooKeeper's `OpCode`: ``"create2"``, ``"delete"``,
``"setData"``, ``"getChildren"``, ``"multi"``, ``"ping"``...). The server answers a connection's requests in order;
watch notifications (xid -1) answer nothing and pass untouched.

etcd's JSON gateway (`HTTP`) speaks HTTP/1.1: a header block, then a body of ``Content-Length`` bytes or in chunks.
A request is named by what fencelock sends it for. ``/v3/kv/txn`` by its body: ``"acquire"`` (put our key if absent),
``"look"`` (a waiter reads its key, the holder's and its predecessor's), ``"check"`` (an extend or a renewal reads
its keys), ``"move"`` (the key to another lease), ``"release"`` (compare-and-delete, or the count of a release of
which nothing is left), ``"force_release"``; every other path by its last part: ``"range"`` (``/v3/kv/range``: status),
``"grant"``, ``"keepalive"``, ``"revoke"``, ``"timetolive"``, ``"watch"``, ``"authenticate"``, ``"version"``. A
streamed response (chunked: a keep-alive's, a watch's) is the reply to its request from its header block on; the
chunks after that are the rest of that reply (dropped with it if it is lost), and the reply stays open until its
last chunk or the connection's end (a watch never ends: its connection carries nothing else).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HTTP", "ZOOKEEPER", "Framing", "HttpFraming", "HttpMessage", "ZooKeeperFraming", "etcd_request",
           "zookeeper_op"]


class Framing:
    """One protocol's message boundaries and names. `index` counts the messages of one direction of one
    connection from 0."""

    name = "framing"

    def split(self, buf: bytes | bytearray) -> tuple[int, Any] | None:
        """The first whole message in `buf`: (its end offset, its parsed value), or None if more bytes are needed."""
        raise NotImplementedError

    def request(self, index: int, raw: bytes, value: Any) -> tuple[str, tuple[bytes, ...]]:
        """A request's name (what a `Rule` matches) and its arguments."""
        raise NotImplementedError

    def is_reply(self, index: int, raw: bytes, value: Any) -> bool:
        """Whether a message from the server answers the oldest request not answered yet (False: one the server
        sends of its own accord, which is forwarded untouched)."""
        return True

    def rewrite(self, raw: bytes, redirects: dict[int, int]) -> bytes:
        """A reply as the client must see it behind the proxy (`FaultProxy.redirects`)."""
        return raw

    def continues(self, value: Any) -> bool:
        """Whether a server message that is not a reply carries on the reply before it (dropped if that was lost)."""
        return False

    def streaming(self, value: Any) -> bool:
        """Whether the reply this server message belongs to goes on after it (the connection is not idle)."""
        return False


_OPS = {0: "notification", 1: "create", 2: "delete", 3: "exists", 4: "getData", 5: "setData", 6: "getACL",
        7: "setACL", 8: "getChildren", 9: "sync", 11: "ping", 12: "getChildren2", 13: "check", 14: "multi",
        15: "create2", 16: "reconfig", 17: "checkWatches", 18: "removeWatches", 19: "createContainer",
        20: "deleteContainer", 21: "createTTL", 22: "multiRead", 100: "auth", 101: "setWatches", 102: "sasl",
        103: "getEphemerals", 104: "getAllChildrenNumber", 105: "setWatches2", 106: "addWatch", 107: "whoAmI",
        -10: "createSession", -11: "closeSession", -1: "error"}

NOTIFICATION_XID = -1


def zookeeper_op(code: int) -> str:
    """ZooKeeper's name for an operation code (`OpCode` in its Jute definitions), or ``"op<code>"``."""
    return _OPS.get(code, f"op{code}")


def _int(data: bytes | bytearray, at: int) -> int:
    return int.from_bytes(data[at:at + 4], "big", signed=True)


class ZooKeeperFraming(Framing):
    """ZooKeeper's length-prefixed frames (see the module's docstring)."""

    name = "zookeeper"

    def split(self, buf: bytes | bytearray) -> tuple[int, Any] | None:
        if len(buf) < 4:
            return None
        size = _int(buf, 0)
        if size < 0 or len(buf) < 4 + size:
            return None
        return 4 + size, bytes(buf[4:4 + size])

    def request(self, index: int, raw: bytes, value: Any) -> tuple[str, tuple[bytes, ...]]:
        if index == 0:
            return "connect", (value,)
        return zookeeper_op(_int(value, 4)), (value,)

    def is_reply(self, index: int, raw: bytes, value: Any) -> bool:
        return index == 0 or _int(value, 0) != NOTIFICATION_XID


ZOOKEEPER = ZooKeeperFraming()


# -- HTTP/1.1 (etcd's JSON gateway) ------------------------------------------------------------------------------

@dataclass(frozen=True)
class HttpMessage:
    """A request, a response's head (with the chunks that came with it), or more chunks of a streamed response
    (`kind`: "request", "response", "chunks"). `open`: a streamed response whose last chunk has not come yet."""

    kind: str
    start: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    open: bool = False


_METHODS = (b"GET ", b"POST ", b"PUT ", b"DELETE ", b"HEAD ", b"OPTIONS ", b"PATCH ")
_NO_BODY = re.compile(rb"HTTP/1\.[01] (1\d\d|204|304) ")


def _chunks(buf: bytes | bytearray, at: int) -> tuple[int, bytes, bool]:
    """The whole chunks from `at`: (where they end, their data, whether the last chunk was among them)."""
    data = bytearray()
    while True:
        line_end = buf.find(b"\r\n", at)
        if line_end < 0:
            return at, bytes(data), False
        size = int(bytes(buf[at:line_end]).split(b";")[0].strip() or b"0", 16)
        if size == 0:  # the last chunk, then trailers up to an empty line
            trailers_end = buf.find(b"\r\n\r\n", line_end)
            if buf[line_end:line_end + 4] == b"\r\n\r\n":
                return line_end + 4, bytes(data), True
            if trailers_end < 0:
                return at, bytes(data), False
            return trailers_end + 4, bytes(data), True
        if len(buf) < line_end + 2 + size + 2:
            return at, bytes(data), False
        data += buf[line_end + 2:line_end + 2 + size]
        at = line_end + 2 + size + 2


def etcd_request(path: str, body: bytes) -> str:
    """The name of a request fencelock sends etcd's gateway (see the module's docstring)."""
    if path.startswith("/version"):
        return "version"
    if path != "/v3/kv/txn":
        return path.rstrip("/").rsplit("/", 1)[-1] or path
    try:
        txn = json.loads(body)
    except ValueError:
        return "txn"
    compare = txn.get("compare") or []
    success = txn.get("success") or []
    ops = {op for item in success for op in item}
    if "request_delete_range" in ops:  # (and the put that records the fence)
        return "release" if any(c.get("target") == "VALUE" for c in compare) else "force_release"
    if "request_put" in ops:
        absent = any(c.get("target") == "CREATE" and not int(c.get("create_revision") or 0) for c in compare)
        return "acquire" if absent else "move"
    ranges = [item["request_range"] for item in success if "request_range" in item]
    if any(r.get("count_only") for r in ranges):
        return "release"
    return "look" if any(r.get("range_end") for r in ranges) else "check"


class HttpFraming(Framing):
    """HTTP/1.1 requests and responses, requests named as etcd's gateway (see the module's docstring)."""

    name = "http"

    def split(self, buf: bytes | bytearray) -> tuple[int, Any] | None:
        if not (buf.startswith(b"HTTP/") or buf.startswith(_METHODS)):
            end, data, last = _chunks(buf, 0)  # the rest of a streamed response
            return None if end == 0 else (end, HttpMessage("chunks", body=data, open=not last))
        head_end = buf.find(b"\r\n\r\n")
        if head_end < 0:
            return None
        start, *lines = bytes(buf[:head_end]).decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        kind = "response" if buf.startswith(b"HTTP/") else "request"
        at = head_end + 4
        if "chunked" in headers.get("transfer-encoding", "").lower():
            end, data, last = _chunks(buf, at)
            if kind == "request" and not last:
                return None  # a request is forwarded whole
            return end, HttpMessage(kind, start, headers, data, open=not last)
        if kind == "response" and _NO_BODY.match(buf):
            return at, HttpMessage(kind, start, headers)
        size = int(headers.get("content-length", "0") or 0)
        if len(buf) < at + size:
            return None
        return at + size, HttpMessage(kind, start, headers, bytes(buf[at:at + size]))

    def request(self, index: int, raw: bytes, value: Any) -> tuple[str, tuple[bytes, ...]]:
        path = value.start.split(" ")[1] if value.start.count(" ") >= 1 else ""
        return etcd_request(path, value.body), (path.encode(), value.body)

    def is_reply(self, index: int, raw: bytes, value: Any) -> bool:
        return bool(value.kind == "response")

    def continues(self, value: Any) -> bool:
        return bool(value.kind == "chunks")

    def streaming(self, value: Any) -> bool:
        return bool(value.open)


HTTP = HttpFraming()
