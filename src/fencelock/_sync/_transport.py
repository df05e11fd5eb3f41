"""Redis's own transport: a server's dedicated connections (`Channel`) and one script call on them. Hand-written
twin: `_async/_transport.py`."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._redis.channel import (
    KILL,
    REFUSE,
    WAIT,
    ChannelBase,
    Closed,
    Orphan,
    ScriptRequest,
    Unwritten,
    closed_by_peer,
    confirmed_reply,
    encode,
    end,
    may_resend,
    orphaned,
    reconnect,
    reply_of,
    server_error,
    turn,
)
from .._redis import resp
from ._admin import client_id, kill
from ._concurrency import T


class Channel(ChannelBase):
    """One server's dedicated connections for `run_scripts` and `call_script`, outside the client's pool: each
    carries one request at a time, and one thread's requests to the server keep their order (the rules:
    docs/design/redis-transport.md). Work that blocks on this server runs on its own few threads (`submit`)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        # deque's append and pop, and a set's add and discard, are atomic: no lock is needed between threads.
        self._idle: deque[Any] = deque()
        self._open: set[Any] = set()  # every connection made and not yet dropped: idle or in use
        self._pid = os.getpid()
        self._workers: ThreadPoolExecutor | None = None
        self._jobs = 0  # submitted and not yet finished
        self._jobs_lock = threading.Lock()

    def take(self, generation: int) -> Any:
        """An idle connection, connected and with nothing left to read (one the server closed while it was idle
        is dropped here); None if there is none."""
        if self._pid != os.getpid():  # forked: those sockets are the parent's, and so are the threads
            self._idle, self._open, self._pid = deque(), set(), os.getpid()
            self._workers, self._jobs = None, 0
            self._forget_requests()
        if generation != self.generation:
            return None
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return None
            if not closed_by_peer(conn._sock):
                return conn
            self._open.discard(conn)
            conn.disconnect()

    def submit(self, work: Callable[..., T], *args: Any, overflow: Callable[[], T] | None = None) -> Future[T]:
        """Run `work(*args)` on this server's own threads. With `overflow`, a job that would wait behind
        `LANE_BACKLOG` others (the server is stalled) is not queued: `overflow()` is its result, at once."""
        with self._jobs_lock:
            if overflow is not None and self._jobs >= LANE_BACKLOG:
                busy: Future[T] = Future()
                busy.set_result(overflow())
                return busy
            if self._workers is None or self._pid != os.getpid():
                self._workers, self._pid = ThreadPoolExecutor(LANE_WORKERS, f"fencelock-{self.where}"), os.getpid()
            self._jobs += 1
            future = self._workers.submit(work, *args)
        future.add_done_callback(self._job_done)
        return future

    def _job_done(self, _: Future[Any]) -> None:
        with self._jobs_lock:
            self._jobs -= 1

    def give_back(self, conn: Any) -> None:
        """Idle again, if its reply was read and it is still connected and current; otherwise closed and dropped."""
        if conn in self._open and conn._sock is not None:
            self._idle.append(conn)
        else:
            self._open.discard(conn)
            conn.disconnect()

    def connect(self, generation: int) -> Any:
        """A new connection (TCP connect and the client's handshake: it may block, so only ever from a thread);
        refused to a request begun before `close`."""
        if generation != self.generation:
            raise RedisConnectionError("the client was closed")
        conn = self._class(**self._kwargs)
        self._open.add(conn)
        try:
            conn.connect()
            if generation != self.generation:  # closed while this connected: close did not see it connected
                raise RedisConnectionError("the client was closed")
            conn.fencelock_id = client_id(conn)
        except BaseException:
            self._open.discard(conn)
            conn.disconnect()
            raise
        return conn

    def close(self) -> None:
        self.generation += 1
        old, self._open, self._idle = self._open, set(), deque()
        if self._pid == os.getpid():
            for conn in list(old):
                conn.disconnect()
            with self._jobs_lock:
                workers, self._workers = self._workers, None
            if workers is not None:
                workers.shutdown(wait=False)  # its threads end once their jobs (failing fast now) are done


LANE_WORKERS = 8
"""Threads per server for the work that blocks on it (see `Channel.submit`)."""

LANE_BACKLOG = 256
"""Jobs one server may have waiting or running before its new requests fail at once (it is stalled)."""


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
        flight.conn.send_packed_command([command], check_health=False)
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
    confirm = flight.request.confirm is not None
    try:
        reply = _read_reply(flight.conn, skip=0 if flight.request.wake is None or flight.reloaded else 1,
                            count=2 if confirm else 1)
    except Exception as exc:
        orphaned(exc, flight.conn)
        _drop(flight)
        return exc, None
    if confirm:  # the script's reply, then the answer of the command that followed it
        reply = confirmed_reply(reply[0], reply[1])
    if isinstance(reply, NoScriptError) and not flight.reloaded:
        again = flight._replace(reloaded=True)
        failed = _send(again, encode(flight.conn, flight.request, reload=True))
        return (failed, None) if failed is not None else (None, again)
    flight.request.channel.give_back(flight.conn)
    return reply_of(flight.request, reply), None


