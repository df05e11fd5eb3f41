"""The wire rule both front ends' transports call (`_redis/order.py`, `_redis/request.py`): the order rule's decision
(`turn`), a request's bytes encoded once (`packed`), and what a reply means; driven by plain futures, with no server."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from redis.connection import Connection
from redis.exceptions import NoScriptError, ResponseError

from fencelock._redis.order import (
    KILL,
    REFUSE,
    SEND,
    WAIT,
    NotSent,
    end,
    orphaned,
    turn,
)
from fencelock._redis.request import (
    RELOAD,
    Closed,
    Confirmed,
    Resent,
    ScriptRequest,
    confirmed_reply,
    outcome,
    packed,
    reading,
    server_error,
)
from fencelock._scripts import Lua


def _finished(outcome: Any) -> tuple[Future[Any], float]:
    future: Future[Any] = Future()
    future.set_result(outcome)
    return future, 1.0


def test_a_first_request_is_sent() -> None:
    assert turn(None).action == SEND


def test_a_request_waits_for_the_previous_one_still_in_flight() -> None:
    pending: tuple[Future[Any], float] = (Future(), 2.0)
    step = turn(pending)
    assert step.action == WAIT
    assert step.before is pending


def test_an_answer_or_a_server_error_lets_the_next_request_go() -> None:
    assert turn(_finished(b"ok")).action == SEND
    assert turn(_finished(ResponseError("WRONGTYPE"))).action == SEND


def test_after_a_lost_reply_the_next_request_is_refused_unless_the_old_connection_can_be_ended() -> None:
    lost = _finished(orphaned(Closed("reset"), None))
    assert turn(lost).action == REFUSE
    known = _finished(orphaned(Closed("reset"), type("Conn", (), {"fencelock_id": 7})()))
    step = turn(known)
    assert (step.action, step.orphan, step.before) == (KILL, 7, known)
    end(known)  # the server answered CLIENT KILL ID 7: the old request has run or never will
    assert turn(known).action == SEND


def test_a_request_not_sent_passes_the_wait_on_to_the_one_it_waited_for() -> None:
    earlier: tuple[Future[Any], float] = (Future(), 2.0)
    step = turn(_finished(NotSent("127.0.0.1:6379", earlier)))
    assert step.action == WAIT
    assert step.before is earlier


def test_requests_sharing_their_lists_are_encoded_once() -> None:
    lua = Lua("echo", "return ARGV[1]", "0" * 40)
    keys, args = ["k"], ["v"]
    conn: Any = Connection()  # type: ignore[no-untyped-call]  # (never connected: only its encoder is used)
    cache: dict[Any, Any] = {}
    first = packed(cache, conn, ScriptRequest(None, lua, keys, args))
    assert packed(cache, conn, ScriptRequest(None, lua, keys, args)) is first
    assert packed(cache, conn, ScriptRequest(None, lua, ["k"], args)) == first  # equal bytes, encoded again
    assert len(cache) == 2
    assert ScriptRequest(None, lua, keys, args, wake=("list", 1.0)).again().wake is None


def test_what_a_reply_means() -> None:
    assert isinstance(server_error("NOSCRIPT No matching script"), NoScriptError)
    assert type(server_error("ERR wrong")) is ResponseError
    assert confirmed_reply(b"ok", 1) == Confirmed(b"ok", 1)
    error = ResponseError("ERR")
    assert confirmed_reply(error, 1) is error


def test_how_a_reply_is_read_and_sent_again_after_noscript() -> None:
    release = Lua("release", "return 1", "0" * 40)
    plain = ScriptRequest(None, release, [], [])
    woken = plain._replace(wake=("list", 1.0))
    confirmed = plain._replace(confirm=("WAIT", 1, 100))
    assert reading(plain, False) == (0, 1)
    assert reading(woken, False) == (1, 1)  # the BLPOP's answer is dropped first
    assert reading(woken, True) == (0, 1)  # EVAL after NOSCRIPT goes without its BLPOP
    assert reading(confirmed, False) == (0, 2)
    noscript = NoScriptError("NOSCRIPT")
    assert outcome(plain, noscript, False) is RELOAD
    assert outcome(plain, noscript, True) is noscript  # once only
    assert outcome(confirmed, [noscript, 1], False) is RELOAD
    assert outcome(confirmed, [b"ok", 1], False) == Confirmed(b"ok", 1)
    assert type(outcome(plain, 0, False)) is int
    assert isinstance(outcome(plain.again(), 0, False), Resent)
