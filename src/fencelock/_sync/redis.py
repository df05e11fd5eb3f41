# Generated from _async/redis.py by scripts/unasync.py: do not edit, edit that file instead.
"""The Redis backend (single node, or Redis Cluster): it carries the scripts' bytes and nothing else.

Every decision (deadlines, validity, what an answer means) is made in `fencelock._logic`; every redis-py error is
turned into `BackendError` here, at this one boundary.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from fnmatch import fnmatchcase
from functools import partial
from typing import Any

from redis import Redis, RedisCluster
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from .._errors import BackendError, NotDurable
from .._events import emit
from .._logic.outcomes import Attempt, Released
from .._logic.status import LockStatus, NodeView, single_status
from .._redis.channel import BLOCKING, CROWDED_PAUSE, PATIENCE
from .._redis.durability import Durability, Unsupported
from .._redis.eviction import eviction_risk
from .._redis.fences import DEFAULT_FENCE_RETENTION, fence_keep_ms
from .._redis.keys import PREFIX, fair_keys, name_of_lock_key, redis_keys, scan_match
from .._redis.request import (
    Confirmed,
    WaitRefused,
    closed_under,
    goes_again,
    release_answer,
    resent,
    set_up_failed,
)
from .._redis.resp import utf8
from .._scripts import (
    ACQUIRE,
    EVICTION,
    EXTEND,
    EXTEND_MANY,
    FAIR_ACQUIRE,
    FAIR_LEAVE,
    FORCE_RELEASE,
    RELEASE,
    STATUS,
    Lua,
)
from ._cluster import cluster_node, cluster_refresh, node_of, node_redis, primary_of, ready_node
from ._concurrency import given_up, in_background, sleep
from ._connection import close_client
from ._fanout import fan_out
from ._transport import Channel, call_script

AnyRedis = Redis | RedisCluster

CLIENT_ERRORS = (RedisError, RedisClusterException)
"""Everything redis-py raises for a server or network fault (cluster errors do not derive from RedisError)."""


MIN_BLOCK = 0.002
"""Seconds. BLPOP rounds its timeout down to milliseconds, and 0 means "block for ever": never ask for less."""

BATCH = 100
"""Leases per renewal script call (as Redisson batches them)."""

SCAN_COUNT = 1000
"""Keys SCAN looks at per call: small steps, so that listing locks never blocks the server (never KEYS)."""

SERVER_TIMER = 0.1
"""Seconds. A server ends a blocking command's timeout only on its next timer tick (1/hz; hz is 10 by default),
so BLPOP(t) returns up to this late. We ask for that much less, and sleep through the last stretch instead."""


class RedisBackend:
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
                raise _backend_error(exc, f"{lua.name} failed on {self.shown}", name) from exc
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
            raise _backend_error(reply, f"{lua.name} failed on {self.shown}", name) from reply
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
            raise _backend_error(reply, f"{lua.name} failed on {self.shown}", name) from reply
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
            raise _backend_error(exc, f"checking {durability.shown} failed on {self.shown}", name) from exc
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
            raise _backend_error(reply, f"{lua.name} failed on {self.shown}", name) from reply
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

    def renewal_group(self, name: str) -> object:
        """Which server renews `name` (the watchdog sends a batch per server): on a Cluster, the primary of its
        slot as the client last read the layout (None: one Redis, or not known)."""
        if not self._cluster:
            return None
        node = node_of(self._client, redis_keys(name, self._prefix).lock.encode())
        return None if node is None else node.name

    def extend_many(self, leases: list[tuple[str, str, int, int]]) -> list[bool | None]:
        """The watchdog's batch: (name, token, fence, ttl_ms) each; True extended, False not ours, None no answer.

        Leases go in script calls of at most `BATCH` (on a Cluster, one slot per call). All the calls for one
        server travel in one pipeline: one round trip however many leases are due. A Cluster's primaries are
        asked at once, each bounded by its own socket timeout, so a stalled one delays none of the others.
        """
        groups: dict[int, list[int]] = {}
        for i, (name, _, _, _) in enumerate(leases):
            slot = key_slot(redis_keys(name, self._prefix).lock.encode()) if self._cluster else 0
            groups.setdefault(slot, []).append(i)
        calls: list[list[int]] = []
        for members in groups.values():
            calls.extend(members[start:start + BATCH] for start in range(0, len(members), BATCH))
        results: list[bool | None] = [None] * len(leases)
        if not self._cluster:
            self._extend_pipelined(self._client, calls, leases, results, self._durability)
            return results
        if self._durability is not None:  # confirmed per slot, over the slot primary's own connections
            for members in calls:
                _apply(results, members, self._extend_call(leases, members))
            return results
        by_node: dict[str, tuple[Any, list[list[int]]]] = {}
        for members in calls:
            node = node_of(self._client, redis_keys(leases[members[0]][0], self._prefix).lock.encode())
            if node is not None:  # (not known: no answer; the next renewal reads the layout again)
                by_node.setdefault(node.name, (node, []))[1].append(members)
        jobs = [partial(self._extend_on_node, node, node_calls, leases, results)
                for node, node_calls in by_node.values()]
        timeout = socket_timeout(self._client) or PATIENCE
        fan_out(jobs, 2 * timeout + 1.0, lambda done: len(done) == len(jobs))
        return results

    def _extend_on_node(self, node: Any, calls: list[list[int]], leases: list[tuple[str, str, int, int]],
                              results: list[bool | None]) -> None:
        """One Cluster primary's share of a batch, pipelined on a plain client of that node (redis-py sends no
        script in a cluster pipeline). A slot that moved answers MOVED: the layout is read again for the next."""
        try:
            moved = self._extend_pipelined(node_redis(self._client, node, self._node_clients), calls,
                                                 leases, results, None)
            if moved:
                cluster_refresh(self._client)
        except Exception:  # (anything: those leases just got no answer)
            return

    def _extend_pipelined(self, client: Any, calls: list[list[int]], leases: list[tuple[str, str, int, int]],
                                results: list[bool | None], durability: Durability | None) -> bool:
        """`calls` in one pipeline on `client` (one server), their answers spread over `results`. True if a slot
        answered MOVED or ASK (it is served elsewhere now)."""
        moved = False
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            for members in calls:
                keys, args = self._extend_args(leases, members)
                pipe.evalsha(EXTEND_MANY.sha, len(keys), *utf8(keys), *utf8(args))
            if durability is not None:  # the whole batch's writes, confirmed at once
                pipe.execute_command(*durability.command)
            self.renewal_requests += len(calls)
            try:
                replies = pipe.execute(raise_on_error=False)
            except CLIENT_ERRORS:
                return moved
            if durability is not None and not self._batch_confirmed(replies.pop()):
                return moved  # not confirmed: no answer counted (the leases keep the validity they had)
            missing = []
            for members, reply in zip(calls, replies, strict=True):
                if isinstance(reply, NoScriptError):
                    missing.append(members)
                else:
                    moved = moved or isinstance(reply, AskError)
                    _apply(results, members, reply)
            if not missing or attempt:
                break
            # The server lost its scripts (restart, failover, SCRIPT FLUSH): load once, then send again what
            # failed, still in one pipeline, rather than one call after another.
            try:
                client.script_load(EXTEND_MANY.source.encode("utf-8"))
            except CLIENT_ERRORS:
                break
            calls = missing
        return moved

    def _batch_confirmed(self, confirmation: Any) -> bool:
        assert self._durability is not None
        try:
            return self._durability.confirmed(confirmation)
        except Unsupported:
            return False

    def _extend_args(self, leases: list[tuple[str, str, int, int]], members: list[int]) -> tuple[list[str], list[Any]]:
        keys: list[str] = []
        args: list[Any] = []
        for i in members:
            name, token, _, ttl = leases[i]
            lease_keys = redis_keys(name, self._prefix)
            keys += [lease_keys.lock, lease_keys.fence]
            args += [token, ttl, fence_keep_ms(self._fence_retention, ttl)]
        return keys, args

    def _extend_call(self, leases: list[tuple[str, str, int, int]], members: list[int]) -> Any:
        keys, args = self._extend_args(leases, members)
        self.renewal_requests += 1
        try:
            reply = self._run(EXTEND_MANY, leases[members[0]][0], keys, args, confirm=True)
        except BackendError as exc:
            return exc
        if isinstance(reply, Confirmed):
            return reply.reply if self._batch_confirmed(reply.confirmation) else NotDurable("not confirmed")
        return reply

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


def warn_if_evicting(reply: Any, name: str, backend: str, where: str) -> None:
    """Tell every listener, at WARNING, that the server at `where` may evict held locks, if its `eviction`
    script's `reply` says so."""
    risk = eviction_risk(reply)
    if risk is not None:
        emit("evicting", name, backend, "acquire", error=f"{where}: {risk}")


