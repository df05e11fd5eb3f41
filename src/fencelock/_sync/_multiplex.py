"""`run_scripts`, the deliberate sync-only fork: one script on each of several servers at once, written to every
server first and the replies read as they arrive (select), from the caller's thread alone. Hand-written twin:
`_async/_multiplex.py` (one task per request)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from .._redis.channel import (
    KILL,
    SEND,
    WAIT,
    Packed,
    ScriptRequest,
    may_resend,
    packed,
    readable,
    turn,
)
from ._concurrency import Handle
from ._transport import (
    _DONE,
    _abandon,
    _busy,
    _drop,
    _finish,
    _in_thread,
    _InFlight,
    _receive,
    _send,
)


def run_scripts(requests: Sequence[ScriptRequest], timeout: float,
                enough: Callable[[dict[int, Any]], bool]) -> tuple[dict[int, Any], list[Handle[Any]]]:
    """Run one script on each of several servers at once, from this thread alone; like `fan_out`: written to an idle
    connection of every server first, the replies read as they arrive, a server with none idle served from its
    own threads (docs/design/redis-transport.md). Handles complete when each reply is in (`then`)."""
    caller = threading.get_ident()
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
        future = request.channel.submit(_in_thread, request, generation, None, fresh,
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
        decided = False
        while waiting or threads or deferred:
            if not decided and enough(results):
                # Decided. Replies due any moment still get a short grace: a connection read now is free for the
                # next request, where one left to the background would send that request to a thread.
                decided = True
                deadline = min(deadline, time.monotonic() + _GRACE)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if deferred:
                for i in [i for i, (_, _, before) in deferred.items() if before[0].done()]:
                    request, generation, before = deferred.pop(i)
                    step = turn(before)
                    if step.action is WAIT:
                        deferred[i] = request, generation, step.before
                    elif step.action is SEND:
                        send(i, request, generation)
                    elif step.action is KILL:  # its connection is gone: ended first, from a thread
                        future = request.channel.submit(_in_thread, request, generation, step.before,
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
        handles[i] = request.channel.submit(_in_thread, request, generation, before,
                                            overflow=partial(_busy, request.channel))
    for request, handle in zip(requests, handles, strict=True):
        if handle is not _DONE and not handle.done():  # in flight: this thread's next request there waits
            request.channel.track(caller, handle, timeout)
    return results, handles


_GRACE = 0.002  # seconds
