"""The Redlock rows over 3 and 5 independent Redis masters: the floors by hand, pottery, redlock-ng, and fencelock."""

from __future__ import annotations

import secrets
import time
from typing import Any, cast

import redis
import redis.asyncio

from .registry import TTL, Contender, Locker, Need, Reference, Target, register
from .single import FLOOR_RELEASE
from .subject import fencelock_async, fencelock_sync

# ------------------------------------------------------------------------------------------------------ Redlock

def floor_redlock(target: Target) -> Locker:
    """Redlock's least work, by hand: `SET name token NX PX 30000` written to every node before any answer is read
    (one thread, one connection per node), granted on a majority within the TTL; release by EVALSHA
    compare-and-delete, written to every node the same way. No fencing, no waiting, no per-node timeout."""
    clients = [redis.Redis.from_url(url) for url in target.urls]
    sha = ""
    for client in clients:
        sha = client.script_load(FLOOR_RELEASE)
    # One connection per node, held for the row's lifetime: the replies are read after every request is written.
    conns: list[Any] = [client.connection_pool.get_connection() for client in clients]  # redis-py: untyped
    quorum = len(conns) // 2 + 1
    ttl_ms = int(TTL * 1000)
    validity = TTL * 0.99 - 0.002  # the Redlock rule: TTL minus 1 % clock drift minus 2 ms

    def everywhere(*args: object) -> list[Any]:
        return _everywhere(conns, args)

    def acquire(name: str, wait: float) -> object | None:
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        token = secrets.token_hex(16)
        started = time.monotonic()
        granted = sum(1 for reply in everywhere("SET", name, token, "NX", "PX", ttl_ms) if reply is not None)
        if granted >= quorum and time.monotonic() - started < validity:
            return (name, token)
        everywhere("EVALSHA", sha, 1, name, token)  # give back what a minority granted
        return None

    def release(handle: object) -> None:
        name, token = cast("tuple[str, str]", handle)
        everywhere("EVALSHA", sha, 1, name, token)

    def close() -> None:
        for client, conn in zip(clients, conns, strict=True):
            client.connection_pool.release(conn)
            client.close()

    return Locker(acquire, release, close)


def floor_redlock_scripts(target: Target) -> Locker:
    """The Redlock floor by hand, running fencelock's own node scripts (redlock_acquire.lua, redlock_release.lua)
    instead of SET NX: what those scripts cost on these nodes, with none of fencelock's client logic. On this
    machine the nodes of a row share one server CPU and run one after the other, so every microsecond of script
    time counts as many times as there are nodes."""
    from fencelock._redis.keys import redis_keys
    from fencelock._scripts import REDLOCK_ACQUIRE, REDLOCK_RELEASE

    clients = [redis.Redis.from_url(url) for url in target.urls]
    for client in clients:
        client.script_load(REDLOCK_ACQUIRE.source)
        client.script_load(REDLOCK_RELEASE.source)
    conns: list[Any] = [client.connection_pool.get_connection() for client in clients]  # redis-py: untyped
    quorum = len(conns) // 2 + 1
    ttl_ms = int(TTL * 1000)
    marker = "fencelock:redlock:node"  # a node without it answers "not ready" (see redlock_gate.lua)
    if not any(client.exists(marker) for client in clients):
        for client in clients:  # a new deployment: every node counts at once, as fencelock itself decides
            client.set(marker, "bench")
    proposals: dict[str, int] = {}

    def everywhere(*args: object) -> list[Any]:
        return _everywhere(conns, args)

    def acquire(name: str, wait: float) -> object | None:
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        keys, token = redis_keys(name), secrets.token_hex(16)
        t = proposals[name] = proposals.get(name, 0) + 1
        replies = everywhere("EVALSHA", REDLOCK_ACQUIRE.sha, 4, keys.lock, keys.fence, marker, keys.waiters,
                             token, ttl_ms, t)
        if sum(1 for reply in replies if reply[0] == 1) >= quorum:
            return (keys, token, t)
        proposals[name] = max([t, *(int(reply[1]) for reply in replies)])  # learn the nodes' hwm
        everywhere("EVALSHA", REDLOCK_RELEASE.sha, 4, keys.lock, keys.fence, keys.waiters, keys.wake, token, t)
        return None

    def release(handle: object) -> None:
        keys, token, t = cast("tuple[Any, str, int]", handle)
        everywhere("EVALSHA", REDLOCK_RELEASE.sha, 4, keys.lock, keys.fence, keys.waiters, keys.wake, token, t)

    def close() -> None:
        for client, conn in zip(clients, conns, strict=True):
            client.connection_pool.release(conn)
            client.close()

    return Locker(acquire, release, close)


