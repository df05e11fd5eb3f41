"""What both front ends' `Channel` (`_transport.py`) share of one server's connections, with no I/O: the settings
they are made with, each caller's latest request there (for the order rule, `order.py`), which idle connections are
fit to use, which requests go first when all are busy, and the count of blocking waits.

A connection taken idle may have been closed by the server meanwhile (its idle timeout, a load balancer's, a
restart): that is not a failure. One found closed before the write (`closed_by_peer`) is dropped, and the request
goes on another (what becomes of a request whose connection closes under it is `request.py`'s rule).
"""

from __future__ import annotations

import select
import ssl
import threading
import weakref
from typing import Any

from .order import Finished, NotSent, last_sent, orphan_of

PATIENCE = 2.0
"""Seconds a request waits for the caller's previous request to the same server when the client has no socket
timeout (with one, it waits that long: the previous request's reply is read within it, or its connection dropped)."""


MAINTENANCE = frozenset({"extend", "extend_many", "release", "redlock_extend", "redlock_extend_many",
                         "redlock_release"})
"""Scripts that keep or end a lease already held: when a server's connections are all busy (`MAX_OPEN`), they get
the next free one before any acquire, wait or read, so that no crowd of acquires makes a held lease miss its
renewal."""


def maintains(lua: Any) -> bool:
    """Whether a request with this script renews or releases a held lease (`MAINTENANCE`)."""
    return lua.name in MAINTENANCE


def readable(socks: list[Any], timeout: float) -> list[Any]:
    """The sockets of `socks` with something to read (a reply, an end of file, an error) within `timeout` s.

    `poll`, where there is one: `select` refuses descriptors numbered 1024 and above."""
    if not hasattr(select, "poll"):
        return list(select.select(socks, [], [], timeout)[0])
    poller = select.poll()
    by_fd = {}
    for sock in socks:
        fd = sock.fileno()
        by_fd[fd] = sock
        poller.register(fd, select.POLLIN | select.POLLPRI)
    return [by_fd[fd] for fd, _ in poller.poll(max(0.0, timeout) * 1000.0)]


def closed_by_peer(sock: Any) -> bool:
    """An idle connection's socket that the server has closed (or sent something to unasked): not to be used.

    One poll, without reading: an idle connection has nothing to read, so anything readable is an end of file, a
    reset, or data nobody asked for."""
    if sock is None:
        return True
    try:
        if hasattr(select, "poll"):  # any descriptor number (select() stops at 1024)
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            readable = bool(poller.poll(0))
        else:
            readable = bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True
    if readable and isinstance(sock, ssl.SSLSocket):
        return _tls_closed(sock)
    return readable


def _tls_closed(sock: ssl.SSLSocket) -> bool:
    """A TLS socket with bytes to read: TLS's own records (a session ticket the server sends after the handshake)
    leave it usable; an end of file, an alert or application data do not."""
    before = sock.gettimeout()
    try:
        sock.setblocking(False)
        try:
            sock.recv(1)
        finally:
            sock.settimeout(before)
    except ssl.SSLWantReadError:
        return False
    except OSError:
        return True
    return True


def no_retry() -> dict[str, Any]:
    """A redis-py connection's settings without any retry (it then retries nothing: Retry(NoBackoff(), 0))."""
    return {"retry": None, "retry_on_error": [], "retry_on_timeout": False}


class ChannelBase:
    """One server's dedicated connections, the part both front ends share: how to make one (the client's own
    connection class and settings: address, TLS, credentials, timeouts) and each caller's latest request in
    flight there. A caller is a thread (sync) or a task (asyncio)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        pool = client.connection_pool
        # The client's settings, but never its retry policy: whether a request (or a connect) goes again is
        # fencelock's rule (`may_resend`, `reconnect`); a user's client's Retry backs off for seconds between
        # connects to a server that is down (decision 2026-12-05-client-retry-policy).
        self._class = pool.connection_class
        self._kwargs = {**pool.connection_kwargs, **no_retry()}
        self.where: str = self._kwargs.get("path") or f"{self._kwargs.get('host', '?')}:{self._kwargs.get('port', '?')}"
        self.generation = 0  # +1 at every close: what a request begun before it finds is not its to use
        self._patience: float = self._kwargs.get("socket_timeout") or PATIENCE
        self._forget_requests()

    def _forget_requests(self) -> None:
        """Start afresh (a new process, a new event loop): the requests in flight are not this one's."""
        self._latest: dict[Any, tuple[Any, float]] = {}  # caller -> its latest request here, and its bound
        self._latest_lock = threading.Lock()  # threads track at once (a task never holds it across an await)

    def in_flight(self, caller: Any) -> tuple[Any, float] | None:
        """The caller's latest request here while its reply is still to come (or the one that request waited for
        in vain), or dropped unanswered and not yet ended on the server (`orphan_of`), with how long to wait."""
        latest = self._latest.get(caller)
        if latest is None:
            return None
        latest = last_sent(latest)
        return latest if not latest[0].done() or orphan_of(latest) is not None else None

    def track(self, caller: Any, request: Finished, timeout: float) -> None:
        """`request` is the caller's latest here, still in flight; a later one waits for it, at most the socket
        timeout (at least `timeout`, the per-server timeout it was sent with)."""
        with self._latest_lock:
            self._latest[caller] = request, max(self._patience, timeout)
            if len(self._latest) > 64:  # callers that ended with a request in flight: forget the finished ones
                for key in [key for key, (handle, _) in self._latest.items() if handle.done()]:
                    del self._latest[key]

    def not_sent(self, before: tuple[Any, float]) -> NotSent:
        """The reply of a request that this channel did not send, because `before` got no answer."""
        return NotSent(self.where, before)


MAX_BLOCKING = 256
"""Waits (BLPOP) one server's `Channel`, or one redis-py client, lets block there at once, each on a connection of
its own (the waiters of one name share one: `waiting.py`). A wait beyond it sleeps in the client instead, a
jittered `CROWDED_PAUSE` at most, then asks once without blocking: waiters on many names cost no more connections
than the server and the client's file descriptors can give."""


CROWDED_PAUSE = (0.5, 1.5)
"""The range a wait beyond `MAX_BLOCKING` sleeps in, seconds (never past its own wait)."""


class BlockingSlots:
    """How many waits block now through each owner (a `Channel`, or a redis-py client), at most `MAX_BLOCKING`."""

    def __init__(self) -> None:
        self._counts: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def take(self, owner: Any) -> bool:
        """A slot for one more blocking wait through `owner`, if one is free (then `give_back` it once)."""
        with self._lock:
            count = self._counts.get(owner, 0)
            if count >= MAX_BLOCKING:
                return False
            self._counts[owner] = count + 1
            return True

    def give_back(self, owner: Any) -> None:
        with self._lock:
            self._counts[owner] = max(self._counts.get(owner, 0) - 1, 0)

    def forget(self, owner: Any) -> None:
        """`owner`'s waits are gone without their slots (a forked child's copy of its parent's channel)."""
        with self._lock:
            self._counts.pop(owner, None)

    def blocking(self, owner: Any) -> int:
        with self._lock:
            return self._counts.get(owner, 0)


BLOCKING = BlockingSlots()
"""The one count of blocking waits, shared by fencelock's own channels and by the clients users pass in."""
