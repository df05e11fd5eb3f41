"""What both front ends' `Channel` (`_transport.py`) share, with no I/O: the settings its connections are made with,
the rule that keeps one caller's requests to one server in order, a request's bytes and what its reply means.

The rule: a request waits for the caller's latest request to that server that is still in flight, at most that
request's own bound (the socket timeout, or its per-server timeout if longer: `track`), and is then sent. If
that earlier request got no answer (none in time, or a network error), the later one is not sent at all
(`NotSent`), so that nothing queued behind a request that failed reaches a stalled server late. A request that
was not sent is never waited for; the one it waited for is. One exception: when that earlier request's
connection was dropped without its reply and the server's id of that connection is known (`CLIENT ID`, asked at
connect), the later request goes on a new connection after `CLIENT KILL ID` of the old one: once the kill is
answered the old request has run or never will (docs/decisions/2026-12-01-order-after-a-lost-reply.md).

A connection taken idle may have been closed by the server meanwhile (its idle timeout, a load balancer's, a
restart): that is not a failure. One found closed before the write (`closed_by_peer`) is dropped, and the request
goes on another. One that closes under a request, with no byte of the reply (`Closed`), leaves the request's fate
unknown: it goes again once, on a new connection, if running it twice does what running it once does
(`RESENDABLE`), or if it is a release, whose second answer "the key is gone" or "another's" is then marked as maybe
our own first sending's doing (`Resent`, read by the lease's rule for an unsure release). Any other request reports the
error, and its caller keeps what it holds.

Written once here and used by both front ends' transport (`_transport.py`, generated) and the sync select loop
(`_sync/_multiplex.py`): `ScriptRequest`, the order rule's decision (`turn`), a request's bytes (`encode`,
`packed`; NOSCRIPT's resend is `encode(reload=True)`), how its reply is read and what it means (`reading`,
`outcome`, `WaitRefused`, `server_error`, `killed`) and when a request may go again (`may_resend`). A request in
flight is an `asyncio.Future` or a `concurrent.futures.Future`; both have the `Finished` methods used here.
"""

from __future__ import annotations

import select
import ssl
import threading
import weakref
from typing import Any, NamedTuple, Protocol, TypeVar

import redis.exceptions
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._logic.outcomes import Released
from . import resp

PATIENCE = 2.0
"""Seconds a request waits for the caller's previous request to the same server when the client has no socket
timeout (with one, it waits that long: the previous request's reply is read within it, or its connection dropped)."""


RESENDABLE = frozenset({"acquire", "fair_acquire", "fair_leave", "extend", "extend_many", "status",
                        "redlock_acquire", "redlock_extend", "redlock_extend_many"})
"""Scripts that, sent twice with the same arguments, do what they do once (see each script's header): an acquire
finds its own grant (and resets its TTL), an extend resets the TTL again, status reads. Not a release (the second
would find the key gone, and say "expired" of a lock it released) nor a forced one."""

RESENT_RELEASES = frozenset({"release", "redlock_release"})
"""Releases also go again once after `Closed`, on a new connection: the second sending's integer reply is a
`Resent`, so that "the key is gone" or "another's" is read as "our first sending may have deleted it"
(`Released.UNSURE`)."""


MAINTENANCE = frozenset({"extend", "extend_many", "release", "redlock_extend", "redlock_extend_many",
                         "redlock_release"})
"""Scripts that keep or end a lease already held: when a server's connections are all busy (`MAX_OPEN`), they get
the next free one before any acquire, wait or read, so that no crowd of acquires makes a held lease miss its
renewal."""


def maintains(lua: Any) -> bool:
    """Whether a request with this script renews or releases a held lease (`MAINTENANCE`)."""
    return lua.name in MAINTENANCE


class Resent(int):
    """The reply of a release's second sending (see `RESENT_RELEASES`)."""


class Closed(RedisConnectionError):
    """The server closed the connection (end of file, or a reset) before a byte of the reply came."""


class Unwritten(RedisConnectionError):
    """Writing the request failed, the connection being closed already: it never reached the server."""


class Held(Unwritten):
    """A request the client kept to itself: not written, for a reason of the client's own (it was still waiting for
    a connection when its round ended, its caller was cancelled, its client is closing). It says nothing about its
    server: a node is never counted as failed for it (issue 14)."""


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


def may_resend(lua: Any, error: BaseException) -> bool:
    """A request that failed this way may go again once, on a new connection: it never reached the server, or
    its connection closed under it and it `goes_again`."""
    return isinstance(error, Unwritten) or (isinstance(error, Closed) and goes_again(lua))


def goes_again(lua: Any) -> bool:
    """A script whose connection closed under it may be sent once more: `RESENDABLE`, or a release (whose second
    reply is then read through `resent`)."""
    return lua.name in RESENDABLE or lua.name in RESENT_RELEASES


_SETUP_FRAMES = frozenset({"connect", "connect_check_health", "on_connect", "on_connect_check_health"})


