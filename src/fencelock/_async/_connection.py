"""What one dedicated Redis connection does under asyncio: write, read replies, close; and who owns a `Channel`'s
connections (the running loop and process). Hand-written twin: `_sync/_connection.py`."""

from __future__ import annotations

import asyncio
import os
from collections import deque
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from .._redis.channel import ChannelBase, closed_by_peer
from .._redis.request import Closed, Refused


class Connections(ChannelBase):
    """A server's connections, idle or in use, that belong to one event loop and process (`Channel` builds on it)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self._idle: deque[Any] = deque()
        self._open: set[Any] = set()  # every connection made and not yet dropped: idle or in use
        self._owner: tuple[int, asyncio.AbstractEventLoop | None] = (os.getpid(), None)

    def _adopt(self) -> None:
        """Under another loop or process than the connections': let them go (new ones are made)."""
        owner = os.getpid(), asyncio.get_running_loop()
        if owner != self._owner:
            self._let_go()
            self._owner = owner

    def _owned(self) -> bool:
        return self._owner == (os.getpid(), asyncio.get_running_loop())

    def _let_go(self) -> None:
        """Forget the connections of another loop (closing them if that loop still runs) or another process."""
        old, self._open, self._idle = self._open, set(), deque()
        self._forget_requests()
        for conn in old if self._owner[0] == os.getpid() else ():
            try:
                conn._close()  # without waiting: the loop they belong to is not running here
            except RuntimeError:
                pass  # that loop is closed, and its transports with it

    def _stop(self) -> None:
        """Nothing runs on a channel's behalf under asyncio (the sync twin's threads)."""


async def drop(conn: Any) -> None:
    """Close a connection whose reply will not be read (or that failed): it is never used again."""
    await conn.disconnect(nowait=True)


async def close_client(client: Any) -> None:
    """Close a redis-py client fencelock made. Connections that an ended event loop made (one client, a later
    `asyncio.run`) cannot be closed through that loop: redis-py tries every one, and those end with their loop."""
    try:
        await client.aclose()
    except RuntimeError:
        pass


def discard(conn: Any) -> None:
    """Close an idle connection the server closed (the transport only: there is nothing to say to it)."""
    conn._close()


def connected(conn: Any) -> bool:
    return bool(conn.is_connected)


def idle_closed(conn: Any) -> bool:
    """The server closed this idle connection: the loop saw it end, or its socket has something to read."""
    reader, writer = conn._reader, conn._writer
    if reader is None or writer is None or writer.transport.is_closing():
        return True
    if reader.at_eof() or reader.exception() is not None:
        return True
    if writer.transport.get_extra_info("sslcontext") is not None:
        return False  # the loop reads TLS's own records off the socket: what is left there is not ours to judge
    return closed_by_peer(writer.transport.get_extra_info("socket"))


async def write(conn: Any, command: bytes) -> None:
    """Write a request. (redis-py's send_packed_command starts a task for every command when a socket timeout
    is set; a command this small goes straight into the transport's buffer, and the reply's read is timed.)"""
    conn._writer.write(command)
    await conn._writer.drain()


async def read(conn: Any, skip: int = 0, count: int = 1) -> Any:
    """One reply (`count` > 1: a list of that many in a row), after `skip` dropped ones (one that is an error is
    returned with them: `Refused`); a server's error is returned, not raised. A network fault raises redis-py's
    TimeoutError, or `Closed` (any ConnectionError)."""
    replies: list[Any] = []
    refused = None
    try:
        for _ in range(skip):
            try:
                await conn.read_response()
            except ResponseError as exc:
                refused = exc
        while len(replies) < count:
            try:
                replies.append(await conn.read_response())
            except ResponseError as exc:
                replies.append(exc)
    except RedisConnectionError as exc:
        if isinstance(exc, Closed):
            raise
        raise Closed(str(exc)) from exc
    value = replies[0] if count == 1 else replies
    return value if refused is None else Refused(refused, value)