def _apply(results: list[bool | None], members: list[int], reply: Any) -> None:
    """Spread one batch script's answers (1 extended, 0 not ours) over the leases it carried."""
    if isinstance(reply, Exception):
        return
    for i, code in zip(members, reply, strict=True):
        results[i] = int(code) == 1


def wait_for_wake(client: AnyRedis, wake_key: str, wait: float, *, name: str, where: str) -> int | None:
    """Block until a release pushes to `wake_key` or about `wait` seconds pass.

    Returns the fence the release pushed (0: no wake-up came), or None if the server failed. The server ends
    BLPOP only on a timer tick, so it is asked for `SERVER_TIMER` less and the rest is slept. A fault ends the
    wait early: the next attempt meets it and reports it. A server that refuses BLPOP itself (`refuses_wait`)
    raises `BackendError` naming `name`, with its message: waiting cannot work there. Beyond `MAX_BLOCKING` waits
    blocking through `client` at once, it sleeps a jittered pause instead (0: no wake-up came).
    """
    server_wait = wait - SERVER_TIMER
    if server_wait < MIN_BLOCK:
        sleep(wait)
        return 0
    if not BLOCKING.take(client):  # as many waits as `MAX_BLOCKING` block through it already: this one sleeps
        sleep(min(wait, random.uniform(*CROWDED_PAUSE)))
        return 0
    redis: Any = client
    try:
        popped = redis.blpop(utf8([wake_key]), timeout=server_wait)
    except ResponseError as exc:
        if refuses_wait(exc):
            raise wait_refused(exc, where, name) from exc
        return None
    except CLIENT_ERRORS:
        return None
    finally:
        BLOCKING.give_back(client)
    return 0 if popped is None else int(popped[1])