def pottery_redlock(target: Target) -> Locker:
    """pottery's `Redlock`: a new `ThreadPoolExecutor` per call sends to every master; a blocking acquire polls
    after a random pause of U(0, 0.2 s)."""
    from pottery import Redlock  # a bench-only dependency: imported only when this row runs

    masters = [redis.Redis.from_url(url) for url in target.urls]  # default settings, as for the other anchors

    def acquire(name: str, wait: float) -> object | None:
        lock = Redlock(key=name, masters=masters, auto_release_time=TTL)
        got = lock.acquire(blocking=True, timeout=wait) if wait > 0 else lock.acquire(blocking=False)
        return lock if got else None

    def release(handle: object) -> None:
        cast("Any", handle).release()

    def close() -> None:
        for master in masters:
            master.close()

    return Locker(acquire, release, close)


def redlock_ng(target: Target) -> Locker:
    """redlock-ng's sync `Redlock`: one master after the other; a blocking acquire polls after U(0.1, 0.3 s).

    `retry_count=0` so that `wait == 0` is one attempt (its default, 3, retries a non-blocking acquire three times
    with pauses); `blocking=True` has no wait limit (it polls until it gets the lock), so it is what `wait > 0`
    uses. Its clients have its own defaults (socket timeouts 0.1 s).
    """
    import redlock  # optional dependency (./dev bench installs it), untyped: see pyproject mypy overrides

    manager: Any = redlock.Redlock(list(target.urls), retry_count=0)
    ttl_ms = int(TTL * 1000)

    def acquire(name: str, wait: float) -> object | None:
        lock: object | None = manager.acquire(name, ttl_ms, blocking=wait > 0)
        return lock

    def release(handle: object) -> None:
        manager.release(handle)

    def close() -> None:
        for client in manager.client.instances:
            client.close()

    return Locker(acquire, release, close)


REDLOCK3 = Need("redlock", 3)
REDLOCK5 = Need("redlock", 5)


_NO_REFERENCE = Reference()


def _register_redlock(need: Need, *, floor: float, subject: float, pottery: float, ng: float,
                      anchor_runs: int, pottery_ref: Reference = _NO_REFERENCE,
                      ng_ref: Reference = _NO_REFERENCE) -> None:
    """The Redlock rows over `need.nodes` nodes. The scales keep each round of each row at a few tenths of a second
    at the default 1000 cycles (2-core VM, split placement: the single-node rows take ~0.2 ms a cycle, fencelock
    Redlock ~0.5-1.2 ms, redlock-ng ~0.6-2.5 ms (nodes one after the other), pottery ~1-6 ms (a thread pool per
    call; anchors.md measured 5.7 ms unpinned))."""
    n = need.nodes
    register(Contender(
        f"floor-rl{n}", f"floor: Redlock by hand, {n} nodes", "floor", need, make=floor_redlock,
        contended=False, cycles_scale=floor,
        note="SET NX PX to every node at once (one thread), EVALSHA release the same way",
    ))
    register(Contender(
        f"fencelock-rl{n}", f"fencelock Redlock, {n} nodes", "subject", need, make=fencelock_sync,
        cycles_scale=subject, runs=2,
        note=f"fencelock.connect([{n} urls]): acquire(ttl=30) / lease.release()",
    ))
    register(Contender(
        f"pottery-rl{n}", f"pottery Redlock, {n} nodes", "anchor", need, make=pottery_redlock,
        cycles_scale=pottery, runs=anchor_runs, reference=pottery_ref,
        note="pottery.Redlock(key=, masters={clients}, auto_release_time=30): thread pool per call",
    ))
    register(Contender(
        f"redlock-ng-rl{n}", f"redlock-ng, {n} nodes", "anchor", need, make=redlock_ng,
        cycles_scale=ng, runs=anchor_runs, reference=ng_ref,
        note="redlock.Redlock([urls], retry_count=0): acquire(name, 30000, blocking=): nodes one after another",
    ))


_register_redlock(REDLOCK3, floor=0.5, subject=0.4, pottery=0.1, ng=0.25, anchor_runs=1)
_register_redlock(REDLOCK5, floor=0.5, subject=0.25, pottery=0.1, ng=0.2, anchor_runs=2,
                  pottery_ref=Reference(uncontended_us=5670, per_s=116, wait_p99_ms=703, longest_ms=995),
                  ng_ref=Reference(uncontended_us=1430, per_s=166, wait_p99_ms=207, longest_ms=312))
register(Contender(
    "floor-scripts-rl5", "floor by hand, fencelock's node scripts, 5 nodes", "info", REDLOCK5,
    make=floor_redlock_scripts, contended=False, cycles_scale=0.25,
    note="the Redlock floor's fan-out with redlock_acquire.lua / redlock_release.lua: the scripts' own cost",
))
register(Contender(
    "fencelock-aio-rl5", "fencelock.aio Redlock, 5 nodes", "info", REDLOCK5, make_async=fencelock_async,
    contended=False, cycles_scale=0.25,
    note="fencelock.aio.connect([5 urls]), one task, for information",
))


def _everywhere(conns: list[Any], args: tuple[object, ...]) -> list[Any]:
    """One command written to every node's connection before any reply is read; the replies, in node order."""
    packed = conns[0].pack_command(*args)
    for conn in conns:
        conn.send_packed_command(packed, check_health=False)
    return [conn.read_response() for conn in conns]
