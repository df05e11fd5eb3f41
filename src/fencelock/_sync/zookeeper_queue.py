# Generated from _async/zookeeper_queue.py by scripts/unasync.py: do not edit, edit that file instead.
"""The ZooKeeper backend's queue: an acquisition joins a lock's queue (an ephemeral sequential node), waits behind
the node ahead, is granted at the head, or leaves; a held node whose TTL ran out unextended is deleted."""

from __future__ import annotations

from .._errors import BackendError, MissingExtra
from .._logic.outcomes import Attempt
from .._logic.timing import Clock, Deadline, lease_clock
from .._zk.nodes import Expiry, Node
from .._zk.rules import (
    Position,
    child_name,
    encode_lease,
    find_own,
    lock_path,
    node_prefix,
    position,
)
from .._zk.session import SessionFault, ZKSession
from .._zk.url import ZooKeeperTarget
from ._concurrency import unless_given_up
from ._kazoo import Wakeup, wait_thread_event
from .zookeeper_requests import ZooKeeperRequests

try:
    from kazoo.exceptions import NodeExistsError, NoNodeError
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingExtra("zookeeper:// URLs need kazoo, which the zookeeper extra installs: "
                       "pip install 'fencelock[zookeeper]'") from exc

BLOCK_CAP = 2.0
"""Seconds a waiter waits for its predecessor's watch before it looks at the queue again. Watches are reliable
on a live session; this only bounds the wait after one was dropped with a connection."""


class ZooKeeperQueue(ZooKeeperRequests):
    """Joining, waiting in and leaving a lock's queue; `ZooKeeperBackend` releases and extends what it grants."""

    def __init__(self, target: ZooKeeperTarget, *, prefix: str, clock: Clock = lease_clock) -> None:
        super().__init__(target, prefix=prefix, clock=clock)
        self.block_cap = BLOCK_CAP
        self.supports_fair = True   # every waiter is served in arrival order, fair=True or not
        self.always_queues = True
        self.close_ends_leases = True  # closing a session deletes its nodes: a held lease is lost at close()
        self._queued: dict[tuple[str, str], Node] = {}   # waiting, by (name, token)
        self._held: dict[tuple[str, str], Node] = {}     # granted, by (name, token)
        self._sent: set[tuple[str, str]] = set()          # a create went out, no answer yet: a retry looks first
        self._unanswered: set[tuple[str, str]] = set()    # acquires that met a request unanswered (`reconnect_wait`)
        self._directories: set[str] = set()               # lock paths known to exist
        self._root_made = False                           # the root path exists (made or found)
        self._expiry = Expiry(self._expire, self._clock)

    def _forget_parent(self) -> None:
        self._queued, self._held, self._sent, self._unanswered = {}, {}, set(), set()
        self._expiry = Expiry(self._expire, self._clock)

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