def refuses_wait(exc: ResponseError) -> bool:
    """The server answered BLPOP with an error that comes again at every try (NOPERM, an unknown or renamed
    command, a proxy that does not block), not one of a Cluster's passing states (a moving slot, a failover)."""
    return not isinstance(exc, (AskError, TryAgainError, ClusterDownError, ReadOnlyError, MasterDownError))


def wait_refused(exc: ResponseError, where: str, name: str) -> BackendError:
    """The error of a waiter whose server refused BLPOP (decision 2026-12-04-wait-refused)."""
    error = BackendError(f"{where} refused the wait for a release (BLPOP): {exc}; fencelock needs BLPOP on its "
                         "keys to wait (wait=0 needs none)", name=name)
    error.__cause__ = exc
    return error


def scan_names(client: AnyRedis, pattern: str, prefix: str, *, where: str, cluster: bool) -> set[str]:
    """The names of the lock keys on `client` that match `pattern` (fnmatch), found by SCAN, never KEYS.

    On a Cluster, SCAN runs on every primary node (each holds its own slots' keys). Keys come back as bytes
    whatever the client's `decode_responses`: one that is not UTF-8 is not fencelock's, and is skipped.
    """
    match = scan_match(pattern, prefix).encode("utf-8")
    redis: Any = client
    names: set[str] = set()
    try:
        if cluster:
            keys = redis.scan_iter(match=match, count=SCAN_COUNT, target_nodes=RedisCluster.PRIMARIES,
                                   NEVER_DECODE=True)
        else:
            keys = redis.scan_iter(match=match, count=SCAN_COUNT, NEVER_DECODE=True)
        for key in keys:
            name = name_of_lock_key(key, prefix)
            if name is not None and fnmatchcase(name, pattern):
                names.add(name)
    except CLIENT_ERRORS as exc:
        raise BackendError(f"listing the locks matching {pattern!r} failed on {where}: {type(exc).__name__}: "
                           f"{exc}") from exc
    return names


