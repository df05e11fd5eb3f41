# Generated from _async/zookeeper.py by scripts/unasync.py: do not edit, edit that file instead.
"""The ZooKeeper backend: an ephemeral sequential node per acquisition, FIFO, fenced by the node's czxid.

Sessions (one per session timeout, from the TTL) are `fencelock._zk.session`'s; kazoo's requests are awaited through
`_kazoo.thread_result`, so this one file is the source of both front ends. How and why: docs/design/zookeeper.md.
"""

from __future__ import annotations

import fnmatch
import os
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from .._errors import BackendError, MissingExtra
from .._logic.args import DEFAULT_TTL, ttl_ms
from .._logic.outcomes import Attempt, Released, gone
from .._logic.status import LockStatus
from .._logic.timing import Clock, Deadline, lease_clock
from .._zk.nodes import Expiry, Node
from .._zk.rules import (
    Position,
    Session,
    child_name,
    decode_lease,
    decode_name,
    decode_number,
    encode_lease,
    encode_name,
    find_own,
    lease_remaining,
    lock_path,
    node_prefix,
    position,
    queue,
    renewal_answer,
    retry_after,
    root_path,
    session_timeout_ms,
    session_too_long,
    ttl_fits,
)
from .._zk.session import CLIENT_ERRORS, SessionFault, ZKSession, stop
from .._zk.url import ZooKeeperTarget
from ._concurrency import unless_given_up
from ._kazoo import Wakeup, thread_result, wait_thread_event
from ._threads import blocking

try:
    from kazoo.exceptions import ConnectionLoss, NodeExistsError, NoNodeError, SessionExpiredError
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingExtra("zookeeper:// URLs need kazoo, which the zookeeper extra installs: "
                       "pip install 'fencelock[zookeeper]'") from exc

SCAN_BATCH = 1000
"""Lock names whose queues `list()` asks for at once (one round trip for many idle names, never an unbounded
burst of requests)."""

BLOCK_CAP = 2.0
"""Seconds a waiter waits for its predecessor's watch before it looks at the queue again. Watches are reliable
on a live session; this only bounds the wait after one was dropped with a connection."""


