"""Redis's own transport: a server's dedicated connections (`Channel`) and one script call on them. Hand-written
twin: `_sync/_transport.py`."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from .._redis.channel import (
    KILL,
    REFUSE,
    WAIT,
    ChannelBase,
    Closed,
    Orphan,
    Packed,
    ScriptRequest,
    Unwritten,
    closed_by_peer,
    confirmed_reply,
    encode,
    end,
    may_resend,
    orphaned,
    packed,
    reconnect,
    reply_of,
    turn,
)
from ._admin import client_id, kill


class Channel(ChannelBase):
    """One server's dedicated connections for `run_scripts` and `call_script`, outside the client's pool: each
    carries one request at a time, and one task's requests to the server keep their order (the rules:
    docs/design/redis-transport.md). Connections belong to the loop and the process that made them."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self._idle: list[Any] = []
        self._open: set[Any] = set()  # every connection made and not yet dropped: idle or in use
        self._owner: tuple[int, asyncio.AbstractEventLoop | None] = (os.getpid(), None)

    def take(self, generation: int) -> Any:
        """An idle connection, connected and with nothing left to read (one the server closed while it was idle
        is dropped here); None if there is none."""
        owner = os.getpid(), asyncio.get_running_loop()
        if owner != self._owner:
            self._let_go(same_process=owner[0] == self._owner[0])
            self._owner = owner
        while self._idle and generation == self.generation:
            conn = self._idle.pop()
            if not _closed_by_peer(conn):
                return conn
            self._open.discard(conn)
            conn._close()  # (the transport only: there is nothing to say to a server that hung up)
        return None

    async def give_back(self, conn: Any) -> None:
        """Idle again, if its reply was read and it is still connected and current; otherwise closed and dropped."""
        if conn in self._open and conn.is_connected:
            self._idle.append(conn)
        else:
            self._open.discard(conn)
            await conn.disconnect(nowait=True)

    async def connect(self, generation: int) -> Any:
        """A new connection: TCP connect and the client's handshake (refused to a request begun before aclose)."""
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
            await conn.disconnect(nowait=True)
            raise
        return conn

    def _let_go(self, *, same_process: bool) -> None:
        """Forget the connections of another loop (closing them if that loop still runs) or another process."""
        old, self._open, self._idle = self._open, set(), []
        self._forget_requests()
        for conn in old if same_process else ():
            try:
                conn._close()  # without waiting: the loop they belong to is not running here
            except RuntimeError:
                pass  # that loop is closed, and its transports with it

    async def aclose(self) -> None:
        self.generation += 1
        if self._owner != (os.getpid(), asyncio.get_running_loop()):
            self._let_go(same_process=self._owner[0] == os.getpid())
            return
        old, self._open, self._idle = self._open, set(), []
        for conn in old:
            await conn.disconnect(nowait=True)


def _closed_by_peer(conn: Any) -> bool:
    """The server closed this idle connection: the loop saw it end, or its socket has something to read."""
    reader, writer = conn._reader, conn._writer
    if reader is None or writer is None or writer.transport.is_closing():
        return True
    if reader.at_eof() or reader.exception() is not None:
        return True
    if writer.transport.get_extra_info("sslcontext") is not None:
        return False  # the loop reads TLS's own records off the socket: what is left there is not ours to judge
    return closed_by_peer(writer.transport.get_extra_info("socket"))


