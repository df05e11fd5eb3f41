# Generated from _async/redis_commands.py by scripts/unasync.py: do not edit, edit that file instead.
"""One Redis server's commands as both Redis backends (and the guards) send them: a script sent once, the wait for
a release (BLPOP), SCAN for lock names, the eviction warning; redis-py's errors become `BackendError` here."""

from __future__ import annotations

import random
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

from redis import Redis, RedisCluster
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

from .._errors import BackendError
from .._events import emit
from .._redis.channel import BLOCKING, CROWDED_PAUSE
from .._redis.eviction import eviction_risk
from .._redis.keys import name_of_lock_key, scan_match
from .._redis.resp import utf8
from .._scripts import Lua
from ._cluster import primary_of
from ._concurrency import sleep

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


def warn_if_evicting(reply: Any, name: str, backend: str, where: str) -> None:
    """Tell every listener, at WARNING, that the server at `where` may evict held locks, if its `eviction`
    script's `reply` says so."""
    risk = eviction_risk(reply)
    if risk is not None:
        emit("evicting", name, backend, "acquire", error=f"{where}: {risk}")


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
        raise backend_error(exc, f"{lua.name} failed on {where}", name) from exc


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


def backend_error(exc: Exception, what: str, name: str) -> BackendError:
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