class ZooKeeperBackend:
    """Locks kept as ephemeral sequential nodes in ZooKeeper (docs/design/zookeeper.md)."""

    def __init__(self, target: ZooKeeperTarget, *, prefix: str, clock: Clock = lease_clock) -> None:
        self._target = target
        self._clock = clock  # the client's: waits and the TTLs of held nodes are counted on it
        self._timeout = target.timeout
        self._root = root_path(target.chroot, encode_name(prefix))
        self.shown = f"zookeeper at {target.hosts_string}{target.chroot}"
        self.block_cap = BLOCK_CAP
        self.supports_fair = True   # every waiter is served in arrival order, fair=True or not
        self.always_queues = True
        self._lock = threading.Lock()
        self._sessions: dict[int, ZKSession] = {}
        self._server_min_ms: int | None = None
        self._queued: dict[tuple[str, str], Node] = {}   # waiting, by (name, token)
        self._held: dict[tuple[str, str], Node] = {}     # granted, by (name, token)
        self._sent: set[tuple[str, str]] = set()          # a create went out, no answer yet: a retry looks first
        self._unanswered: set[tuple[str, str]] = set()    # acquires that met a request unanswered (`reconnect_wait`)
        self._directories: set[str] = set()               # lock paths known to exist
        self._root_made = False                           # the root path exists (made or found)
        self._expiry = Expiry(self._expire, self._clock)
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
            self._queued, self._held, self._sent, self._unanswered = {}, {}, set(), set()
            self._expiry = Expiry(self._expire, self._clock)

    # -- sessions -----------------------------------------------------------------------------------------

    def _session_for(self, ms: int, name: str | None, *, lease: bool = True) -> ZKSession:
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
        if not session.ready.is_set() and not wait_thread_event(session.ready, self._timeout):
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

    def _some_session(self, name: str | None) -> ZKSession:
        """A connected session for requests that belong to no lease (operators, clean-up)."""
        self._forked()
        for session in list(self._sessions.values()):
            if session.connected:
                return session
        return self._session_for(ttl_ms(DEFAULT_TTL), name, lease=False)

    # -- requests -----------------------------------------------------------------------------------------

    def _call(self, session: ZKSession, result: Any, name: str | None, what: str) -> Any:
        """Await one kazoo request sent on `session`; a fault is a `BackendError` (NoNodeError, NodeExistsError
        pass: callers decide). A request with no answer within the timeout drops the session's connection."""
        try:
            return thread_result(result, self._timeout)
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

    def _reconnected(self, session: ZKSession, exc: BackendError) -> bool:
        """Whether a request that failed with `exc` may go again now: its connection dropped under it while its
        session lives on (a reset, a server that closed it, a member that went away), and kazoo connected the
        session again within the URL's timeout. Only for requests that may be sent twice (reads, a release, an
        extend: docs/decisions/2026-12-05-zookeeper-dropped-connections.md)."""
        fault = exc.__cause__
        if self._closed or not isinstance(fault, SessionFault) or not fault.dropped:
            return False
        return wait_thread_event(session.live, self._timeout)

    def _again(self, session: ZKSession, send: Callable[[], Any], name: str | None, what: str) -> Any:
        """Send a request that may be sent twice (`send()` makes it); if its connection dropped under it, send it
        once more on the session's next connection (`_reconnected`)."""
        try:
            return self._call(session, send(), name, what)
        except BackendError as exc:
            if not self._reconnected(session, exc):
                raise
        return self._call(session, send(), name, what)

    def _children(self, session: ZKSession, directory: str, name: str | None, *,
                        again: bool = False) -> list[str]:
        """The children of `directory` ([] if it does not exist). `again`: sent once more after a dropped
        connection (`_again`); an acquire's own tries do that within its wait instead."""
        send = partial(session.client.get_children_async, directory)
        try:
            if again:
                children: list[str] = self._again(session, send, name, "listing")
            else:
                children = self._call(session, send(), name, "listing")
        except NoNodeError:
            return []
        return children

    def _czxid(self, session: ZKSession, path: str, name: str, watch: Any = None) -> int | None:
        stat = self._call(session, session.client.exists_async(path, watch=watch), name, "exists")
        return None if stat is None else int(stat.czxid)

    def retry_after(self, exc: BackendError, failures: int) -> float | None:
        """Transient faults are tried again within the acquire's `wait` (`fencelock._zk.rules.retry_after`): a
        session without a connection, a request dropped with its connection or unanswered, a session that
        expired (kazoo opens a new one; the attempt queues again in it)."""
        fault = exc.__cause__
        transient = isinstance(fault, SessionFault) and fault.session.may_return() and not self._closed
        return retry_after(failures, transient)  # a closed client's sessions never come back

    # -- acquire ------------------------------------------------------------------------------------------

    def try_acquire(self, name: str, token: str, ttl_ms: int, wait: float = 0.0,
                          fair: bool = False) -> Attempt:
        """Join the queue (once per token), then: the holder is granted; a waiter watches its predecessor for
        up to `wait` seconds, and is refused when time is up. The queue is listed when we join and when the node
        ahead goes, never again while it stays: a later attempt of a waiter only checks (in one round trip) that
        its own node and the one ahead still exist, so a hand-off costs a listing whatever the queue's length
        (docs/decisions/2026-12-05-zookeeper-many-waiters.md)."""
        self._forked()
        key = (name, token)
        deadline = Deadline.after(wait, self._clock())
        node = self._queued.get(key)
        session = node.session if node is not None else self._session_for(ttl_ms, name)
        silent = session.silent
        try:
            return self._attempt(session, key, ttl_ms, deadline, node)
        except BackendError:
            if session.silent and not silent:
                self._unanswered.add(key)  # this call met the silence: its later attempts do not wait it out
            raise

    def _attempt(self, session: ZKSession, key: tuple[str, str], ttl_ms: int, deadline: Deadline,
                       node: Node | None) -> Attempt:
        name, token = key
        directory = lock_path(self._root, name)
        requeued = False
        while True:
            if node is None:
                node = self._join(session, directory, key, ttl_ms)
                self._queued[key] = node
            before = node.before
            if before is None:
                where, before = position(self._children(session, directory, name), token)
                if where is Position.GONE:
                    # Our node vanished while we waited (its session expired, or it was deleted): queue again, once.
                    self._queued.pop(key, None)
                    node = None
                    if requeued:
                        return Attempt(False, 0, None)
                    requeued = True
                    continue
                if where is Position.HOLDER:
                    if node.waited:
                        # The node's write time tells operators when its TTL ends (`status`): restart it now. Not
                        # awaited: the hand-off does not wait for it, and the next renewal writes it anyway.
                        session.client.set_async(node.path, node.data(ttl_ms))
                    self._grant(key, node, ttl_ms)
                    return Attempt(True, node.czxid, None)
                node.before = before
            node.waited = True
            now = self._clock()
            if deadline.expired(now) or before is None:
                return Attempt(False, 0, None)
            wakeup = node.wakeup = Wakeup()
            # Both go out before either answer is awaited (one round trip): ours first, so that a node ahead
            # seen to exist was there after ours was (a queue only loses nodes ahead of ours).
            own = session.client.exists_async(node.path)
            watched = self._czxid(session, f"{directory}/{child_name(before)}", name, watch=node.woken)
            if self._call(session, own, name, "exists") is None or watched is None:
                node.before = None  # ours is gone, or the one ahead is: list the queue again
                continue
            woken = unless_given_up(wakeup.wait(deadline.remaining(now)))
            if woken is None:
                return Attempt(False, 0, None)  # our caller gave up (cancelled): its undo takes our node out
            if woken:
                node.before = None  # the node ahead changed (deleted): list the queue again

    def _join(self, session: ZKSession, directory: str, key: tuple[str, str], ttl_ms: int) -> Node:
        """Our node in the queue: the one an earlier create of this token made, else a new one."""
        name, token = key
        if key in self._sent:
            own = find_own(self._children(session, directory, name), token)
            if own is not None:
                # The earlier create went through: rewrite its node with this attempt's TTL, so that the server's
                # copy of the TTL (the node's write time) counts from this attempt too, as the lease's validity does.
                try:
                    stat = self._call(session, session.client.set_async(f"{directory}/{child_name(own)}",
                                                                              encode_lease(ttl_ms)), name, "create")
                except NoNodeError:
                    stat = None  # gone meanwhile (its session expired, or an operator deleted it): create anew
                if stat is not None:
                    self._sent.discard(key)
                    return Node(session, directory, own, int(stat.czxid))
        if not session.live.is_set() and not wait_thread_event(
                session.live, session.reconnect_wait(self._timeout, met_silence=key in self._unanswered)):
            # Not connected again in time. A create now would wait in kazoo's queue and might reach the server
            # after we gave up.
            raise BackendError(f"the session with {self.shown} is {session.state.value}: not queueing now",
                               name=name) from SessionFault(session)
        for _ in range(2):
            if directory not in self._directories:
                # Made here, not by the create's `makepath`: kazoo would send that create again after making the
                # path, behind any listing we sent meanwhile, which then could not see our node.
                self._make_directory(session, directory, name)
            self._sent.add(key)
            request = session.client.create_async(f"{directory}/{node_prefix(token)}", encode_lease(ttl_ms),
                                                  ephemeral=True, sequence=True, include_data=True)
            try:
                path, stat = self._call(session, request, name, "create")
                self._sent.discard(key)  # answered: from now on our node is known
                break
            except NoNodeError:
                self._directories.discard(directory)  # deleted by an operator: make it again
        else:
            raise BackendError(f"the lock's path on {self.shown} vanished twice while queueing", name=name)
        own = find_own([path.rsplit("/", 1)[1]], token)
        if own is None:  # pragma: no cover - ZooKeeper names sequential nodes as documented
            raise BackendError(f"unexpected node name {path!r} from {self.shown}", name=name)
        return Node(session, directory, own, int(stat.czxid))

    def _make_directory(self, session: ZKSession, directory: str, name: str) -> None:
        """The lock's persistent node: one create once the root is known to exist (kazoo's ensure_path would
        ask for every level first), and the root's whole path before that."""
        client = session.client
        for path in ([] if self._root_made else [self._root]) + [directory]:
            try:
                self._call(session, client.create_async(path), name, "creating the lock's path")
            except NodeExistsError:
                pass
            except NoNodeError:
                self._call(session, client.ensure_path_async(path), name, "creating the lock's path")
        self._root_made = True
        self._directories.add(directory)

    def _grant(self, key: tuple[str, str], node: Node, ms: int) -> None:
        self._queued.pop(key, None)
        self._sent.discard(key)
        self._unanswered.discard(key)
        node.expires = Deadline.after(ms / 1000.0, self._clock())
        with self._lock:
            self._held[key] = node
        self._expiry.schedule(key, node)

    def _expire(self, key: tuple[str, str], node: Node) -> None:
        """The expiry thread: the TTL of a held node ran out unextended; delete it (as Redis expires a key)."""
        with self._lock:
            if self._held.get(key) is not node:
                return
            if not node.expires.expired(self._clock()):
                again = True
            else:
                again = False
                del self._held[key]
        if again:
            self._expiry.schedule(key, node)
        else:
            node.delete(record=True)

    # -- leaving ------------------------------------------------------------------------------------------

    def leave(self, name: str, token: str) -> None:
        """A waiter gives up (deadline, cancellation, failure): its node goes now, or at the next reconnect."""
        self._forked()
        key = (name, token)
        node = self._queued.pop(key, None)
        done = Wakeup()
        if node is not None and key not in self._sent:
            node.delete(done.set)  # our one node: its path is known
        else:  # a create may have gone out without its answer: look for every node of ours
            session = node.session if node is not None else self._some_session(name)
            session.abandon(lock_path(self._root, name), token, done.set)
        self._sent.discard(key)
        self._unanswered.discard(key)
        if not done.wait(self._timeout):
            raise BackendError(f"leaving the queue of {self.shown} got no answer; retried at reconnect", name=name)

    # -- release, extend ----------------------------------------------------------------------------------

    def release(self, name: str, token: str, fence: int) -> Released:
        self._forked()
        key = (name, token)
        node = self._held.get(key)
        directory = lock_path(self._root, name)
        sent_before = False
        if node is not None:
            sent_before, node.releasing = node.releasing, True
            try:
                self._call(node.session, node.release_request(), name, "release")
            except NoNodeError:
                pass
            except BackendError as exc:
                if not self._reconnected(node.session, exc):
                    raise
                sent_before = True  # the one whose connection dropped may have been applied
                try:  # sent again: conditional on our node, which only we delete
                    self._call(node.session, node.release_request(), name, "release")
                except NoNodeError:
                    pass
                else:
                    self._forget_held(key, node)
                    return Released.RELEASED
            else:
                self._forget_held(key, node)
                return Released.RELEASED
            self._forget_held(key, node)
            session = node.session
        else:
            session = self._some_session(name)
        children = self._children(session, directory, name, again=True)
        own = find_own(children, token)
        if own is not None:  # a node of ours we had lost track of (a create whose answer never came)
            try:
                self._again(session, partial(session.client.delete_async, f"{directory}/{child_name(own)}"),
                                  name, "release")
            except NoNodeError:
                pass
            return Released.RELEASED
        # Gone: by an earlier sending of this release whose answer never came, or lost (`gone`).
        return gone(sent_before, bool(queue(children)))

    def _forget_held(self, key: tuple[str, str], node: Node) -> None:
        with self._lock:
            if self._held.get(key) is node:
                del self._held[key]

    def extend(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        """Restart the TTL of our node; past its session's timeout (or far below it), move it first (`_move`). Raises
        ValueError (nothing sent) for a TTL the server keeps no session for."""
        self._forked()
        node = self._held.get((name, token))
        if node is not None and not self._keeps(node, ttl_ms, shrink=True):
            answer = self._move(name, token, node, ttl_ms, shrink=True)
        else:
            answer = (self.extend_many([(name, token, fence, ttl_ms)]))[0]
        if answer is None:
            raise BackendError(f"extend got no answer from {self.shown}", name=name)
        return answer

    def _keeps(self, node: Node, ms: int, *, shrink: bool = False) -> bool:
        """Whether a renewal of `node` may claim `ms` where it lives now (a move of unknown outcome: not yet).
        `shrink` (a caller's new TTL): and its session does not keep it far longer (`session_too_long`)."""
        negotiated = node.session.negotiated_ms or 0
        return node.moving is None and ttl_fits(ms, negotiated) and not (
            shrink and session_too_long(ms, negotiated, self._server_min_ms))

    def extend_many(self, leases: list[tuple[str, str, int, int]]) -> list[bool | None]:
        """Check that each lease's node still exists, and restart its TTL. Every request goes out before any
        answer is awaited (kazoo pipelines them on each session's connection); a node that must move first
        (`_move`) goes on its own."""
        self._forked()
        sent_at = self._clock()
        requests: list[tuple[int, Node, Any]] = []
        results: list[bool | None] = [False] * len(leases)
        for i, (name, token, _fence, ms) in enumerate(leases):
            node = self._held.get((name, token))
            if node is None:
                continue  # expired by its TTL, released, or never ours
            if not self._keeps(node, ms):
                try:
                    results[i] = self._move(name, token, node, ms)
                except (BackendError, ValueError):
                    results[i] = None
                continue
            if node.session.state is Session.LOST:
                results[i] = renewal_answer(Session.LOST, None)
                continue
            # A write, not a read: it proves the node is still ours, and its write time tells operators when
            # the TTL ends now (`status`).
            requests.append((i, node, node.session.client.set_async(node.path, node.data(ms))))
        for i, node, request in requests:
            name, token, _fence, ms = leases[i]
            try:
                stat = self._call(node.session, request, name, "extend")
            except NoNodeError:
                stat = None
            except BackendError as exc:
                # Sent again on the session's next connection if this one dropped: it rewrites our node's data
                # (its TTL), and its validity still counts from `sent_at`, before the first sending.
                try:
                    if not self._reconnected(node.session, exc):
                        raise
                    stat = self._call(node.session, node.session.client.set_async(node.path, node.data(ms)),
                                            name, "extend")
                except NoNodeError:
                    stat = None
                except BackendError:
                    results[i] = renewal_answer(node.session.state, None)
                    continue
            answer = renewal_answer(node.session.state, stat is not None and int(stat.czxid) == node.czxid)
            results[i] = self._renewed((name, token), node, answer, ms, sent_at)
        return results

    def _renewed(self, key: tuple[str, str], node: Node, answer: bool | None, ms: int, sent_at: float) -> bool | None:
        """A renewal's (or a move's) answer: restart the node's TTL from `sent_at`, or forget a node that is gone."""
        with self._lock:
            if self._held.get(key) is not node:
                return False  # the TTL ran out meanwhile and the node was deleted
            if answer:
                node.expires = Deadline.after(ms / 1000.0, sent_at)
            elif answer is False:
                del self._held[key]
        return answer

    def _move(self, name: str, token: str, node: Node, ms: int, *, shrink: bool = False) -> bool | None:
        """Extend past the session the node lives in (or far below it: `session_too_long`): re-create it, same name (its
        place in the queue) and same fence, in the session for `ms`, deleting the old one in the same transaction. An
        ephemeral node cannot change sessions, and its session's timeout bounds what a lease may claim. A move whose
        answer never came (`node.moving`) is settled first: the node is looked up, and its session adopted."""
        key = (name, token)
        if node.moving is not None and not self._settle(name, key, node):
            return False
        if self._keeps(node, ms, shrink=shrink):  # settled where it can keep `ms`: a plain renewal
            return (self.extend_many([(name, token, node.fence, ms)]))[0]
        session = self._session_for(ms, name)  # a TTL no session keeps: ValueError, nothing sent
        if not session.connected:
            raise BackendError(f"the session with {self.shown} is {session.state.value}: not moving the lock's "
                               "node now", name=name) from SessionFault(session)
        sent_at = self._clock()
        node.moving = session  # from here on the node may be in either session, until an answer says which
        try:
            # The re-created node's czxid is new: it carries the fence it was granted (`status`, a release).
            committed = self._call(session, session.move_request(node.path, encode_lease(ms, node.fence)),
                                         name, "extend")
        except NoNodeError:
            node.moving = None
            return self._renewed(key, node, False, ms, sent_at)  # gone (expired, or removed): lost
        with self._lock:
            node.session, node.czxid, node.moving = session, int(committed[2].czxid), None
        return self._renewed(key, node, True, ms, sent_at)

    def _settle(self, name: str, key: tuple[str, str], node: Node) -> bool:
        """Which session our node lives in after a move of unknown outcome: the one it moved to (adopted), the one
        it was in, or none (False: it is gone, or is not ours)."""
        target = node.moving
        assert target is not None
        stat = self._call(target, target.client.exists_async(node.path), name, "extend")
        owner = None if stat is None else int(stat.ephemeralOwner)
        with self._lock:
            node.moving = None
            if owner is not None and owner == target.session_id:
                node.session, node.czxid = target, int(stat.czxid)
                return True
            if owner is not None and owner == node.session.session_id and int(stat.czxid) == node.czxid:
                return True
        self._renewed(key, node, False, 0, 0.0)
        return False

    # -- operators ----------------------------------------------------------------------------------------

    def status(self, name: str) -> LockStatus:
        """The head of the queue holds the lock: its fence, and when its TTL ends by its last write (server
        wall clock against ours). A free lock shows the fence of its last holder to go (released or expired
        through fencelock; a holder whose session expired leaves no record)."""
        self._forked()
        session = self._some_session(name)
        directory = lock_path(self._root, name)
        for _ in range(3):
            line = queue(self._children(session, directory, name, again=True))
            if not line:
                return LockStatus(name, False, self._last_fence(session, directory, name), None, 0)
            found = self._get(session, f"{directory}/{child_name(line[0])}", name)
            if found is not None:
                data, stat = found
                ttl, fence = decode_lease(data)
                remaining = lease_remaining(ttl, int(stat.mtime), time.time() * 1000.0)
                return LockStatus(name, True, fence or int(stat.czxid), remaining, len(line) - 1)
        # The queue moved under us three times in a row: report what the last look showed.
        return LockStatus(name, True, None, None, len(line) - 1)

    def _get(self, session: ZKSession, path: str, name: str) -> tuple[bytes, Any] | None:
        try:
            data, stat = self._again(session, partial(session.client.get_async, path), name, "reading a node")
        except NoNodeError:
            return None
        return data, stat

    def _last_fence(self, session: ZKSession, directory: str, name: str) -> int | None:
        found = self._get(session, directory, name)
        return None if found is None else decode_number(found[0])

    def scan(self, pattern: str) -> list[LockStatus]:
        """Every held lock whose name matches: the queues of `SCAN_BATCH` names are listed at once (kazoo pipelines
        the requests on the session's connection), then each non-empty one is read as `status` reads it."""
        session = self._some_session(None)
        names = sorted(decode_name(child) for child in self._children(session, self._root, None, again=True))
        matching = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        busy = []
        for start in range(0, len(matching), SCAN_BATCH):
            batch = matching[start:start + SCAN_BATCH]
            listings = [session.client.get_children_async(lock_path(self._root, name)) for name in batch]
            for name, listing in zip(batch, listings, strict=True):
                try:
                    children = self._call(session, listing, name, "listing")
                except NoNodeError:
                    continue
                except BackendError as exc:  # its connection dropped: the rest of the batch is asked again
                    if not self._reconnected(session, exc):
                        raise
                    children = self._children(session, lock_path(self._root, name), name, again=True)
                if queue(children):
                    busy.append(name)
        found = []
        for name in busy:
            status = self.status(name)
            if status.held:
                found.append(status)
        return found

    def force_release(self, name: str) -> LockStatus:
        """Delete the head of the queue, whoever it is (its fence stays on the lock's node); the next waiter
        takes the lock. The holder is told at its next renewal."""
        self._forked()
        session = self._some_session(name)
        directory = lock_path(self._root, name)
        line = queue(self._children(session, directory, name, again=True))
        if not line:
            return LockStatus(name, False, self._last_fence(session, directory, name), None, 0)
        head = Node(session, directory, line[0], 0)
        found = self._get(session, head.path, name)
        if found is None:
            return LockStatus(name, False, None, None, len(line) - 1)
        data, stat = found
        ttl, fence = decode_lease(data)
        head.czxid = int(stat.czxid)
        head.fence = fence or head.czxid  # the fence it was granted (a moved node carries it)
        try:
            self._call(session, head.release_request(), name, "force-release")
        except NoNodeError:
            return LockStatus(name, False, None, None, len(line) - 1)
        remaining = lease_remaining(ttl, int(stat.mtime), time.time() * 1000.0)
        return LockStatus(name, True, head.fence, remaining, len(line) - 1)

    # -- closing ------------------------------------------------------------------------------------------

    def close(self) -> None:
        """End every session: the server deletes the nodes they hold at once."""
        self._forked()  # a forked child ends only the sessions it made itself
        with self._lock:
            self._closed = True
            sessions = {id(s): s for s in self._sessions.values()}.values()
            self._sessions.clear()
        self._expiry.close()
        for session in sessions:
            # Closed in the same thread once stopped, even if we stop waiting for it first (a stalled server):
            # the client's sockets are never left to the garbage collector.
            blocking(partial(stop, session.client), self._timeout + 1.0)
