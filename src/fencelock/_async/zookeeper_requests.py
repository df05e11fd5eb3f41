"""The ZooKeeper backend's sessions and requests: one kazoo session per session timeout, each request awaited (a
fault is a `BackendError`), and a request whose connection dropped sent once more where it may be sent twice."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from .._errors import BackendError, MissingExtra
from .._logic.args import DEFAULT_TTL, ttl_ms
from .._logic.timing import Clock, lease_clock
from .._zk.rules import (
    encode_name,
    retry_after,
    root_path,
    session_timeout_ms,
    ttl_fits,
)
from .._zk.session import CLIENT_ERRORS, SessionFault, ZKSession
from .._zk.url import ZooKeeperTarget
from ._kazoo import thread_result, wait_thread_event

try:
    from kazoo.exceptions import ConnectionLoss, NodeExistsError, NoNodeError, SessionExpiredError
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingExtra("zookeeper:// URLs need kazoo, which the zookeeper extra installs: "
                       "pip install 'fencelock[zookeeper]'") from exc


class AsyncZooKeeperRequests:
    """The sessions of one ZooKeeper client and its requests on them; `AsyncZooKeeperBackend` is the lock on top."""

    def __init__(self, target: ZooKeeperTarget, *, prefix: str, clock: Clock = lease_clock) -> None:
        self._target = target
        self._clock = clock  # the client's: waits and the TTLs of held nodes are counted on it
        self._timeout = target.timeout
        self._root = root_path(target.chroot, encode_name(prefix))
        self.shown = f"zookeeper at {target.hosts_string}{target.chroot}"
        self._lock = threading.Lock()
        self._sessions: dict[int, ZKSession] = {}
        self._server_min_ms: int | None = None
        self._closed = False
        self._pid = os.getpid()

    def _forked(self) -> None:
        """In a forked child, kazoo's threads are gone and the sessions are the parent's: start afresh, and never
        close or touch what the parent holds (a close from here would end the parent's sessions)."""
        if os.getpid() == self._pid:
            return
        with self._lock:
            if os.getpid() == self._pid:
                return
            self._pid = os.getpid()
            self._sessions, self._server_min_ms = {}, None
            self._forget_parent()

    def _forget_parent(self) -> None:
        """(In a forked child, under `_lock`:) forget what the parent's sessions hold, beyond the sessions."""

    # -- sessions -----------------------------------------------------------------------------------------

    async def _session_for(self, ms: int, name: str | None, *, lease: bool = True) -> ZKSession:
        """The session for leases of `ms`, connected once (within the URL's timeout). `lease`: a lease will claim
        `ms` on it, so a session the server keeps for less is a ValueError (nothing else is sent)."""
        self._forked()
        requested = session_timeout_ms(ms, self._server_min_ms)
        with self._lock:
            if self._closed:
                raise BackendError(f"this client of {self.shown} is closed", name=name)
            session = self._sessions.get(requested)
            if session is None:
                session = self._sessions[requested] = ZKSession(self._target, requested)
        if not session.ready.is_set() and not await wait_thread_event(session.ready, self._timeout):
            raise BackendError(f"cannot reach {self.shown} within {self._timeout} s", name=name)
        negotiated = session.negotiated_ms or 0
        if negotiated > requested:
            # The server raised our timeout to its minimum: every TTL up to it can share this session.
            with self._lock:
                if self._server_min_ms is None or negotiated > self._server_min_ms:
                    self._server_min_ms = negotiated
                self._sessions.setdefault(negotiated, session)
        if lease and not ttl_fits(ms, negotiated):
            raise ValueError(f"ttl {ms / 1000} s is longer than the longest session {self.shown} grants "
                             f"({negotiated / 1000} s, its maxSessionTimeout): use a shorter ttl, or raise "
                             f"maxSessionTimeout in the server's zoo.cfg (by default 20 x tickTime, 40 s) "
                             f"(lock {name!r})")
        return session

    async def _some_session(self, name: str | None) -> ZKSession:
        """A connected session for requests that belong to no lease (operators, clean-up)."""
        self._forked()
        for session in list(self._sessions.values()):
            if session.connected:
                return session
        return await self._session_for(ttl_ms(DEFAULT_TTL), name, lease=False)

    # -- requests -----------------------------------------------------------------------------------------

    async def _call(self, session: ZKSession, result: Any, name: str | None, what: str) -> Any:
        """Await one kazoo request sent on `session`; a fault is a `BackendError` (NoNodeError, NodeExistsError
        pass: callers decide). A request with no answer within the timeout drops the session's connection."""
        try:
            return await thread_result(result, self._timeout)
        except (NoNodeError, NodeExistsError):
            raise
        except CLIENT_ERRORS as exc:
            if isinstance(exc, TimeoutError):  # no answer in time (our bridge's timeout)
                session.unanswered()
            error = BackendError(f"{what} failed on {self.shown}: {type(exc).__name__}: {exc}", name=name)
            if isinstance(exc, (ConnectionLoss, SessionExpiredError, TimeoutError)):
                # Its session had (or now has) no connection: the fault may pass (`retry_after`, `_reconnected`).
                fault = SessionFault(session, dropped=isinstance(exc, ConnectionLoss))
                fault.__cause__ = exc
                raise error from fault
            raise error from exc

    async def _reconnected(self, session: ZKSession, exc: BackendError) -> bool:
        """Whether a request that failed with `exc` may go again now: its connection dropped under it while its
        session lives on (a reset, a server that closed it, a member that went away), and kazoo connected the
        session again within the URL's timeout. Only for requests that may be sent twice (reads, a release, an
        extend: docs/decisions/2026-12-05-zookeeper-dropped-connections.md)."""
        fault = exc.__cause__
        if self._closed or not isinstance(fault, SessionFault) or not fault.dropped:
            return False
        return await wait_thread_event(session.live, self._timeout)

    async def _again(self, session: ZKSession, send: Callable[[], Any], name: str | None, what: str) -> Any:
        """Send a request that may be sent twice (`send()` makes it); if its connection dropped under it, send it
        once more on the session's next connection (`_reconnected`)."""
        try:
            return await self._call(session, send(), name, what)
        except BackendError as exc:
            if not await self._reconnected(session, exc):
                raise
        return await self._call(session, send(), name, what)

    async def _children(self, session: ZKSession, directory: str, name: str | None, *,
                        again: bool = False) -> list[str]:
        """The children of `directory` ([] if it does not exist). `again`: sent once more after a dropped
        connection (`_again`); an acquire's own tries do that within its wait instead."""
        send = partial(session.client.get_children_async, directory)
        try:
            if again:
                children: list[str] = await self._again(session, send, name, "listing")
            else:
                children = await self._call(session, send(), name, "listing")
        except NoNodeError:
            return []
        return children

    async def _czxid(self, session: ZKSession, path: str, name: str, watch: Any = None) -> int | None:
        stat = await self._call(session, session.client.exists_async(path, watch=watch), name, "exists")
        return None if stat is None else int(stat.czxid)

    def retry_after(self, exc: BackendError, failures: int) -> float | None:
        """Transient faults are tried again within the acquire's `wait` (`fencelock._zk.rules.retry_after`): a
        session without a connection, a request dropped with its connection or unanswered, a session that
        expired (kazoo opens a new one; the attempt queues again in it)."""
        fault = exc.__cause__
        transient = isinstance(fault, SessionFault) and fault.session.may_return() and not self._closed
        return retry_after(failures, transient)  # a closed client's sessions never come back
