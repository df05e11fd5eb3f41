# Generated from _async/zookeeper.py by scripts/unasync.py: do not edit, edit that file instead.
"""The ZooKeeper backend: an ephemeral sequential node per acquisition, FIFO, fenced by the node's czxid. Here release,
extend and the operators' calls; `zookeeper_queue` joins and waits, `zookeeper_requests` runs the sessions' requests
(kazoo's, awaited through `_kazoo`: one source for both front ends). How and why: docs/design/zookeeper.md."""

from __future__ import annotations

import fnmatch
import time
from functools import partial
from typing import Any

from .._errors import BackendError, MissingExtra
from .._logic.outcomes import Released, gone
from .._logic.status import LockStatus
from .._logic.timing import Deadline
from .._zk.nodes import Node
from .._zk.rules import (
    Session,
    child_name,
    decode_lease,
    decode_name,
    decode_number,
    encode_lease,
    find_own,
    lease_remaining,
    lock_path,
    queue,
    renewal_answer,
    session_too_long,
    ttl_fits,
)
from .._zk.session import SessionFault, ZKSession, stop
from ._threads import blocking
from .zookeeper_queue import ZooKeeperQueue

try:
    from kazoo.exceptions import NoNodeError
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingExtra("zookeeper:// URLs need kazoo, which the zookeeper extra installs: "
                       "pip install 'fencelock[zookeeper]'") from exc

SCAN_BATCH = 1000
"""Lock names whose queues `list()` asks for at once (one round trip for many idle names, never an unbounded
burst of requests)."""


class ZooKeeperBackend(ZooKeeperQueue):
    """Locks kept as ephemeral sequential nodes in ZooKeeper (docs/design/zookeeper.md)."""

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