def set_up_failed(exc: BaseException) -> bool:
    """A redis-py `ConnectionError` raised while its connection was being set up (in its `connect`), before the
    command was written: whatever the command, it never reached the server, so it may go again."""
    if not isinstance(exc, RedisConnectionError) or isinstance(exc, RedisTimeoutError):
        return False
    frame = exc.__traceback__
    while frame is not None:
        code = frame.tb_frame.f_code
        if code.co_name in _SETUP_FRAMES and "redis" in code.co_filename:
            return True
        frame = frame.tb_next
    return False


_UNREACHABLE: tuple[type[BaseException], ...] = tuple(
    kind for kind in (getattr(redis.exceptions, "RedisClusterUnreachableError", None),) if kind is not None)
"""redis-py's error for a Cluster it could not reach (not in every version fencelock supports)."""


def closed_under(exc: BaseException) -> bool:
    """A redis-py Cluster client's error that means a connection was closed under the command (not a timeout):
    a `ConnectionError`, or the layout refresh after one that found every node's new connection closed too."""
    if isinstance(exc, RedisConnectionError):
        return not isinstance(exc, RedisTimeoutError)
    if isinstance(exc, _UNREACHABLE):
        cause = exc.__cause__ or exc.__context__
        return cause is not None and closed_under(cause)
    return False


_RELEASE_ANSWERS = {1: Released.RELEASED, 0: Released.EXPIRED, -1: Released.TAKEN}


def release_answer(code: Any) -> Released:
    """A single server's release reply (1, 0, -1) as its meaning; "gone" or "another's" after a second sending is
    UNSURE (the first may have deleted our key, and a waiter taken the lock since)."""
    answer = _RELEASE_ANSWERS[int(code)]
    return Released.UNSURE if answer is not Released.RELEASED and isinstance(code, Resent) else answer


def reconnect(error: BaseException, fresh: bool) -> bool:
    """Connecting failed with a network error (the server closed the new connection during its handshake, or
    refused it): the request was never sent, so it may try once more on another new connection. A timeout (not a
    ConnectionError in redis-py) is not retried, the server may be stalled; nor is a second failure."""
    return not fresh and isinstance(error, RedisConnectionError)


def reply_of(request: ScriptRequest, reply: Any) -> Any:
    """The reply as the caller sees it: a release's second sending's integer answer marked `Resent`."""
    return resent(request.lua, reply) if request.resent else reply


def resent(lua: Any, reply: Any) -> Any:
    """The reply of `lua`'s second sending: a release's integer answer marked `Resent`."""
    return Resent(reply) if lua.name in RESENT_RELEASES and type(reply) is int else reply


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


def orphan_of(request: tuple[Finished, float]) -> int | None:
    """The server's id of the connection a finished request was dropped with, unanswered (see `orphaned`), or
    None: not known, or the request was answered."""
    future = request[0]
    if future.cancelled():
        return None
    outcome = future.exception() or future.result()
    found = getattr(outcome, "orphan", None)
    if getattr(outcome, "ended", False) or answered(request):
        return None
    return found if isinstance(found, int) else None


def ended(request: tuple[Finished, float]) -> bool:
    """A finished request without an answer whose connection the server has since ended (`end`): it has run
    or never will, so a later request may go."""
    future = request[0]
    return not future.cancelled() and getattr(future.exception() or future.result(), "ended", False) is True


def end(request: tuple[Finished, float]) -> None:
    """The server answered `CLIENT KILL ID` of the connection `request` was dropped with (`orphan_of`)."""
    future = request[0]
    outcome = future.exception() or future.result()
    setattr(outcome, "ended", True)  # noqa: B010 (an exception of any class)


def orphaned(error: BaseException, conn: Any) -> BaseException:
    """`error` ended a request sent on `conn` with no reply read: it carries the server's id of `conn` (None if
    unknown), so a later request knows what to end first (`orphan_of`)."""
    if getattr(error, "orphan", None) is None:
        error.orphan = getattr(conn, "fencelock_id", None)  # type: ignore[attr-defined]
    return error


def kill_command(orphan: int) -> tuple[str, ...]:
    """The command that ends the server's connection `orphan` (and with it any request of it not yet run)."""
    return "CLIENT", "KILL", "ID", str(orphan)


def killed(reply: Any) -> bool:
    """`CLIENT KILL ID`'s reply says the connection is gone (0 or 1 killed), not an error (ACL, unknown command)."""
    return isinstance(reply, int) and not isinstance(reply, bool)


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


class ScriptRequest(NamedTuple):
    """One script call on one server, for `run_scripts`. Requests that share their `keys` and `args` lists
    (the same objects) carry the same command: it is encoded once.

    `wake`: (list key, seconds): the script follows a BLPOP on that list, in the same write, so the server runs
    it the moment the BLPOP returns (a release's push, or the timeout). The BLPOP's own answer is not the
    request's reply: it is read and dropped.

    `confirm`: a command (WAIT, WAITAOF) written right after the script on the same connection; the reply is then
    a `Confirmed` (the script's reply and that command's answer)."""

    channel: Any  # the `Channel` of either front end
    lua: Any  # fencelock._scripts.Lua
    keys: list[str]
    args: list[Any]
    wake: tuple[str, float] | None = None
    confirm: tuple[Any, ...] | None = None
    resent: bool = False  # the second sending (`again`)

    def again(self) -> ScriptRequest:
        """The request to send once more: without its wait (a wake-up it may have taken already; it is tried now)."""
        return self._replace(wake=None, resent=True)


