"""Redis's own transport: a server's dedicated connections (`Channel`) and one script call on them, written once
for both front ends; what a connection does differently under each is in `_connection.py`."""

from __future__ import annotations

import random
import threading
from collections import deque
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

from .._errors import unsent
from .._logic.admission import turn_wait
from .._redis.channel import BLOCKING, CROWDED_PAUSE, maintains
from .._redis.order import (
    KILL,
    REFUSE,
    WAIT,
    Orphan,
    end,
    orphaned,
    turn,
)
from .._redis.request import (
    RELOAD,
    Held,
    Packed,
    ScriptRequest,
    Unwritten,
    encode,
    may_resend,
    outcome,
    packed,
    reading,
    reconnect,
)
from ._admin import client_id, kill
from ._concurrency import Handle, Signal, given_up, now, sleep, wait_first
from ._connection import Connections, connected, discard, drop, idle_closed, read, write

MAX_OPEN = 64
"""Connections one server's `Channel` keeps open for requests that do not block there (a waiter's BLPOP is apart):
more requests at once wait their turn for one (`Channel.place`), so that no number of callers exhausts the
server's connections or the client's file descriptors."""

GAVE_UP: Any = object()
"""`Channel.place`'s answer to a request whose caller stopped waiting for it before a connection was free."""

QUEUE_LIMIT = 30.0
"""Seconds a request waits at most for a connection (less by its caller's deadline); then it fails, not sent."""

RECHECK = 1.0
"""Seconds a request waiting for a connection sleeps before it looks whether one is free after all."""


class _Queued:
    """A request waiting for a connection (`Channel.place`): what it was handed, an idle connection or room for a
    new one (None), once `served`; `gone` if it stopped waiting first."""

    __slots__ = ("abandoned", "conn", "gone", "served", "signal")

    def __init__(self, abandoned: Handle[None] | None) -> None:
        self.signal = Signal()
        self.conn: Any = None
        self.served = self.gone = False
        self.abandoned = abandoned  # set: its caller no longer waits for it (`run_scripts`)

    def given_up(self) -> bool:
        return self.abandoned is not None and self.abandoned.done()


