"""One script request to one server, with no I/O: `ScriptRequest`, its bytes (`encode`, `packed`; NOSCRIPT's resend
is `encode(reload=True)`), how its reply is read and what it means (`reading`, `outcome`, `WaitRefused`,
`server_error`), and when it may go again (`may_resend`, `reconnect`) and what its second reply means (`Resent`).

A connection that closes under a request, with no byte of the reply (`Closed`), leaves the request's fate unknown:
it goes again once, on a new connection, if running it twice does what running it once does (`RESENDABLE`), or if
it is a release, whose second answer "the key is gone" or "another's" is then marked as maybe our own first
sending's doing (`Resent`, read by the lease's rule for an unsure release). Any other request reports the error,
and its caller keeps what it holds. Used by both front ends' transport (`_transport.py`, generated) and the sync
select loop (`_sync/_multiplex.py`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import redis.exceptions
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._errors import never_sent
from .._logic.outcomes import Released
from . import resp


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


# -- when a request may go again, and what its second reply means -----------------------------------------------------

RESENDABLE = frozenset({"acquire", "fair_acquire", "fair_leave", "extend", "extend_many", "status",
                        "redlock_acquire", "redlock_extend", "redlock_extend_many"})
"""Scripts that, sent twice with the same arguments, do what they do once (see each script's header): an acquire
finds its own grant (and resets its TTL), an extend resets the TTL again, status reads. Not a release (the second
would find the key gone, and say "expired" of a lock it released) nor a forced one."""


RESENT_RELEASES = frozenset({"release", "redlock_release"})
"""Releases also go again once after `Closed`, on a new connection: the second sending's integer reply is a
`Resent`, so that "the key is gone" or "another's" is read as "our first sending may have deleted it"
(`Released.UNSURE`)."""


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


def not_sent(error: BaseException) -> bool:
    """A request's error that says it never reached the server: not written (`Unwritten`, `Held`), or marked
    `unsent` by the transport (its connection was never made)."""
    return isinstance(error, Unwritten) or never_sent(error)


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


def reconnect(error: BaseException, fresh: bool) -> bool:
    """Connecting failed with a network error (the server closed the new connection during its handshake, or
    refused it): the request was never sent, so it may try once more on another new connection. A timeout (not a
    ConnectionError in redis-py) is not retried, the server may be stalled; nor is a second failure."""
    return not fresh and isinstance(error, RedisConnectionError)


_RELEASE_ANSWERS = {1: Released.RELEASED, 0: Released.EXPIRED, -1: Released.TAKEN}


def release_answer(code: Any) -> Released:
    """A single server's release reply (1, 0, -1) as its meaning; "gone" or "another's" after a second sending is
    UNSURE (the first may have deleted our key, and a waiter taken the lock since)."""
    answer = _RELEASE_ANSWERS[int(code)]
    return Released.UNSURE if answer is not Released.RELEASED and isinstance(code, Resent) else answer


def reply_of(request: ScriptRequest, reply: Any) -> Any:
    """The reply as the caller sees it: a release's second sending's integer answer marked `Resent`."""
    return resent(request.lua, reply) if request.resent else reply


def resent(lua: Any, reply: Any) -> Any:
    """The reply of `lua`'s second sending: a release's integer answer marked `Resent`."""
    return Resent(reply) if lua.name in RESENT_RELEASES and type(reply) is int else reply