class Orphan(NamedTuple):
    """A connection known only by the server's id for it (one a request was dropped with)."""

    fencelock_id: int


WAIT, SEND, KILL, REFUSE = "wait", "send", "kill", "refuse"


class Turn(NamedTuple):
    """What the order rule says a request does about `before`, the caller's latest request to its server that was
    sent: WAIT for it (still in flight), SEND, KILL the server's connection `orphan` it was dropped with and then
    send on a new connection, or REFUSE (`not_sent`: it got no answer)."""

    action: str
    before: Any = None  # tuple[future, bound]
    orphan: int = 0


_GO = Turn(SEND)


def turn(before: tuple[Any, float] | None) -> Turn:
    """The order rule's decision for a request sent after `before` (the caller's previous request there, if any)."""
    if before is None:
        return _GO
    before = last_sent(before)
    if not before[0].done():
        return Turn(WAIT, before)
    if answered(before) or ended(before):
        return Turn(SEND, before)
    orphan = orphan_of(before)
    return Turn(REFUSE, before) if orphan is None else Turn(KILL, before, orphan)


class Confirmed(NamedTuple):
    """The reply of a script call sent with `confirm`: the script's reply, and the answer of the command that
    followed it on the same connection (WAIT / WAITAOF: `fencelock._redis.durability`)."""

    reply: Any
    confirmation: Any


Packed = dict[tuple[str, int, int, tuple[str, float] | None, tuple[Any, ...] | None], Any]
"""Commands already encoded, by (script, id of keys, id of args, wake): requests that share their key and
argument lists (the same objects) carry the same command, encoded once."""


def encode(conn: Any, request: ScriptRequest, *, reload: bool) -> bytes:
    """The request as bytes (`resp.script_call`), keys and arguments in UTF-8 whatever the connection's encoding
    (`resp.UTF8`); with `confirm`, that command follows the script in the same write (on a reload too)."""
    lua = request.lua
    call = resp.script_call(resp.UTF8, lua.sha, lua.source, request.keys, request.args, reload=reload,
                            wake=request.wake)
    return call if request.confirm is None else call + resp.command(resp.UTF8, request.confirm)


def packed(cache: Packed, conn: Any, request: ScriptRequest) -> bytes:
    """The request's bytes (EVALSHA), encoded once for all the requests that share its key and argument lists."""
    same = request.lua.sha, id(request.keys), id(request.args), request.wake, request.confirm
    command = cache.get(same)
    if command is None:
        command = cache[same] = encode(conn, request, reload=False)
    return command


def confirmed_reply(reply: Any, confirmation: Any) -> Any:
    """The reply of a request sent with `confirm`: the script's error as it is, or a `Confirmed`."""
    return reply if isinstance(reply, Exception) else Confirmed(reply, confirmation)


RELOAD: Any = object()
"""`outcome` of a request answered NOSCRIPT: it goes again as EVAL on the same connection, once."""


class WaitRefused(ResponseError):
    """The server refused a request's BLPOP (an ACL without it, a renamed command, a proxy that does not block):
    `error`. The script written after it ran all the same, at once: `reply` is its reply."""

    def __init__(self, error: ResponseError, reply: Any) -> None:
        super().__init__(str(error))
        self.error = error
        self.reply = reply


class Refused(NamedTuple):
    """What a connection's `read` returns when a reply it was told to skip (a BLPOP's) was an error: that error,
    and what it read after it (as it would have returned it)."""

    error: ResponseError
    replies: Any


def reading(request: ScriptRequest, reloaded: bool) -> tuple[int, int]:
    """How many replies to skip first (its BLPOP's, if sent with `wake` and not yet again as EVAL after
    NOSCRIPT: its answer is dropped, unless it is an error, `Refused`), and how many to read (the script's, and
    its `confirm` command's)."""
    return 0 if request.wake is None or reloaded else 1, 1 if request.confirm is None else 2


def outcome(request: ScriptRequest, replies: Any, reloaded: bool) -> Any:
    """What the replies read as `reading` says mean: the request's reply (`Confirmed`, `Resent`), RELOAD, or a
    `WaitRefused` that carries it when the server answered its BLPOP with an error (`Refused`)."""
    wait = None
    if isinstance(replies, Refused):
        wait, replies = replies
    reply = replies if request.confirm is None else confirmed_reply(replies[0], replies[1])
    if isinstance(reply, NoScriptError) and not reloaded:
        return RELOAD
    reply = reply_of(request, reply)
    return reply if wait is None else WaitRefused(wait, reply)


def server_error(message: str) -> ResponseError:
    """A server's error reply as redis-py's exception (NOSCRIPT: the script must be sent again as EVAL)."""
    return NoScriptError(message) if message.startswith("NOSCRIPT") else ResponseError(message)
