"""How `FaultProxy` reads a protocol: where each message ends, what a request is called, which server messages are
replies. RESP is `fencelock.testing.faults`' default; ZooKeeper's is here::

    with FaultProxy("127.0.0.1", server.port, framing=ZOOKEEPER) as proxy:
        proxy.arm(Rule(RESET_AFTER, "multi"))      # a release (delete + fence, one transaction) runs, then a reset

ZooKeeper's client protocol (Jute) sends every message as a 4-byte big-endian length and that many bytes. A
connection opens with the client's ConnectRequest (named ``"connect"``) and the server's ConnectResponse; each later
request starts with its xid and its operation code (named as ZooKeeper's `OpCode`: ``"create2"``, ``"delete"``,
``"setData"``, ``"getChildren"``, ``"multi"``, ``"ping"``...). The server answers a connection's requests in order;
watch notifications (xid -1) answer nothing and pass untouched.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ZOOKEEPER", "Framing", "ZooKeeperFraming", "zookeeper_op"]


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
