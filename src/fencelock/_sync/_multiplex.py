"""`run_scripts`, the deliberate sync-only fork: one script on each of several servers at once, written to every
server first and the replies read as they arrive (select), from the caller's thread alone. Hand-written twin:
`_async/_multiplex.py` (one task per request); a single request's path is the generated `_transport._call_script`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, NamedTuple

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._logic.timing import overslept
from .._redis.channel import readable
from .._redis.order import KILL, SEND, WAIT, orphaned, turn
from .._redis.request import (
    RELOAD,
    Packed,
    ScriptRequest,
    Unwritten,
    encode,
    may_resend,
    outcome,
    packed,
    reading,
)
from ._concurrency import Handle
from ._concurrency import caller as sender
from ._connection import read, write
from ._transport import Channel, _call_script


class _InFlight(NamedTuple):
    """A request written to a dedicated connection, whose reply is still to be read."""

    position: int  # in the requests
    request: ScriptRequest
    conn: Any
    generation: int
    reloaded: bool = False  # sent again as EVAL after NOSCRIPT


_DONE: Future[Any] = Future()
"""The handle of a request that has nothing left to run."""
_DONE.set_result(None)


def _send(flight: _InFlight, command: Any) -> Exception | None:
    """Write one request; a connection that fails to write is dropped, and the error is the reply (`Unwritten`
    when the connection was closed already: nothing reached the server)."""
    try:
        write(flight.conn, command)
    except RedisConnectionError as exc:
        _drop(flight)
        unwritten = Unwritten(str(exc))
        unwritten.__cause__ = exc
        return unwritten
    except Exception as exc:
        _drop(flight)
        return exc
    return None


def _busy(channel: Channel) -> Exception:
    """The reply of a request not sent because its server has `LANE_BACKLOG` jobs already: it is stalled."""
    return RedisTimeoutError(f"not sent: {channel.where} has too many requests waiting for it")


def _abandon(flight: _InFlight) -> Exception:
    """A reply nobody can wait for (its server has `LANE_BACKLOG` jobs already): its connection is dropped."""
    _drop(flight)
    return RedisTimeoutError(f"no reply read from {flight.request.channel.where}: too many requests wait for it")


def _drop(flight: _InFlight) -> None:
    """A connection that failed, or whose reply will not be read: closed, and never used again."""
    flight.conn.disconnect()
    flight.request.channel.give_back(flight.conn)


def _receive(flight: _InFlight) -> tuple[Any, _InFlight | None]:
    """Read the reply due on the connection: (the reply, None), or (None, the request sent again) after NOSCRIPT.

    The connection goes back to its channel once a reply was read; after a network error it is dropped.
    """
    skip, count = reading(flight.request, flight.reloaded)
    try:
        replies = read(flight.conn, skip, count)
    except Exception as exc:
        orphaned(exc, flight.conn)
        _drop(flight)
        return exc, None
    reply = outcome(flight.request, replies, flight.reloaded)
    if reply is RELOAD:
        again = flight._replace(reloaded=True)
        failed = _send(again, encode(flight.conn, flight.request, reload=True))
        return (failed, None) if failed is not None else (None, again)
    flight.request.channel.give_back(flight.conn)
    return reply, None


def _finish(flight: _InFlight, resend: bool = False) -> Any:
    """Wait for the reply (blocking, at most the socket timeout per read, which then drops the connection); with
    `resend`, a request that `may_resend` goes again once, on a new connection."""
    reply, again = _receive(flight)
    while again is not None:
        reply, again = _receive(again)
    if resend and isinstance(reply, Exception) and may_resend(flight.request.lua, reply):
        return _call_script(flight.request.again(), {}, flight.generation, None, fresh=True)
    return reply


def run_scripts(requests: Sequence[ScriptRequest], timeout: float,
                enough: Callable[[dict[int, Any]], bool]) -> tuple[dict[int, Any], list[Handle[Any]]]:
    """Run one script on each of several servers at once, from this thread alone; like `fan_out`: written to an idle
    connection of every server first, the replies read as they arrive, a server with none idle served from its
    own threads (docs/design/redis-transport.md). Handles complete when each reply is in (`then`)."""
    caller = sender()
    results: dict[int, Any] = {}
    handles: list[Handle[Any]] = []
    waiting: dict[Any, _InFlight] = {}  # socket -> the request in flight on it
    threads: dict[Future[Any], int] = {}
    cache: Packed = {}  # requests sharing their key and argument lists (and wait): packed once

    deferred: dict[int, tuple[ScriptRequest, int, tuple[Future[Any], float]]] = {}  # after our previous one

    def done(i: int, reply: Any) -> None:
        results[i] = reply
        handles[i] = _DONE  # nothing runs on in the background: cleanup chained after it may start at once

    def in_thread(i: int, request: ScriptRequest, generation: int, *, fresh: bool) -> None:
        future = request.channel.submit(_call_script, request, {}, generation, None, None, fresh,
                                        overflow=partial(_busy, request.channel))
        threads[future] = i
        handles[i] = future

    def send(i: int, request: ScriptRequest, generation: int) -> None:
        """On an idle connection from this thread, or else from a thread that connects one."""
        conn = request.channel.take(generation)
        if conn is None:
            in_thread(i, request, generation, fresh=False)
            return
        flight = _InFlight(i, request, conn, generation)
        failed = _send(flight, packed(cache, conn, request))
        if failed is None:
            waiting[conn._sock] = flight
        elif may_resend(request.lua, failed):
            in_thread(i, request.again(), generation, fresh=True)
        else:
            done(i, failed)

    try:
        for i, request in enumerate(requests):
            handles.append(_DONE)  # replaced by a real handle if its reply is left to the background
            channel = request.channel
            before = channel.in_flight(caller)
            if before is not None:
                # Our previous request there is still in flight: this one must not overtake it. It is sent from
                # here as soon as that reply is in.
                deferred[i] = request, channel.generation, before
                continue
            send(i, request, channel.generation)
        deadline = time.monotonic() + timeout
        decided = last_look = False
        while waiting or threads or deferred:
            if not decided and enough(results):
                # Decided. Replies due any moment still get a short grace: a connection read now is free for the
                # next request, where one left to the background would send that request to a thread.
                decided = True
                deadline = min(deadline, time.monotonic() + _GRACE)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if last_look:
                    break
                # One look that does not wait, at what was received in time but not read yet; a thread kept from
                # running (the interpreter busy elsewhere) gives the replies as long again as it overslept.
                last_look, remaining = True, 0.0
                deadline = time.monotonic() + (0.0 if decided else overslept(deadline, time.monotonic(), timeout))
            if deferred:
                for i in [i for i, (_, _, before) in deferred.items() if before[0].done()]:
                    request, generation, before = deferred.pop(i)
                    step = turn(before)
                    if step.action is WAIT:
                        deferred[i] = request, generation, step.before
                    elif step.action is SEND:
                        send(i, request, generation)
                    elif step.action is KILL:  # its connection is gone: ended first, from a thread
                        future = request.channel.submit(_call_script, request, {}, generation, step.before,
                                                        overflow=partial(_busy, request.channel))
                        threads[future] = i
                        handles[i] = future
                    else:
                        done(i, request.channel.not_sent(step.before))
            if waiting:
                others = threads or deferred
                ready = readable(list(waiting), min(remaining, 0.002) if others else remaining)
            elif threads or deferred:
                wait([*threads, *(before[0] for _, _, before in deferred.values())], timeout=remaining,
                     return_when=FIRST_COMPLETED)
                ready = []
            else:
                ready = []
            for sock in ready:
                flight = waiting.pop(sock)
                reply, again = _receive(flight)
                if again is not None:
                    waiting[again.conn._sock] = again
                elif isinstance(reply, Exception) and may_resend(flight.request.lua, reply):
                    in_thread(flight.position, flight.request.again(), flight.generation, fresh=True)
                else:
                    done(flight.position, reply)
            for future in [f for f in threads if f.done()]:
                results[threads.pop(future)] = future.result()
    except BaseException:
        for flight in waiting.values():  # interrupted: their replies will never be read
            _drop(flight)
        raise
    for flight in waiting.values():
        handles[flight.position] = flight.request.channel.submit(_finish, flight, True,
                                                                 overflow=partial(_abandon, flight))
    for i, (request, generation, before) in deferred.items():  # their turn did not come in time: in a thread
        handles[i] = request.channel.submit(_call_script, request, {}, generation, before,
                                            overflow=partial(_busy, request.channel))
    for request, handle in zip(requests, handles, strict=True):
        if handle is not _DONE and not handle.done():  # in flight: this thread's next request there waits
            request.channel.track(caller, handle, timeout)
    return results, handles


_GRACE = 0.002  # seconds
