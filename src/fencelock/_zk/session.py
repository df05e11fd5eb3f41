"""One ZooKeeper session per session timeout: a kazoo client, its state, and the nodes it must still delete.

Shared by both front ends (kazoo runs on threads of its own; nothing here awaits). The two private kazoo hooks it
uses, and why: docs/design/zookeeper.md.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

from .._errors import MissingExtra
from .._logic.timing import lease_clock
from .rules import (
    Session,
    child_name,
    encode_number,
    handshake_limit,
    may_return,
    queue,
    reconnect_every,
    reconnect_wait,
)
from .url import ZooKeeperTarget

try:
    from kazoo.client import KazooClient, KazooState
    from kazoo.exceptions import KazooException, NoNodeError, RolledBackError
    from kazoo.handlers.threading import SequentialThreadingHandler
    from kazoo.retry import KazooRetry
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingExtra("zookeeper:// URLs need kazoo, which the zookeeper extra installs: "
                       "pip install 'fencelock[zookeeper]'") from exc

CLIENT_ERRORS = (KazooException, TimeoutError)
"""Everything kazoo raises for a server or network fault, and our bridge's own timeout."""

_STATES = {KazooState.CONNECTED: Session.CONNECTED, KazooState.SUSPENDED: Session.SUSPENDED,
           KazooState.LOST: Session.LOST}


class SessionFault(Exception):
    """A request failed, or was not sent, because its session had no connection (suspended, or expired and being
    replaced): the cause of the `BackendError` raised for it, itself caused by kazoo's error if there was one.
    `session` says how long the fault is worth waiting out (`ZKSession.may_return`); `dropped`: the request's
    connection dropped under it (kazoo's ConnectionLoss) while its session may live on, so a request that may be
    sent twice can go again once the session is connected again (`ZKSession.live`)."""

    def __init__(self, session: ZKSession, *, dropped: bool = False) -> None:
        super().__init__(f"the session is {session.state.value}")
        self.session = session
        self.dropped = dropped


def nothing() -> None:
    pass


def stop(client: Any) -> None:
    """Stop a kazoo client and close it, in this thread."""
    try:
        client.stop()
    finally:
        client.close()


