"""The Redis wire protocol (RESP2 and RESP3), as far as Redlock's per-node script calls need it. No I/O.

Redlock sends one script call to every node for every acquire, release and extend; the synchronous client writes
and reads those on dedicated connections itself (`_sync/_compat.py`), so the few microseconds redis-py spends
per command and per reply count five times over. `command` encodes a request as redis-py would (the caller gives
redis-py's encoder, so keys are encoded the same way as everywhere else); `parse` decodes one reply.

Replies a script can give: integers, simple and bulk strings, nil, arrays of these, errors; with RESP3 also null,
booleans and doubles, and push messages that the server may send between replies (dropped by the reader). Any
other type is refused (`ValueError`): the reader then drops the connection instead of guessing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Incomplete:
    """What `parse` returns when the bytes end before the reply does (read more, then parse again)."""


INCOMPLETE = Incomplete()


class ServerError(str):
    """An error reply: the message, e.g. "NOSCRIPT No matching script. Please use EVAL."."""


class Push(list[Any]):
    """A RESP3 push message (out-of-band, not the reply to a request)."""


def command(encode: Callable[[Any], bytes | memoryview], parts: tuple[Any, ...]) -> bytes:
    """A command as one RESP array of bulk strings; `encode` turns each part (str, int, bytes) into bytes."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = encode(part)
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def parse(data: bytes | bytearray, start: int = 0) -> tuple[Any, int] | Incomplete:
    """The reply that begins at `data[start]`, and where it ends; INCOMPLETE if the bytes end before it does."""
    end = data.find(b"\r\n", start)
    if end < 0:
        return INCOMPLETE
    kind, line, after = data[start:start + 1], data[start + 1:end], end + 2
    if kind == b":":
        return int(line), after
    if kind in (b"$", b"!"):  # bulk string, RESP3 bulk error
        size = int(line)
        if size < 0:
            return None, after
        if len(data) < after + size + 2:
            return INCOMPLETE
        body = bytes(data[after:after + size])
        return (ServerError(body.decode(errors="replace")) if kind == b"!" else body), after + size + 2
    if kind in (b"*", b">"):  # array, RESP3 push
        size = int(line)
        if size < 0:
            return None, after
        items: list[Any] = []
        for _ in range(size):
            got = parse(data, after)
            if isinstance(got, Incomplete):
                return INCOMPLETE
            item, after = got
            items.append(item)
        return (Push(items) if kind == b">" else items), after
    if kind == b"+":
        return bytes(line), after
    if kind == b"-":
        return ServerError(bytes(line).decode(errors="replace")), after
    if kind == b"_":
        return None, after
    if kind == b"#":
        return line == b"t", after
    if kind == b",":
        return float(line), after
    raise ValueError(f"unexpected reply type {bytes(kind)!r}")