async def _call_script(request: ScriptRequest, cache: Packed, generation: int,
                       before: tuple[asyncio.Future[Any], float] | None,
                       abandoned: asyncio.Future[None] | None = None, fresh: bool = False) -> Any:
    """One request on its server's channel (after `before`, the caller's previous one there); a request that
    `may_resend` goes again once, on a new connection (`fresh`: it is that second sending). One still waiting
    for `before` when `abandoned` is set (its caller was cancelled) is never sent."""
    channel = request.channel
    step = turn(before)
    if step.action is WAIT:  # the caller's previous request here goes first
        deadline = asyncio.get_running_loop().time() + step.before[1]
        while step.action is WAIT:
            previous = step.before[0]
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining > 0:
                await asyncio.wait([previous] if abandoned is None else [previous, abandoned], timeout=remaining,
                                   return_when=asyncio.FIRST_COMPLETED)
            if not previous.done() or (abandoned is not None and abandoned.done()):
                return channel.not_sent(step.before)
            step = turn(step.before)
    if step.action is REFUSE:
        return channel.not_sent(step.before)
    if step.action is KILL:
        fresh = True  # (once the old connection is ended, no resend follows: `fresh` sends once)
    conn = None if fresh else channel.take(generation)
    if conn is None:
        try:
            conn = await channel.connect(generation)
        except Exception as exc:
            if reconnect(exc, fresh):  # closed by the server while we connected: the request was never sent
                return await _call_script(request, cache, generation, None, fresh=True)
            return exc
    if step.action is KILL:
        try:
            gone = await kill(conn, step.orphan)
        except BaseException as exc:  # the kill itself unanswered: the old request may still run
            await conn.disconnect(nowait=True)
            await channel.give_back(conn)
            if not isinstance(exc, Exception):
                raise
            return orphaned(exc, Orphan(step.orphan))
        if gone:
            end(step.before)
        else:
            await channel.give_back(conn)
            return channel.not_sent(step.before)
    command = packed(cache, conn, request)
    try:
        try:
            try:
                await _write(conn, command)
            except (OSError, RedisConnectionError) as exc:
                raise Unwritten(f"Error while writing to {channel.where}: {exc}") from exc
            try:
                reply = await _read(conn, request.wake is not None, request.confirm is not None)
            except RedisConnectionError as exc:
                if isinstance(exc, Closed):
                    raise
                raise Closed(str(exc)) from exc
        except NoScriptError:
            await _write(conn, encode(conn, request, reload=True))
            reply = await _read(conn, False, request.confirm is not None)
    except ResponseError as exc:  # the server's answer: the connection is still good
        reply = exc
    except BaseException as exc:
        # A network error (redis-py has closed the connection), or the task was cancelled half-way, which
        # leaves a reply unread: either way this connection must not carry another request.
        orphaned(exc, conn)
        await conn.disconnect(nowait=True)
        await channel.give_back(conn)  # (dropped: it is not connected)
        if not isinstance(exc, Exception):
            raise
        if not fresh and may_resend(request.lua, exc):
            return await _call_script(request.again(), cache, generation, None, fresh=True)
        return exc
    await channel.give_back(conn)
    return reply_of(request, reply)


async def _read(conn: Any, after_wait: bool, confirmed: bool = False) -> Any:
    """The request's reply; `after_wait`: first the BLPOP's answer, which is dropped (see ScriptRequest.wake);
    `confirmed`: then the answer of the command that followed the script, and the reply is a `Confirmed` (a
    script's error is raised once both were read)."""
    if after_wait:
        try:
            await conn.read_response()
        except ResponseError:
            pass
    if not confirmed:
        return await conn.read_response()
    try:
        reply = await conn.read_response()
    except ResponseError as exc:
        reply = exc
    try:
        confirmation = await conn.read_response()
    except ResponseError as exc:
        confirmation = exc
    result = confirmed_reply(reply, confirmation)
    if isinstance(result, ResponseError):
        raise result
    return result


async def _write(conn: Any, command: bytes) -> None:
    """Write a request. (redis-py's send_packed_command starts a task for every command when a socket timeout
    is set; a command this small goes straight into the transport's buffer, and the reply's read is timed.)"""
    conn._writer.write(command)
    await conn._writer.drain()


async def call_script(channel: Channel, lua: Any, keys: list[str], args: list[Any],
                      wake: tuple[str, float] | None = None, generation: int | None = None,
                      confirm: tuple[Any, ...] | None = None) -> Any:
    """One script call on one server's dedicated connection (see `ScriptRequest` for `wake` and `confirm`): the
    reply, or the exception the server or the network gave. `generation`: the channel's as the caller read it
    (a request begun before `aclose` is refused a connection after it); by default, now."""
    # (One call at a time per task here, each awaited to its end: nothing of the caller's is in flight before it.)
    return await _call_script(ScriptRequest(channel, lua, keys, args, wake, confirm), {},
                              channel.generation if generation is None else generation, None)