class ZKSession:
    """One ZooKeeper session (one kazoo client, one connection) for leases of one session timeout."""

    def __init__(self, target: ZooKeeperTarget, requested_ms: int) -> None:
        self.requested_ms = requested_ms
        self.negotiated_ms: int | None = None
        self.session_id: int | None = None  # the server's id (its nodes' ephemeralOwner), from the last handshake
        self.state = Session.LOST
        self.down_since: float | None = None  # lease_clock() when its connection last dropped (None: up)
        self.silent = False  # its last connection was dropped by us: a request got no answer (`unanswered`)
        self.ready = threading.Event()  # set once a connection has negotiated its timeout
        self.abandoned: set[tuple[str, str]] = set()  # (lock path, token): nodes to delete when we can
        # Each member gets its share of the URL's timeout to connect and answer (`handshake_limit`).
        limit = handshake_limit(target.timeout, len(target.hosts))
        self.client = KazooClient(hosts=target.hosts_string, timeout=requested_ms / 1000.0,
                                  handler=_Handler(limit),
                                  connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=2,
                                                              max_delay=reconnect_every(target.timeout)))
        watch_handshakes(self.client, limit, self._negotiated)
        self.client.add_listener(self._changed)
        self.client.start_async()

    def _negotiated(self, timeout_ms: int, session_id: int | None) -> None:
        self.negotiated_ms = timeout_ms
        self.session_id = session_id  # a session that expired and was replaced has a new id
        self.ready.set()

    def _changed(self, state: Any) -> None:
        """kazoo's state listener (its connection thread): must not block. A connection that comes up deletes what
        was abandoned while the server could not be reached."""
        self.state = _STATES.get(state, Session.SUSPENDED)
        if self.state is Session.CONNECTED:
            self.down_since = None
            self.silent = False
            for directory, token in list(self.abandoned):
                self._sweep(directory, token)
        elif self.down_since is None and self.ready.is_set():
            self.down_since = lease_clock()

    @property
    def connected(self) -> bool:
        return self.state is Session.CONNECTED and self.ready.is_set()

    @property
    def live(self) -> threading.Event:
        """Set while kazoo has a connection for this session (kazoo's own `_live` flag). kazoo clears it before it
        fails the requests of a connection that dropped, and sets it before its state listeners (`state`) hear of
        a new one, so a request that failed with the drop can wait on it, and then be sent on the new connection."""
        live: threading.Event = self.client._live
        return live

    def may_return(self) -> bool:
        """Whether a fault on this session is worth waiting out (`fencelock._zk.rules.may_return`)."""
        return may_return(self.connected, self.down_since, lease_clock(), self.negotiated_ms or 0)

    def reconnect_wait(self, timeout: float, *, met_silence: bool) -> float:
        """Seconds an attempt may wait for this session's connection to come back (`rules.reconnect_wait`);
        `met_silence`: an earlier attempt of the same call had a request go unanswered here."""
        return reconnect_wait(timeout, self.down_since, lease_clock(), self.negotiated_ms or 0,
                              silent=self.silent and met_silence)

    def unanswered(self) -> None:
        """A request got no answer within the URL's timeout: drop the connection, so that kazoo moves the session
        to another member (`drop_connection`). While kazoo is already reconnecting, there is nothing to drop."""
        if self.state is Session.CONNECTED:
            self.silent = True
            drop_connection(self.client)

    # -- deleting nodes, now or after a reconnect ---------------------------------------------------------

    def release_request(self, path: str, directory: str, fence: int) -> Committed:
        """Delete a held node and leave its fence on the lock's node, in one transaction (one round trip)."""
        transaction = self.client.transaction()
        transaction.delete(path)
        transaction.set_data(directory, encode_number(fence))
        return Committed(transaction.commit_async())

    def move_request(self, path: str, data: bytes) -> Committed:
        """Re-create the node at `path`, whichever session holds it now, as an ephemeral node of this session, with
        `data`, in one transaction: the delete and the create happen together or not at all (a NoNodeError if the
        node is gone). Its answer is the new node's stat (`value[2]`, from the transaction's last step)."""
        transaction = self.client.transaction()
        transaction.delete(path)
        transaction.create(path, data, ephemeral=True)
        transaction.set_data(path, data)
        return Committed(transaction.commit_async())

    def delete_known(self, path: str, directory: str, token: str, then: Callable[[], None] = nothing,
                     fence: int | None = None) -> None:
        """Delete a node whose path we know (one request, from kazoo's callbacks); if the server cannot be
        reached, it is swept after the next reconnect. `then` runs once the server confirmed. With a `fence`, a
        held node's fence goes to its lock's node in the same transaction (what `status` shows for a free lock)."""

        def deleted(outcome: Any) -> None:
            if outcome.successful() or isinstance(outcome.exception, NoNodeError):
                then()
            else:
                self.abandon(directory, token, then)

        if fence is not None:
            self.release_request(path, directory, fence).rawlink(deleted)
        else:
            self.client.delete_async(path).rawlink(deleted)

    def abandon(self, directory: str, token: str, then: Callable[[], None] = nothing) -> None:
        """Delete every node of `token` in `directory`: now, or after every reconnect until the server confirms."""
        self.abandoned.add((directory, token))
        self._sweep(directory, token, then)

    def _sweep(self, directory: str, token: str, then: Callable[[], None] = nothing) -> None:
        """Delete every node of `token` in `directory`, from kazoo's callbacks (no waiting here); `then` runs once
        the server confirmed. Until then the entry stays in `abandoned`, and every reconnect tries again. A create
        still in flight was sent before this listing, on the same connection, so the listing sees its node."""

        def finished() -> None:
            self.abandoned.discard((directory, token))
            then()

        def listed(result: Any) -> None:
            if not result.successful():
                if isinstance(result.exception, NoNodeError):
                    finished()
                return
            own = [child for child in queue(result.value) if child.token == token]
            if not own:
                finished()
                return
            left = [len(own)]
            lock = threading.Lock()

            def deleted(outcome: Any) -> None:
                if outcome.successful() or isinstance(outcome.exception, NoNodeError):
                    with lock:
                        left[0] -= 1
                        if left[0] == 0:
                            finished()

            for child in own:
                self.client.delete_async(f"{directory}/{child_name(child)}").rawlink(deleted)

        self.client.get_children_async(directory).rawlink(listed)


