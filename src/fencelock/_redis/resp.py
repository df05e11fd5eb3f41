"""The Redis wire protocol (RESP2 and RESP3), as far as the script calls on dedicated connections need it. No I/O.

Every acquire, release and extend of the single node and of Redlock (one per node) is a script call, sent on a
dedicated connection (`Channel`, `_transport.py`) with none of redis-py's per-command work: the few microseconds
it spends per command and per reply sit on the hand-off's critical path, and count five times over for Redlock.
`command` and `script_call` encode a request as redis-py would with the encoder given: fencelock's own requests
always use `UTF8`, whatever the client's `encoding` (a key's bytes, and so who holds a name, never depend on how
a client was configured); `utf8` does the same for what goes through redis-py's own commands. `parse` decodes one
reply (the synchronous twin reads with it; the asyncio twin uses redis-py's reader).

Replies a script can give: integers, simple and bulk strings, nil, arrays of these, errors; with RESP3 also null,
booleans and doubles, and push messages that the server may send between replies (dropped by the reader). Any
other type is refused (`ValueError`): the reader then drops the connection instead of guessing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Incomplete:
    """What `parse` returns when the bytes end before the reply does (read more, then parse again)."""


INCOMPLETE = Incomplete()


class ServerError(str):
    """An error reply: the message, e.g. "NOSCRIPT No matching script. Please use EVAL."."""


class Push(list[Any]):
    """A RESP3 push message (out-of-band, not the reply to a request)."""


class Encoder(Protocol):
    """What is needed of redis-py's encoder (a connection's `encoder`): its text encoding, and its rule for
    every other type."""

    encoding: str
    encoding_errors: str

    def encode(self, value: Any) -> bytes | memoryview: ...


class Utf8Encoder:
    """redis-py's encoding rule with UTF-8 fixed: bytes as they are, int and float as their decimal text, str as
    UTF-8 (`surrogateescape`: a key read back from the server that is not UTF-8 goes out as the bytes it was)."""

    encoding = "utf-8"
    encoding_errors = "surrogateescape"

    def encode(self, value: Any) -> bytes | memoryview:
        if isinstance(value, (bytes, memoryview)):
            return value
        if isinstance(value, str):
            return value.encode("utf-8", "surrogateescape")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return repr(value).encode()
        raise TypeError(f"cannot send {type(value).__name__} {value!r} to Redis")


UTF8 = Utf8Encoder()
"""The encoder of every key and argument fencelock sends (names are checked as UTF-8 before anything is sent)."""


def utf8(values: Sequence[Any]) -> list[Any]:
    """`values` with every str as its UTF-8 bytes, for redis-py's commands (which would use the client's
    `encoding`); bytes and numbers are left to redis-py."""
    return [value.encode("utf-8", "surrogateescape") if type(value) is str else value for value in values]


def command(encoder: Encoder, parts: tuple[Any, ...]) -> bytes:
    """A command as one RESP array of bulk strings, each part encoded as `encoder.encode` would encode it.

    The parts a script call has (str, int, bytes) are encoded here, which is twice as fast as redis-py's
    isinstance ladder; anything else (float, bool, which it refuses, ...) goes to the encoder itself."""
    encoding, errors = encoder.encoding, encoder.encoding_errors
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        kind = type(part)
        if kind is str:
            data: bytes | memoryview = part.encode(encoding, errors)
        elif kind is int:
            data = b"%d" % part
        elif kind is bytes:
            data = part
        else:
            data = encoder.encode(part)
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def script_call(encoder: Encoder, sha: str, source: str, keys: list[str], args: list[Any], *, reload: bool,
                wake: tuple[str, float] | None) -> bytes:
    """A script call as bytes: EVALSHA `sha`; or EVAL `source` after the server said NOSCRIPT (`reload`).

    `wake` (list key, seconds): a BLPOP on that list goes first, in the same write, so the server runs the
    script the moment the BLPOP returns. It is not repeated on a reload: the wait is over by then."""
    call = command(encoder, ("EVAL", source, len(keys), *keys, *args) if reload
                   else ("EVALSHA", sha, len(keys), *keys, *args))
    if wake is None or reload:
        return call
    return command(encoder, ("BLPOP", *wake)) + call


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