def _read_reply(conn: Any, skip: int = 0, count: int = 1) -> Any:
    """One reply, read from the connection's socket (blocking for the rest of it, at most the socket timeout),
    after `skip` replies that come before it (a BLPOP's, see `ScriptRequest.wake`), which are dropped; with
    `count` > 1, a list of that many replies in a row (a script's and its `confirm`'s).

    A server's error is returned as redis-py's exception (NoScriptError, ResponseError), not raised: the
    connection is still good. A network fault raises redis-py's ConnectionError or TimeoutError.
    """
    sock = conn._sock
    data = b""
    start = 0  # where the next reply begins in `data`
    replies: list[Any] = []
    while True:
        try:
            more = sock.recv(65536)
        except TimeoutError as exc:  # socket.timeout
            raise RedisTimeoutError(f"Timeout reading from {_where(conn)}") from exc
        except OSError as exc:
            kind = RedisConnectionError if data else Closed
            raise kind(f"Error while reading from {_where(conn)}: {exc}") from exc
        if not more:
            raise (RedisConnectionError if data else Closed)(f"Connection closed by {_where(conn)}")
        data += more
        while not isinstance(got := resp.parse(data, start), resp.Incomplete):
            reply, start = got
            if isinstance(reply, resp.Push):
                continue  # a push message the server sent on its own: not a reply
            if skip:
                skip -= 1
                continue
            if isinstance(reply, resp.ServerError):
                reply = server_error(reply)
            replies.append(reply)
            if len(replies) < count:
                continue
            if start != len(data):  # the requests' last reply: anything more means we lost track
                raise RedisConnectionError(f"unexpected data after a reply from {_where(conn)}")
            return replies[0] if count == 1 else replies


def _where(conn: Any) -> str:
    path = getattr(conn, "path", None)
    return str(path) if path else f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"


def _finish(flight: _InFlight, resend: bool = False) -> Any:
    """Wait for the reply (blocking, at most the socket timeout per read, which then drops the connection); with
    `resend`, a request that `may_resend` goes again once, on a new connection."""
    reply, again = _receive(flight)
    while again is not None:
        reply, again = _receive(again)
    if resend and isinstance(reply, Exception) and may_resend(flight.request.lua, reply):
        return _in_thread(flight.request.again(), flight.generation, None, True)
    return reply


def _in_thread(request: ScriptRequest, generation: int, before: tuple[Future[Any], float] | None,
               fresh: bool = False) -> Any:
    """One request, sent and read in the calling thread: from a server's thread for a request `run_scripts`
    cannot send at once (after the caller's previous request to that server, at most its bound, or where no
    connection is idle), or from the caller's own (`call_script`). Send on an idle connection, or connect one
    (`fresh`: always a new one, for a request sent again); read. A request that `may_resend` goes again once."""
    channel = request.channel
    step = turn(before)
    if step.action is WAIT:  # the caller's previous request here goes first
        deadline = time.monotonic() + step.before[1]
        while step.action is WAIT:
            previous = step.before[0]
            wait([previous], timeout=max(0.0, deadline - time.monotonic()))
            if not previous.done():
                return channel.not_sent(step.before)
            step = turn(step.before)
    if step.action is REFUSE:
        return channel.not_sent(step.before)
    if step.action is KILL:
        fresh = True  # (once the old connection is ended, no resend follows: `fresh` sends once)
    conn = None if fresh else channel.take(generation)
    if conn is None:
        try:
            conn = channel.connect(generation)
        except Exception as exc:
            if reconnect(exc, fresh):  # closed by the server while we connected: the request was never sent
                return _in_thread(request, generation, None, True)
            return exc
    if step.action is KILL:
        try:
            gone = kill(conn, step.orphan)
        except Exception as exc:  # the kill itself unanswered: the old request may still run
            conn.disconnect()
            channel.give_back(conn)
            return orphaned(exc, Orphan(step.orphan))
        if gone:
            end(step.before)
        else:
            channel.give_back(conn)
            return channel.not_sent(step.before)
    flight = _InFlight(0, request, conn, generation)
    failed = _send(flight, encode(conn, request, reload=False))
    if failed is not None:
        if not fresh and may_resend(request.lua, failed):
            return _in_thread(request.again(), generation, None, True)
        return failed
    try:
        return _finish(flight, resend=not fresh)
    except BaseException:  # interrupted (KeyboardInterrupt) half-way: the reply is never read, the connection goes
        _drop(flight)
        raise


def call_script(channel: Channel, lua: Any, keys: list[str], args: list[Any],
                wake: tuple[str, float] | None = None, generation: int | None = None,
                confirm: tuple[Any, ...] | None = None) -> Any:
    """One script call on one server's dedicated connection, from this thread (see `ScriptRequest` for `wake` and
    `confirm`): the reply, or the exception the server or the network gave. `generation`: the channel's as the
    caller read it (a request begun before `close` is refused a connection after it); by default, now."""
    # (One call at a time per thread here, each to its end: nothing of the caller's is in flight before it.)
    return _in_thread(ScriptRequest(channel, lua, keys, args, wake, confirm),
                      channel.generation if generation is None else generation, None)