# -- kazoo's private hooks ----------------------------------------------------------------------------------------


def drop_connection(client: Any) -> None:
    """Make kazoo give up its connection and reconnect, to the next member of the ensemble, in the same session.

    Shutting the socket down wakes kazoo's connection thread, which reads the end of the stream, drops the
    connection and reconnects; requests in flight fail with ConnectionLoss. `_connection._socket` is kazoo's.
    """
    sock = getattr(getattr(client, "_connection", None), "_socket", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed: kazoo is reconnecting anyway


def watch_handshakes(client: Any, limit: float, seen: Callable[[int, int | None], None]) -> None:
    """Give up a connection whose handshake takes longer than `limit` seconds, and learn each connection's
    negotiated session timeout, which kazoo does not expose, and its session's id.

    kazoo waits for a handshake's answer for the whole session timeout; a server that accepts and never answers
    (one starting up, or frozen) would keep the session away from every member for that long. Its connection
    handler's `_connect` does the handshake and returns its read timeout, 2/3 of the negotiated session timeout.
    """
    connection = client._connection
    original = connection._connect

    def connect(host: Any, hostip: Any, port: Any) -> Any:
        timer = threading.Timer(limit, drop_connection, (client,))
        timer.daemon = True
        timer.start()
        try:
            read_timeout, connect_timeout = original(host, hostip, port)
        finally:
            timer.cancel()
        client_id = client.client_id  # the handshake made the client live: its session's id is known
        seen(round(read_timeout * 3 / 2), int(client_id[0]) if client_id else None)
        return read_timeout, connect_timeout

    connection._connect = connect


class _Handler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler, with TCP connects bounded by `limit` seconds rather than the session timeout."""

    def __init__(self, limit: float) -> None:
        super().__init__()
        self._limit = limit

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["timeout"] = min(kwargs.get("timeout", self._limit), self._limit)
        return super().create_connection(*args, **kwargs)


class Committed:
    """A committed transaction's `IAsyncResult`, as one request: it fails with the first operation's error.

    kazoo reports a failed transaction as a list whose failed operation holds its exception (the others a
    RolledBackError); every other request fails with the exception itself. This makes the two alike.
    """

    def __init__(self, result: Any) -> None:
        self._result = result
        self._callbacks: dict[Callable[[Any], None], Callable[[Any], None]] = {}

    def _failure(self) -> BaseException | None:
        if not self._result.successful():
            exception: BaseException | None = self._result.exception
            return exception
        for value in self._result.value:
            if isinstance(value, Exception) and not isinstance(value, RolledBackError):
                return value
        return None

    def successful(self) -> bool:
        return self._result.successful() and self._failure() is None

    @property
    def exception(self) -> BaseException | None:
        return self._failure() if self._result.ready() else None

    @property
    def value(self) -> Any:
        return self._result.value

    def ready(self) -> bool:
        return bool(self._result.ready())

    def wait(self, timeout: float | None = None) -> bool:
        return bool(self._result.wait(timeout))

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        value = self._result.get(block, timeout)
        failure = self._failure()
        if failure is not None:
            raise failure
        return value

    def rawlink(self, callback: Callable[[Any], None]) -> None:
        def relay(_: Any) -> None:
            callback(self)

        self._callbacks[callback] = relay
        self._result.rawlink(relay)

    def unlink(self, callback: Callable[[Any], None]) -> None:
        relay = self._callbacks.pop(callback, None)
        if relay is not None:
            self._result.unlink(relay)