class Channel(Connections):
    """One server's dedicated connections for `run_scripts` and `call_script`, outside the client's pool: each
    carries one request at a time, and one caller's requests to the server keep their order (the rules:
    docs/design/redis-transport.md)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self._blocking: set[Any] = set()  # connections carrying a request that waits (BLPOP) first
        # Requests waiting for a connection (`place`), oldest first: a lease's renewals and releases, the others.
        self._queues: tuple[deque[_Queued], deque[_Queued]] = (deque(), deque())
        self._reserved = 0  # connections a request was given room to make, not yet made
        self._placing: set[_Queued] = set()  # requests in `place` that waited: none of them written yet
        self._queue_lock = threading.Lock()  # (never held across an await)
        self.interrupted = False

    def _let_go(self) -> None:
        super()._let_go()
        self._queues, self._reserved = (deque(), deque()), 0
        BLOCKING.forget(self)
        self._placing = set()

    def interrupt(self) -> None:
        """End every blocking wait (BLPOP) in flight here now (its client is closing): its connection is closed
        under it, and its request ends with that error, not sent again; a waiting request not sent yet is not
        sent. Other requests run on."""
        self.interrupted = True
        for conn in list(self._blocking):
            conn.fencelock_interrupted = True
            self._open.discard(conn)
            discard(conn)

    def take(self, generation: int) -> Any:
        """An idle connection, connected and with nothing left to read (one the server closed while it was idle
        is dropped here); None if there is none."""
        self._adopt()
        while generation == self.generation:
            try:
                conn = self._idle.pop()
            except IndexError:
                return None
            if not idle_closed(conn):
                return conn
            self._open.discard(conn)
            discard(conn)
        return None

    async def place(self, generation: int, fresh: bool, maintenance: bool,
                    abandoned: Handle[None] | None = None) -> Any:
        """An idle connection for a request, or None: it makes a new one (`connect`). While `MAX_OPEN` are open
        for requests that do not block, it waits its turn: renewals and releases (`maintenance`) before the others,
        each oldest first. `fresh`: it needs a new connection (an idle one it was given is closed). A request
        whose caller gave up on it (`abandoned`) while it waited gets `GAVE_UP`; one still waiting after
        `QUEUE_LIMIT` or its caller's deadline (`caller_deadline`; at least a socket timeout) gets a `Held`.
        Neither is sent."""
        conn, queued = self._look(generation, maintenance, abandoned)
        if queued is not None:
            limit = turn_wait(QUEUE_LIMIT, self._patience, now())
            until = now() + limit
            try:
                while not await queued.signal.wait(min(RECHECK, max(0.0, until - now()))):
                    if queued.given_up() or now() >= until:
                        break
                    self._serve()  # (a connection freed in a way that served nobody: never wait for ever)
            except BaseException:
                self._withdraw(queued)
                raise
            with self._queue_lock:  # (at once with `holding`: one it saw here is never sent after its round)
                self._placing.discard(queued)
                gave_up, overdue = queued.given_up(), not queued.served
                waiting = len(self._queues[0]) + len(self._queues[1])
            if gave_up or overdue:
                self._withdraw(queued)
                return GAVE_UP if gave_up else Held(
                    f"not sent to {self.where}: this client is overloaded: no connection there was free within "
                    f"{limit:.3g} s ({MAX_OPEN} in use, {waiting} other requests waiting); nothing was sent")
            conn = queued.conn
        if conn is not None and fresh:
            with self._queue_lock:
                self._reserved += 1  # the room it leaves is this request's own
            self._open.discard(conn)
            await drop(conn)
            conn = None
        return conn

    def holding(self, round_over: Handle[None]) -> bool:
        """Whether a request of the round whose end is `round_over` (`run_scripts`' `late`) still waits here for a
        connection: nothing of it was written. Once `round_over` is set, an acquire seen here is never sent."""
        with self._queue_lock:
            return any(queued.abandoned is round_over for queued in self._placing)

    def _room(self) -> bool:
        return len(self._open) + self._reserved - len(self._blocking) < MAX_OPEN

    def _look(self, generation: int, maintenance: bool,
              abandoned: Handle[None] | None) -> tuple[Any, _Queued | None]:
        """An idle connection or room for a new one now, if no request of its kind or a more urgent one waits
        (None, None: room); else its place in the queue."""
        urgent, others = self._queues
        with self._queue_lock:
            if not urgent and (maintenance or not others):
                conn = self.take(generation)
                if conn is not None or generation != self.generation:
                    return conn, None
                if self._room():
                    self._reserved += 1
                    return None, None
            queued = _Queued(abandoned)
            (urgent if maintenance else others).append(queued)
            self._placing.add(queued)
            return None, queued

    def _serve(self) -> None:
        """Hand the waiting requests, most urgent and oldest first, an idle connection each, or room for a new one."""
        served: list[_Queued] = []
        with self._queue_lock:
            for queue in self._queues:
                while queue:
                    queued = queue[0]
                    if queued.gone or queued.given_up():
                        queue.popleft()
                        served.append(queued)  # (woken to see it: it goes without a connection)
                        continue
                    conn = self.take(self.generation)
                    if conn is None:
                        if not self._room():
                            break
                        self._reserved += 1
                    queue.popleft()
                    queued.conn, queued.served = conn, True
                    served.append(queued)
                if queue:
                    break  # (the requests behind these wait too)
        for queued in served:
            queued.signal.set()

    def _withdraw(self, queued: _Queued) -> None:
        """A waiting request stopped waiting (cancelled): what it was handed goes to the next one."""
        with self._queue_lock:
            self._placing.discard(queued)
            if queued.gone:
                return
            queued.gone = True
            if not queued.served:
                return
            if queued.conn is not None:
                self._idle.append(queued.conn)
            else:
                self._reserved -= 1
        self._serve()

    async def give_back(self, conn: Any) -> None:
        """Idle again, if its reply was read and it is still connected and current; otherwise closed and dropped.
        Either way a request waiting for a connection may go now."""
        if conn in self._open and connected(conn):
            self._idle.append(conn)
        else:
            self._open.discard(conn)
            await drop(conn)
        self._serve()

    async def connect(self, generation: int) -> Any:
        """A new connection: TCP connect and the client's handshake (refused to a request begun before aclose)."""
        with self._queue_lock:
            self._reserved = max(0, self._reserved - 1)  # (the room `place` gave it)
        if generation != self.generation:
            raise RedisConnectionError("the client was closed")
        conn = self._class(**self._kwargs)
        self._open.add(conn)
        try:
            await conn.connect()
            if generation != self.generation:  # closed while this connected: aclose did not see it connected
                raise RedisConnectionError("the client was closed")
            conn.fencelock_id = await client_id(conn)
        except BaseException:
            self._open.discard(conn)
            await drop(conn)
            self._serve()
            raise
        return conn

    async def aclose(self) -> None:
        """Close every connection, also those in use; a request begun before this never keeps or makes one."""
        self.generation += 1
        if not self._owned():
            self._let_go()
            return
        old, self._open, self._idle = self._open, set(), deque()
        for conn in list(old):
            await drop(conn)
        with self._queue_lock:
            waiting, self._queues, self._reserved = self._queues, (deque(), deque()), 0
            self._placing = set()
        for queued in (*waiting[0], *waiting[1]):  # each goes on to `connect`, which refuses it: the client is closed
            queued.served = True
            queued.signal.set()
        self._stop()


async def _call_script(request: ScriptRequest, cache: Packed, generation: int,
                       before: tuple[Handle[Any], float] | None,
                       abandoned: Handle[None] | None = None, fresh: bool = False,
                       late: Handle[None] | None = None) -> Any:
    """`_send_script`, for a wait (BLPOP first) only while fewer than `MAX_BLOCKING` block on its server: beyond
    that, it waits here instead (`CROWDED_PAUSE`), then asks without blocking."""
    channel = request.channel
    if request.wake is None:
        return await _send_script(request, cache, generation, before, abandoned, fresh, late)
    if not BLOCKING.take(channel):
        await sleep(min(request.wake[1], random.uniform(*CROWDED_PAUSE)))
        return await _send_script(request._replace(wake=None), cache, generation, before, abandoned, fresh, late)
    try:
        return await _send_script(request, cache, generation, before, abandoned, fresh, late)
    finally:
        BLOCKING.give_back(channel)


async def _send_script(request: ScriptRequest, cache: Packed, generation: int,
                       before: tuple[Handle[Any], float] | None,
                       abandoned: Handle[None] | None = None, fresh: bool = False,
                       late: Handle[None] | None = None) -> Any:
    """One request on its server's channel (after `before`, the caller's previous one there); a request that
    `may_resend` goes again once, on a new connection (`fresh`: it is that second sending). One still waiting
    for `before` when `abandoned` is set (its caller was cancelled) is never sent, nor one still waiting for a
    connection when `late` is set (its round is over: `run_scripts`)."""
    channel = request.channel
    step = turn(before)
    if step.action is WAIT:  # the caller's previous request here goes first
        deadline = now() + step.before[1]
        while step.action is WAIT:
            previous = step.before[0]
            remaining = deadline - now()
            if remaining > 0:
                await wait_first([previous] if abandoned is None else [previous, abandoned], remaining)
            if not previous.done() or (abandoned is not None and abandoned.done()):
                return channel.not_sent(step.before)
            step = turn(step.before)
    if step.action is REFUSE:
        return channel.not_sent(step.before)
    if step.action is KILL:
        fresh = True  # (once the old connection is ended, no resend follows: `fresh` sends once)
    if request.wake is not None and channel.interrupted:
        return Held(f"not sent to {channel.where}: its client is closing")
    conn = await channel.place(generation, fresh, maintains(request.lua), late)
    if conn is GAVE_UP:
        return Held(f"not sent to {channel.where}: its round ended before a connection was free")
    if isinstance(conn, Held):
        return conn
    if conn is None:
        try:
            conn = await channel.connect(generation)
        except Exception as exc:
            if reconnect(exc, fresh):  # closed by the server while we connected: the request was never sent
                return await _send_script(request, cache, generation, None, fresh=True)
            return unsent(exc)  # (no connection: nothing was sent)
    if step.action is KILL:
        try:
            gone = await kill(conn, step.orphan)
        except BaseException as exc:  # the kill itself unanswered: the old request may still run
            await drop(conn)
            await channel.give_back(conn)
            if not isinstance(exc, Exception):
                raise
            return orphaned(exc, Orphan(step.orphan))
        if gone:
            end(step.before)
        else:
            await channel.give_back(conn)
            return channel.not_sent(step.before)
    if given_up():  # its caller was cancelled while it waited or connected: only the undo goes now
        await channel.give_back(conn)
        return Held(f"not sent to {channel.where}: its caller was cancelled")
    try:
        reply = await _exchange(conn, request, packed(cache, conn, request))
    except BaseException as exc:
        # A network error, or the caller was interrupted half-way, which leaves a reply unread: either way
        # this connection must not carry another request.
        orphaned(exc, conn)
        await drop(conn)
        await channel.give_back(conn)  # (dropped: it is not connected)
        if not isinstance(exc, Exception):
            raise
        if not fresh and may_resend(request.lua, exc) and not getattr(conn, "fencelock_interrupted", False):
            return await _send_script(request.again(), cache, generation, None, fresh=True)
        return exc
    await channel.give_back(conn)
    return reply


async def _exchange(conn: Any, request: ScriptRequest, command: bytes) -> Any:
    """Write the request and read its reply (a server's error as the reply); after NOSCRIPT, the script goes again
    as EVAL on the same connection, once, without its BLPOP. A network fault raises (`Unwritten`: nothing sent)."""
    if request.wake is not None:
        request.channel._blocking.add(conn)
        try:
            return await _exchange_once(conn, request, command)
        finally:
            request.channel._blocking.discard(conn)
    return await _exchange_once(conn, request, command)


async def _exchange_once(conn: Any, request: ScriptRequest, command: bytes) -> Any:
    reloaded = False
    while True:
        try:
            await write(conn, encode(conn, request, reload=True) if reloaded else command)
        except (OSError, RedisConnectionError) as exc:
            raise Unwritten(f"Error while writing to {request.channel.where}: {exc}") from exc
        skip, count = reading(request, reloaded)
        reply = outcome(request, await read(conn, skip, count), reloaded)
        if reply is not RELOAD:
            return reply
        reloaded = True


async def call_script(channel: Channel, lua: Any, keys: list[str], args: list[Any],
                      wake: tuple[str, float] | None = None, generation: int | None = None,
                      confirm: tuple[Any, ...] | None = None) -> Any:
    """One script call on one server's dedicated connection (see `ScriptRequest` for `wake` and `confirm`): the
    reply, or the exception the server or the network gave. `generation`: the channel's as the caller read it
    (a request begun before `aclose` is refused a connection after it); by default, now."""
    # (One call at a time per caller here, each to its end: nothing of the caller's is in flight before it.)
    return await _call_script(ScriptRequest(channel, lua, keys, args, wake, confirm), {},
                              channel.generation if generation is None else generation, None)
