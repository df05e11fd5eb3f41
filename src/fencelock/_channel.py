"""What the two twins' `Channel` share (`_async/_compat.py`, `_sync/_compat.py`): the settings its connections
are made with, the rule that keeps one caller's requests to one server in order, and a request's bytes.

The rule: a request waits for the caller's latest request to that server that is still in flight, at most that
request's own bound (the socket timeout, or its per-server timeout if longer: `track`), and is then sent. If
that earlier request got no answer (none in time, or a network error), the later one is not sent at all
(`NotSent`), so that nothing queued behind a request that failed reaches a stalled server late. A request that
was not sent is never waited for; the one it waited for is.

The twins differ only in what a request in flight is (an `asyncio.Future`, a `concurrent.futures.Future`) and
how it is waited for; both have the `Finished` methods used here.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, TypeVar

from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._logic import resp

PATIENCE = 2.0
"""Seconds a request waits for the caller's previous request to the same server when the client has no socket
timeout (with one, it waits that long: the previous request's reply is read within it, or its connection dropped)."""


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


class ChannelBase:
    """One server's dedicated connections, the part both twins share: how to make one (the client's own
    connection class and settings: address, TLS, credentials, timeouts) and each caller's latest request in
    flight there. A caller is a thread (sync) or a task (asyncio)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        pool = client.connection_pool
        self._class, self._kwargs = pool.connection_class, pool.connection_kwargs
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
        in vain), with how long to wait for it."""
        latest = self._latest.get(caller)
        if latest is None:
            return None
        latest = last_sent(latest)
        return latest if not latest[0].done() else None

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


class Request(Protocol):
    """A script call on a channel, as both twins' `ScriptRequest` carry it."""

    @property
    def lua(self) -> Any: ...  # fencelock._scripts.Lua
    @property
    def keys(self) -> list[str]: ...
    @property
    def args(self) -> list[Any]: ...
    @property
    def wake(self) -> tuple[str, float] | None: ...


Packed = dict[tuple[str, int, int, tuple[str, float] | None], Any]
"""Commands already encoded, by (script, id of keys, id of args, wake): requests that share their key and
argument lists (the same objects) carry the same command, encoded once."""


def encode(conn: Any, request: Request, *, reload: bool) -> bytes:
    """The request as bytes (`resp.script_call`), encoded as the connection's own commands are."""
    lua = request.lua
    return resp.script_call(conn.encoder, lua.sha, lua.source, request.keys, request.args, reload=reload,
                            wake=request.wake)
