"""The wire protocol subset the dedicated connections speak themselves (`fencelock._logic.resp`): requests
encoded byte for byte as redis-py encodes them, and replies decoded from any split of the bytes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.connection import Connection
from redis.exceptions import DataError

from fencelock._redis import resp

_REDIS_PY: Any = Connection()  # type: ignore[no-untyped-call]  # (redis-py is untyped)


_LATIN: Any = Connection(encoding="latin-1", encoding_errors="replace")  # type: ignore[no-untyped-call]


@given(st.lists(st.one_of(st.text(), st.integers(), st.binary(), st.floats(allow_nan=False)), max_size=12))
def test_a_command_is_encoded_as_redis_py_encodes_it(args: list[Any]) -> None:
    parts = ("EVALSHA", *args)  # (redis-py treats its first part as the command's name)
    for conn in (_REDIS_PY, _LATIN):  # also with the client's own encoding and error rule
        assert resp.command(conn.encoder, parts) == b"".join(conn.pack_command(*parts))


def test_a_part_redis_py_refuses_is_refused_the_same_way() -> None:
    with pytest.raises(DataError, match="bool"):
        resp.command(_REDIS_PY.encoder, ("EVALSHA", "sha", 1, "key", True))


def test_a_script_call_after_a_wait_sends_the_blpop_first_and_a_reload_sends_the_script_alone() -> None:
    keys, args = ["k"], ["token", 30000]
    waited = resp.script_call(_REDIS_PY.encoder, "f00", "return 1", keys, args, reload=False, wake=("w", 0.4))
    assert waited == b"".join(_REDIS_PY.pack_command("BLPOP", "w", 0.4) + _REDIS_PY.pack_command(
        "EVALSHA", "f00", 1, "k", "token", 30000))
    reloaded = resp.script_call(_REDIS_PY.encoder, "f00", "return 1", keys, args, reload=True, wake=("w", 0.4))
    assert reloaded == b"".join(_REDIS_PY.pack_command("EVAL", "return 1", 1, "k", "token", 30000))


REPLIES: list[tuple[bytes, Any]] = [
    (b":42\r\n", 42),
    (b":-1\r\n", -1),
    (b"+OK\r\n", b"OK"),
    (b"$5\r\nhe\r\no\r\n", b"he\r\no"),
    (b"$-1\r\n", None),
    (b"*-1\r\n", None),
    (b"_\r\n", None),
    (b"#t\r\n", True),
    (b",1.5\r\n", 1.5),
    (b"*3\r\n:0\r\n:7\r\n:-1\r\n", [0, 7, -1]),
    (b"*2\r\n*1\r\n:1\r\n$1\r\nx\r\n", [[1], b"x"]),
    (b"*0\r\n", []),
]


@pytest.mark.parametrize(("wire", "value"), REPLIES)
def test_each_reply_type_and_every_cut_of_it(wire: bytes, value: Any) -> None:
    assert resp.parse(wire) == (value, len(wire))
    assert resp.parse(b"junk" + wire, 4) == (value, len(wire) + 4)
    for cut in range(len(wire)):
        assert resp.parse(wire[:cut]) is resp.INCOMPLETE, cut


def test_errors_and_push_messages_are_told_apart_from_replies() -> None:
    error = resp.parse(b"-NOSCRIPT No matching script.\r\n")
    assert not isinstance(error, resp.Incomplete)
    assert isinstance(error[0], resp.ServerError)
    assert error[0].startswith("NOSCRIPT")
    bulk_error = resp.parse(b"!9\r\nERR oops!\r\n")
    assert not isinstance(bulk_error, resp.Incomplete)
    assert bulk_error[0] == "ERR oops!"
    assert isinstance(bulk_error[0], resp.ServerError)
    push = resp.parse(b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n")
    assert not isinstance(push, resp.Incomplete)
    assert isinstance(push[0], resp.Push)
    assert push[0] == [b"invalidate", [b"k"]]


def test_an_unknown_reply_type_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="reply type"):
        resp.parse(b"%1\r\n:1\r\n:2\r\n")
