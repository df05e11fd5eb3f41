"""What one dedicated Redis connection does under threads: write, read replies (a small RESP reader on the socket,
which the select loop shares), close; and a `Channel`'s own threads. Hand-written twin: `_async/_connection.py`."""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._redis import resp
from .._redis.channel import ChannelBase, closed_by_peer
from .._redis.request import Closed, Refused, server_error
from ._concurrency import T

LANE_WORKERS = 8
"""Threads per server for the work that blocks on it (see `Connections.submit`)."""

LANE_BACKLOG = 256
"""Jobs one server may have waiting or running before its new requests fail at once (it is stalled)."""


class Connections(ChannelBase):
    """A server's connections, idle or in use, that belong to this process (`Channel` builds on it), and its own
    few threads for the work that blocks on it (`submit`)."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        # deque's append and pop, and a set's add and discard, are atomic: no lock is needed between threads.
        self._idle: deque[Any] = deque()
        self._open: set[Any] = set()  # every connection made and not yet dropped: idle or in use
        self._pid = os.getpid()
        self._workers: ThreadPoolExecutor | None = None
        self._jobs = 0  # submitted and not yet finished
        self._jobs_lock = threading.Lock()
        _EVERY.add(self)

    def _adopt(self) -> None:
        """Forked: those sockets are the parent's, and so are the threads."""
        if self._pid != os.getpid():
            self._let_go()

    def _owned(self) -> bool:
        return self._pid == os.getpid()

    def _let_go(self) -> None:
        self._idle, self._open, self._pid = deque(), set(), os.getpid()
        self._workers, self._jobs = None, 0
        self._jobs_lock = threading.Lock()  # (a forked child's copy may be held by a parent's thread, for ever)
        self._forget_requests()

    def _stop(self) -> None:
        with self._jobs_lock:
            workers, self._workers = self._workers, None
        if workers is not None:
            workers.shutdown(wait=False)  # its threads end once their jobs (failing fast now) are done

    def submit(self, work: Callable[..., T], *args: Any, overflow: Callable[[], T] | None = None) -> Future[T]:
        """Run `work(*args)` on this server's own threads. With `overflow`, a job that would wait behind
        `LANE_BACKLOG` others (the server is stalled) is not queued: `overflow()` is its result, at once."""
        with self._jobs_lock:
            if overflow is not None and self._jobs >= LANE_BACKLOG:
                busy: Future[T] = Future()
                busy.set_result(overflow())
                return busy
            if self._workers is None:  # (a forked child has none: `_after_fork` let go of the parent's)
                self._workers = ThreadPoolExecutor(LANE_WORKERS, f"fencelock-{self.where}")
            self._jobs += 1
            future = self._workers.submit(work, *args)
        future.add_done_callback(self._job_done)
        return future

    def _job_done(self, _: Future[Any]) -> None:
        with self._jobs_lock:
            self._jobs -= 1


_EVERY: weakref.WeakSet[Connections] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child, every server's connections, threads and locks are the parent's: let go of them all at
    once, before the child runs on. A lock that one of the parent's threads held at the fork would stay held."""
    for connections in list(_EVERY):
        connections._let_go()


os.register_at_fork(after_in_child=_after_fork)


def drop(conn: Any) -> None:
    """Close a connection whose reply will not be read (or that failed): it is never used again."""
    conn.disconnect()


def close_client(client: Any) -> None:
    """Close a redis-py client fencelock made."""
    client.close()


def discard(conn: Any) -> None:
    """Close an idle connection the server closed."""
    conn.disconnect()


def connected(conn: Any) -> bool:
    return conn._sock is not None


def idle_closed(conn: Any) -> bool:
    """The server closed this idle connection (or sent something unasked)."""
    return closed_by_peer(conn._sock)


def write(conn: Any, command: bytes) -> None:
    conn.send_packed_command([command], check_health=False)


def read(conn: Any, skip: int = 0, count: int = 1) -> Any:
    """One reply, read from the connection's socket (blocking for the rest of it, at most the socket timeout),
    after `skip` replies that come before it (a BLPOP's, see `ScriptRequest.wake`), which are dropped (one that is
    an error is returned with the rest: `Refused`); with
    `count` > 1, a list of that many replies in a row (a script's and its `confirm`'s).

    A server's error is returned as redis-py's exception (NoScriptError, ResponseError), not raised: the
    connection is still good. A network fault raises redis-py's ConnectionError (`Closed` before any byte) or
    TimeoutError.
    """
    sock = conn._sock
    data = b""
    start = 0  # where the next reply begins in `data`
    replies: list[Any] = []
    refused = None  # a skipped reply that was an error (`Refused`)
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
                if isinstance(reply, resp.ServerError):
                    refused = server_error(reply)
                continue
            if isinstance(reply, resp.ServerError):
                reply = server_error(reply)
            replies.append(reply)
            if len(replies) < count:
                continue
            if start != len(data):  # the requests' last reply: anything more means we lost track
                raise RedisConnectionError(f"unexpected data after a reply from {_where(conn)}")
            value = replies[0] if count == 1 else replies
            return value if refused is None else Refused(refused, value)


def _where(conn: Any) -> str:
    path = getattr(conn, "path", None)
    return str(path) if path else f"{getattr(conn, 'host', '?')}:{getattr(conn, 'port', '?')}"