def run_script(client: AnyRedis, lua: Lua, keys: Sequence[str | bytes], args: list[Any], *, name: str,
                     where: str) -> Any:
    """EVALSHA `lua`; on NOSCRIPT (restart, failover, SCRIPT FLUSH) EVAL it, which also caches it again. Keys and
    str arguments go as UTF-8 whatever the client's encoding (`resp.utf8`). Sent once (`send_once`): whether it
    goes again is fencelock's rule, never the client's retry policy."""
    keys, args = utf8(keys), utf8(args)
    try:
        try:
            return send_once(client, keys[0], "EVALSHA", lua.sha, len(keys), *keys, *args)
        except NoScriptError:
            return send_once(client, keys[0], "EVAL", lua.source.encode("utf-8"), len(keys), *keys, *args)
    except CLIENT_ERRORS as exc:
        raise _backend_error(exc, f"{lua.name} failed on {where}", name) from exc


def send_once(client: AnyRedis, key: bytes, *command: Any) -> Any:
    """`command` on `client`'s server for `key`, sent once: a redis-py client's `Retry` (a user's client may
    have one that sends any command again after a reply that did not come) is never applied. One Redis: on a
    connection of the client's pool, written and read here. A Cluster: addressed to the slot's primary, which
    redis-py's cluster client never retries (it still follows MOVED and ASK: the command did not run there).
    (decision 2026-12-05-client-retry-policy)"""
    if isinstance(client, RedisCluster):
        cluster: Any = client
        return cluster.execute_command(*command, target_nodes=primary_of(cluster, key))
    pool: Any = client.connection_pool
    conn = pool.get_connection()
    try:
        conn.send_command(*command)
        return conn.read_response()
    except ResponseError:
        raise  # (the server's answer: the connection is fine)
    except BaseException:
        conn.disconnect()  # its reply may still come: never read by another command
        raise
    finally:
        pool.release(conn)


def _backend_error(exc: Exception, what: str, name: str) -> BackendError:
    if migrating(exc):
        return BackendError(f"{what}: the lock's hash slot is being moved between Redis Cluster primaries, and its "
                            "keys are split between them for now (TRYAGAIN); try again once the move is done "
                            f"({type(exc).__name__}: {exc})", name=name)
    return BackendError(f"{what}: {type(exc).__name__}: {exc}", name=name)


def migrating(exc: Exception) -> bool:
    """The error of a script on keys whose Cluster slot is being migrated: TRYAGAIN (some keys moved, some not),
    or redis-py's "TTL exhausted" after following the redirections (ASK, TRYAGAIN) as many times as it does."""
    return isinstance(exc, TryAgainError) or (isinstance(exc, ClusterError) and "TTL exhausted" in str(exc))


def socket_timeout(client: AnyRedis) -> float | None:
    if isinstance(client, RedisCluster):
        kwargs: dict[str, Any] = client.nodes_manager.connection_kwargs
    else:
        kwargs = client.connection_pool.connection_kwargs
    timeout = kwargs.get("socket_timeout")
    return None if timeout is None else float(timeout)
