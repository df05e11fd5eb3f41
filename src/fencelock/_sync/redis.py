# Generated from _async/redis.py by scripts/unasync.py: do not edit, edit that file instead.
"""The Redis backend (single node, or Redis Cluster): it carries the scripts' bytes and nothing else.

Every decision (deadlines, validity, what an answer means) is made in `fencelock._logic`; every redis-py error is
turned into `BackendError` here, at this one boundary (with `redis_commands.py`, the commands Redlock shares). The
watchdog's batched renewals are its base's, `RedisRenewal` (`redis_renewal.py`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from redis import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from .._errors import BackendError, NotDurable, unsent
from .._logic.outcomes import Attempt, Released
from .._logic.status import LockStatus, NodeView, single_status
from .._redis.durability import Durability, Unsupported
from .._redis.fences import DEFAULT_FENCE_RETENTION, fence_keep_ms
from .._redis.keys import PREFIX, fair_keys, redis_keys
from .._redis.request import (
    Confirmed,
    WaitRefused,
    closed_under,
    goes_again,
    not_sent,
    release_answer,
    resent,
    set_up_failed,
)
from .._redis.resp import utf8
from .._scripts import (
    ACQUIRE,
    EVICTION,
    EXTEND,
    FAIR_ACQUIRE,
    FAIR_LEAVE,
    FORCE_RELEASE,
    RELEASE,
    STATUS,
    Lua,
)
from ._cluster import cluster_node, cluster_refresh, ready_node
from ._concurrency import given_up, in_background, sleep
from ._connection import close_client
from ._transport import Channel, call_script
from .redis_commands import (
    CLIENT_ERRORS,
    MIN_BLOCK,
    SERVER_TIMER,
    AnyRedis,
    backend_error,
    refuses_wait,
    run_script,
    scan_names,
    socket_timeout,
    wait_refused,
    warn_if_evicting,
)
from .redis_renewal import RedisRenewal


class RedisBackend(RedisRenewal):
    """Locks kept in one Redis (or one Redis Cluster), with the scripts in `fencelock/_scripts/`."""

    def __init__(self, client: AnyRedis, *, owns_client: bool, prefix: str = PREFIX, shown: str = "",
                 fence_retention: float = DEFAULT_FENCE_RETENTION, durability: Durability | None = None) -> None:
        self._client = client
        # Grants and extends confirmed by WAIT / WAITAOF, sent right after the script on its connection (on a
        # Cluster, over dedicated connections to the slot's primary: redis-py's own may differ per command).
        self._durability = durability
        self._probed = durability is None or durability.probe() is None
        self._node_channels: dict[str, Channel] = {}
        self._node_clients: dict[str, Any] = {}  # a Cluster's primaries as plain clients (renewal pipelines)
        self._fence_retention = fence_retention  # seconds a name's fence key outlives its last grant or extend
        self._owns_client = owns_client
        self._prefix = prefix
        self.shown = shown or "redis"
        # One blocking wait must end before the socket timeout would cut it: BLPOP is a command like any other.
        timeout = socket_timeout(client)
        self.block_cap = 30.0 if timeout is None else max(MIN_BLOCK, timeout * 0.75)
        self._cluster = isinstance(client, RedisCluster)
        # One Redis: the scripts go over dedicated connections (as Redlock's do), which skip redis-py's
        # per-command work; a Cluster needs redis-py's routing, so it keeps the client's own commands.
        self._channel = None if self._cluster else Channel(client)
        self.supports_fair = True
        self.always_queues = False  # only fair waiters queue
        # A fair waiter's queue entry outlives its longest wait between two attempts (which refresh it).
        self._entry_ttl_ms = round((2 * self.block_cap + 1.0) * 1000)
        self.renewal_requests = 0  # script calls the watchdog made (for benchmarks)
        self._eviction_checked = False  # (once per client, after its first grant: `_check_eviction`)
        self._closed = False
        self._interrupted = False  # the client is closing: its blocking waits were ended (`interrupt`)

    @property
    def client(self) -> AnyRedis:
        return self._client

    def _run(self, lua: Lua, name: str, keys: list[str], args: list[Any],
                   wake: tuple[str, float] | None = None, confirm: bool = False) -> Any:
        """The script's reply; with `wake` (one Redis only), it first waits on that list (`ScriptRequest.wake`).
        `confirm` (a grant or an extend): with durability on, the reply is a `Confirmed`. After `close` (a lease
        of the closed client released or extended), the connections it made are closed again after it."""
        if not self._closed:
            return self._run_open(lua, name, keys, args, wake, confirm)
        try:
            return self._run_open(lua, name, keys, args, wake, confirm)
        finally:
            self.close()

    def _run_open(self, lua: Lua, name: str, keys: list[str], args: list[Any],
                        wake: tuple[str, float] | None, confirm: bool) -> Any:
        if confirm and self._durability is not None:
            return self._run_confirmed(self._durability, lua, name, keys, args, wake)
        if self._channel is None:
            if given_up():  # (see `_call_script`: the Cluster's own client sends these)
                raise BackendError(f"{lua.name} not sent to {self.shown}: its caller was cancelled", name=name)
            try:
                ready_node(self._client, utf8(keys[:1])[0])
            except CLIENT_ERRORS as exc:
                raise backend_error(exc, f"{lua.name} failed on {self.shown}", name) from exc
            try:
                return run_script(self._client, lua, keys, args, name=name, where=self.shown)
            except BackendError as exc:  # a connection closed under it: again once, where that is safe
                cause = exc.__cause__
                if cause is not None and set_up_failed(cause):  # never sent: any script goes again
                    return run_script(self._client, lua, keys, args, name=name, where=self.shown)
                if not (cause is not None and closed_under(cause) and goes_again(lua)):
                    raise
            return resent(lua, run_script(self._client, lua, keys, args, name=name, where=self.shown))
        reply = call_script(self._channel, lua, keys, args, wake)
        if isinstance(reply, Exception) and not isinstance(reply, WaitRefused):  # (that one: `_unless_refused`)
            error = backend_error(reply, f"{lua.name} failed on {self.shown}", name)
            raise (unsent(error) if not_sent(reply) else error) from reply
        return reply

    def _run_confirmed(self, durability: Durability, lua: Lua, name: str, keys: list[str], args: list[Any],
                             wake: tuple[str, float] | None) -> Confirmed | WaitRefused:
        """The script, then WAIT / WAITAOF in the same write on the same connection: no extra round trip."""
        self._probe(durability, name)
        for attempt in range(2):
            if self._cluster:
                node, source = cluster_node(self._client, utf8(keys[:1])[0])
                channel = self._node_channel(node, source)
            else:
                assert self._channel is not None
                channel = self._channel
            reply = call_script(channel, lua, keys, args, wake, confirm=durability.command)
            if not self._cluster or not isinstance(reply, Exception) or attempt:
                break
            # The slot moved (MOVED, ASK) or its primary is gone: read the layout again, then once more (the
            # scripts sent with a confirmation are all safe to run twice: `RESENDABLE`).
            if isinstance(reply, RedisConnectionError) or (
                    isinstance(reply, ResponseError) and str(reply).startswith(("MOVED", "ASK", "CLUSTERDOWN"))):
                try:
                    cluster_refresh(self._client)
                except CLIENT_ERRORS:
                    break
                wake = None
            else:
                break
        if isinstance(reply, Exception) and not isinstance(reply, WaitRefused):
            raise backend_error(reply, f"{lua.name} failed on {self.shown}", name) from reply
        assert isinstance(reply, (Confirmed, WaitRefused))
        return reply

    def _probe(self, durability: Durability, name: str) -> None:
        """Once per client: ask whether the server can confirm as asked (WAITAOF needs Redis >= 7.2 and an
        append-only file), before the first grant, so that a server that cannot is refused without a lock held."""
        probe = durability.probe()
        if self._probed or probe is None:
            return
        client: Any = self._client
        try:
            if self._cluster:
                client.execute_command(*probe, target_nodes=RedisCluster.PRIMARIES)
            else:
                client.execute_command(*probe)
        except ResponseError as exc:
            raise BackendError(f"{durability.shown} cannot be confirmed by {self.shown}: it needs WAITAOF "
                               f"(Redis >= 7.2) with appendonly yes, and the server answered: {exc}",
                               name=name) from exc
        except CLIENT_ERRORS as exc:
            raise backend_error(exc, f"checking {durability.shown} failed on {self.shown}", name) from exc
        self._probed = True

    def _durable_grant(self, durability: Durability, name: str, token: str, fence: int,
                             confirmation: Any) -> None:
        """A grant counts only once confirmed: otherwise it is given back (compare-and-delete), then refused."""
        try:
            if durability.confirmed(confirmation):
                return
        except Unsupported as exc:
            given = self._give_back(name, token, fence)
            raise BackendError(f"{exc}; the grant on {self.shown} was {given}", name=name) from None
        given = self._give_back(name, token, fence)
        got = durability.got(confirmation)
        raise NotDurable(f"the grant on {self.shown} was not confirmed within {durability.timeout} s "
                         f"({durability.shown}: {durability.wanted()} wanted, {got}); it was {given}",
                         name=name, wanted=durability.wanted(), got=got)

    def _give_back(self, name: str, token: str, fence: int) -> str:
        try:
            self.release(name, token, fence)
        except BackendError as exc:
            return f"not given back ({exc}): it expires with its TTL"
        return "given back"

    def retry_after(self, exc: BackendError, failures: int) -> float | None:
        """A refused or reset connection may succeed at once on a fresh one, once; a timeout is not retried."""
        return 0.0 if failures == 1 and isinstance(exc.__cause__, RedisConnectionError) else None

    def try_acquire(self, name: str, token: str, ttl_ms: int, wait: float = 0.0,
                          fair: bool = False) -> Attempt:
        """One attempt; with `wait` > 0, first block up to `wait` seconds until a release wakes us.

        The wait and the attempt travel in one write: BLPOP on the wake list, then the acquire script, which
        the server runs the moment BLPOP returns. A woken waiter needs no second round trip, so the lock passes
        from holder to waiter in about one server hop (on a Cluster too: `_wait_on_node`). `fair`: the waiter
        queues, blocks on its own wake list, and only the head of the queue may take a free lock.
        """
        keys = redis_keys(name, self._prefix)
        if fair:
            deadlines, wake_prefix = fair_keys(name, self._prefix)
            lua, script_keys = FAIR_ACQUIRE, [keys.lock, keys.fence, keys.queue, deadlines]
            args: list[Any] = [token, ttl_ms, self._entry_ttl_ms, fence_keep_ms(self._fence_retention, ttl_ms)]
            wake = wake_prefix + token
        else:
            lua, script_keys, wake = ACQUIRE, [keys.lock, keys.fence, keys.waiters], keys.wake
            args = [token, ttl_ms, fence_keep_ms(self._fence_retention, ttl_ms)]
        server_wait = wait - SERVER_TIMER
        if server_wait >= MIN_BLOCK and self._cluster and self._durability is None:
            reply = self._wait_on_node(lua, name, script_keys, args, (wake, server_wait))
        elif server_wait >= MIN_BLOCK:
            reply = self._unless_refused(
                self._run(lua, name, script_keys, args, wake=(wake, server_wait), confirm=True), name)
        else:
            if wait > 0.0:
                # Too short for the server's timer to end a BLPOP on time: sleep through it here.
                sleep(wait)
            reply = self._run(lua, name, script_keys, args, confirm=True)
        confirmation = None
        if isinstance(reply, Confirmed):
            reply, confirmation = reply
        granted, value = reply[0], reply[1]
        if granted == 1:
            if self._durability is not None:
                self._durable_grant(self._durability, name, token, int(value), confirmation)
            if not self._eviction_checked:
                self._eviction_checked = True
                generation = 0 if self._channel is None else self._channel.generation
                in_background(partial(self._check_eviction, name, keys.lock, generation))
            return Attempt(True, int(value), None)
        return Attempt(False, 0, value / 1000.0 if value >= 0 else None)

    def _node_channel(self, node: str, source: Any) -> Channel:
        channel = self._node_channels.get(node)
        if channel is None:
            channel = self._node_channels[node] = Channel(source)
        return channel

    def _wait_on_node(self, lua: Lua, name: str, keys: list[str], args: list[Any],
                            wake: tuple[str, float]) -> Any:
        """A Cluster waiter's attempt: BLPOP and the script in one write to the slot's primary, over a connection
        of fencelock's own to it (redis-py sends no script in a cluster pipeline), as on one Redis. If the slot
        moved or the cluster is changing (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, a primary gone), the layout is read
        again and the attempt goes alone through redis-py's routing, which follows a moving slot; the next
        attempt waits again."""
        try:
            node, source = cluster_node(self._client, utf8(keys[:1])[0])
        except CLIENT_ERRORS:
            return self._run(lua, name, keys, args)
        reply = call_script(self._node_channel(node, source), lua, keys, args, wake)
        if isinstance(reply, WaitRefused):
            return self._unless_refused(reply, name)
        if not isinstance(reply, Exception):
            return reply
        moved = isinstance(reply, ResponseError) and not refuses_wait(reply)
        if self._interrupted or not (moved or isinstance(reply, RedisConnectionError)):
            raise backend_error(reply, f"{lua.name} failed on {self.shown}", name) from reply
        try:
            cluster_refresh(self._client)
        except CLIENT_ERRORS:
            pass
        return self._run(lua, name, keys, args)

    def interrupt(self) -> None:
        """The client is closing: end its blocking waits in flight now (their attempts return at once, with the
        grant the attempt got if any), and send no waiter's attempt again."""
        self._interrupted = True
        for channel in [self._channel, *self._node_channels.values()]:
            if channel is not None:
                channel.interrupt()

    def _unless_refused(self, reply: Any, name: str) -> Any:
        """The reply of an attempt sent after its BLPOP; if the server refused that BLPOP (`WaitRefused`), the
        grant the attempt got all the same (the lock was free), or else `BackendError` with the server's message:
        waiting cannot work there, and trying again at once would only spin."""
        if not isinstance(reply, WaitRefused):
            return reply
        attempt = reply.reply.reply if isinstance(reply.reply, Confirmed) else reply.reply
        if isinstance(attempt, list) and attempt and attempt[0] == 1:
            return reply.reply
        raise wait_refused(reply.error, self.shown, name)

    def release(self, name: str, token: str, fence: int) -> Released:
        """Delete our key; the script also wakes the next waiter (the fair queue's head on its own list)."""
        keys = redis_keys(name, self._prefix)
        _, wake_prefix = fair_keys(name, self._prefix)
        code = self._run(RELEASE, name, [*keys, wake_prefix], [token, fence, self._entry_ttl_ms])
        return release_answer(code)

    def leave(self, name: str, token: str) -> None:
        """A fair waiter gives up: out of the queue now, and the new head is woken if the lock is free."""
        keys = redis_keys(name, self._prefix)
        deadlines, wake_prefix = fair_keys(name, self._prefix)
        self._run(FAIR_LEAVE, name, [keys.lock, keys.queue, deadlines, wake_prefix], [token, self._entry_ttl_ms])

    def extend(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        """True: extended; False: not ours. With durability on, an extend not confirmed raises `NotDurable` (or
        `BackendError`), as an unanswered one does: the lease then claims no validity beyond what it had."""
        keys = redis_keys(name, self._prefix)
        keep = fence_keep_ms(self._fence_retention, ttl_ms)
        reply = self._run(EXTEND, name, [keys.lock, keys.fence], [token, ttl_ms, keep], confirm=True)
        if not isinstance(reply, Confirmed):
            return int(reply) == 1
        if int(reply.reply) != 1:
            return False
        self._durable_extend(name, reply.confirmation)
        return True

    def _durable_extend(self, name: str, confirmation: Any) -> None:
        durability = self._durability
        assert durability is not None
        try:
            if durability.confirmed(confirmation):
                return
        except Unsupported as exc:
            raise BackendError(f"{exc}; the extend on {self.shown} is not counted", name=name) from None
        got = durability.got(confirmation)
        raise NotDurable(f"the extend on {self.shown} was not confirmed within {durability.timeout} s "
                         f"({durability.shown}: {durability.wanted()} wanted, {got}); the lease keeps the validity "
                         "it had", name=name, wanted=durability.wanted(), got=got)

    # -- operators (fencelock status / list / release --force) --------------------------------------------------

    def status(self, name: str) -> LockStatus:
        """The lock as the server sees it now: held or free, its fence, TTL left, live fair-queue entries."""
        keys = redis_keys(name, self._prefix)
        deadlines, _ = fair_keys(name, self._prefix)
        reply = self._run(STATUS, name, [keys.lock, keys.fence, deadlines], [])
        return single_status(name, NodeView.decode(reply))

    def scan(self, pattern: str) -> list[LockStatus]:
        """Every held lock whose name matches `pattern` (fnmatch), by SCAN (per primary on a Cluster), by name."""
        names = scan_names(self._client, pattern, self._prefix, where=self.shown, cluster=self._cluster)
        found = []
        for name in sorted(names):
            status = self.status(name)
            if status.held:  # it may have expired since SCAN saw it
                found.append(status)
        return found

    def force_release(self, name: str) -> LockStatus:
        """Remove the lock whoever holds it, waking a waiter (the fair queue's head on its own list, in the same
        script); returns what was removed (held=False: nothing)."""
        keys = redis_keys(name, self._prefix)
        deadlines, wake_prefix = fair_keys(name, self._prefix)
        reply = self._run(FORCE_RELEASE, name, [keys.lock, keys.fence, keys.waiters, keys.wake, keys.queue,
                                                      deadlines, wake_prefix], [self._entry_ttl_ms])
        return single_status(name, NodeView.decode(reply))

    def _check_eviction(self, name: str, key: str, generation: int) -> None:
        """Warn (an "evicting" event) if the server that holds `name` may evict held locks (`eviction_risk`).
        Begun before `close` (`generation`: the channel's when it was started), it makes no connection after it."""
        if self._closed:
            return
        if self._channel is None:
            reply = self._run(EVICTION, name, [key], [])
        elif isinstance(reply := call_script(self._channel, EVICTION, [key], [], generation=generation),
                        Exception):
            return
        warn_if_evicting(reply, name, "redis", self.shown)

    def close(self) -> None:
        self._closed = True
        if self._channel is not None:
            self._channel.close()
        for channel in self._node_channels.values():
            channel.close()
        for node_client in self._node_clients.values():
            close_client(node_client)
        if self._owns_client:
            client: Any = self._client
            close_client(client)
