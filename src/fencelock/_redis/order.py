"""The rule that keeps one caller's requests to one server in order, with no I/O: its decision for a request
(`turn`), what a finished request tells the next (`last_sent`, `answered`, `orphan_of`, `NotSent`), and the
`CLIENT KILL ID` that ends the connection of a request dropped without its reply (`kill_command`, `killed`).

The rule: a request waits for the caller's latest request to that server that is still in flight, at most that
request's own bound (the socket timeout, or its per-server timeout if longer: `ChannelBase.track`), and is then
sent. If that earlier request got no answer (none in time, or a network error), the later one is not sent at all
(`NotSent`), so that nothing queued behind a request that failed reaches a stalled server late. A request that
was not sent is never waited for; the one it waited for is. One exception: when that earlier request's
connection was dropped without its reply and the server's id of that connection is known (`CLIENT ID`, asked at
connect), the later request goes on a new connection after `CLIENT KILL ID` of the old one: once the kill is
answered the old request has run or never will (docs/decisions/2026-12-01-order-after-a-lost-reply.md).

A request in flight is an `asyncio.Future` or a `concurrent.futures.Future`; both have the `Finished` methods used
here. Used by both front ends' transport (`_transport.py`, generated) and the sync select loop (`_sync/_multiplex.py`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, TypeVar

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


class Finished(Protocol):
    """A request in flight, as both kinds of future show it."""

    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def exception(self) -> BaseException | None: ...
    def result(self) -> Any: ...


F = TypeVar("F", bound=Finished)


class NotSent(RedisTimeoutError):
    """The reply of a request left unsent: it had to wait for the caller's previous request to that server, and
    that one got no answer (none within its bound, or a network error), so the server is stalled or gone. Sent
    on another connection, this one could overtake it (and pile onto a stalled server); it counts as unanswered,
    as any request to a stalled server does. `before` is that previous request: the next one waits for it, not
    for this one."""

    def __init__(self, where: str, before: tuple[Any, float]) -> None:
        super().__init__(f"not sent: the previous request to {where} got no answer")
        self.before = before


def last_sent(before: tuple[F, float]) -> tuple[F, float]:
    """The caller's latest request that was sent: `before`, or, if that one was not sent, the one it waited for."""
    while before[0].done():
        request = before[0]
        result = None if request.cancelled() or request.exception() is not None else request.result()
        if not isinstance(result, NotSent):
            break
        before = result.before
    return before


def answered(request: tuple[Finished, float]) -> bool:
    """A finished request got the server's answer (a reply, or the server's error), not a network failure."""
    future = request[0]
    if future.cancelled() or future.exception() is not None:
        return False
    result = future.result()
    return not isinstance(result, Exception) or isinstance(result, ResponseError)


def orphan_of(request: tuple[Finished, float]) -> int | None:
    """The server's id of the connection a finished request was dropped with, unanswered (see `orphaned`), or
    None: not known, or the request was answered."""
    future = request[0]
    if future.cancelled():
        return None
    outcome = future.exception() or future.result()
    found = getattr(outcome, "orphan", None)
    if getattr(outcome, "ended", False) or answered(request):
        return None
    return found if isinstance(found, int) else None


def ended(request: tuple[Finished, float]) -> bool:
    """A finished request without an answer whose connection the server has since ended (`end`): it has run
    or never will, so a later request may go."""
    future = request[0]
    return not future.cancelled() and getattr(future.exception() or future.result(), "ended", False) is True


def end(request: tuple[Finished, float]) -> None:
    """The server answered `CLIENT KILL ID` of the connection `request` was dropped with (`orphan_of`)."""
    future = request[0]
    outcome = future.exception() or future.result()
    setattr(outcome, "ended", True)  # noqa: B010 (an exception of any class)


def orphaned(error: BaseException, conn: Any) -> BaseException:
    """`error` ended a request sent on `conn` with no reply read: it carries the server's id of `conn` (None if
    unknown), so a later request knows what to end first (`orphan_of`)."""
    if getattr(error, "orphan", None) is None:
        error.orphan = getattr(conn, "fencelock_id", None)  # type: ignore[attr-defined]
    return error


def kill_command(orphan: int) -> tuple[str, ...]:
    """The command that ends the server's connection `orphan` (and with it any request of it not yet run)."""
    return "CLIENT", "KILL", "ID", str(orphan)


def killed(reply: Any) -> bool:
    """`CLIENT KILL ID`'s reply says the connection is gone (0 or 1 killed), not an error (ACL, unknown command)."""
    return isinstance(reply, int) and not isinstance(reply, bool)


class Orphan(NamedTuple):
    """A connection known only by the server's id for it (one a request was dropped with)."""

    fencelock_id: int


WAIT, SEND, KILL, REFUSE = "wait", "send", "kill", "refuse"


class Turn(NamedTuple):
    """What the order rule says a request does about `before`, the caller's latest request to its server that was
    sent: WAIT for it (still in flight), SEND, KILL the server's connection `orphan` it was dropped with and then
    send on a new connection, or REFUSE (`not_sent`: it got no answer)."""

    action: str
    before: Any = None  # tuple[future, bound]
    orphan: int = 0


_GO = Turn(SEND)


def turn(before: tuple[Any, float] | None) -> Turn:
    """The order rule's decision for a request sent after `before` (the caller's previous request there, if any)."""
    if before is None:
        return _GO
    before = last_sent(before)
    if not before[0].done():
        return Turn(WAIT, before)
    if answered(before) or ended(before):
        return Turn(SEND, before)
    orphan = orphan_of(before)
    return Turn(REFUSE, before) if orphan is None else Turn(KILL, before, orphan)
