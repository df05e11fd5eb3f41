"""The rows on one Redis: the floors by hand, redis-py's and python-redis-lock's locks, flock, and fencelock."""

from __future__ import annotations

import secrets
from typing import cast

import redis
import redis.asyncio

from .registry import TTL, AsyncLocker, Contender, Locker, Need, Reference, Target, register
from .subject import fencelock_async, fencelock_fair, fencelock_sync

# ----------------------------------------------------------------------------------------------------- one node

def _redis_client(target: Target) -> redis.Redis:
    """A plain redis-py client with its default settings, as a user of the anchors would make it."""
    return redis.Redis.from_url(target.url)


FLOOR_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def floor(target: Target) -> Locker:
    """By hand: `SET name token NX PX 30000`, release by EVALSHA compare-and-delete. No waiting, no fence."""
    client = _redis_client(target)
    sha: str = client.script_load(FLOOR_RELEASE)
    ttl_ms = int(TTL * 1000)

    def acquire(name: str, wait: float) -> object | None:
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        token = secrets.token_hex(16)
        return (name, token) if client.set(name, token, nx=True, px=ttl_ms) else None

    def release(handle: object) -> None:
        name, token = cast("tuple[str, str]", handle)
        client.evalsha(sha, 1, name, token)

    return Locker(acquire, release, client.close)


def floor_async(target: Target) -> AsyncLocker:
    """The floor with redis-py's asyncio client: what any asyncio lock on redis-py pays at least."""
    client = redis.asyncio.Redis.from_url(target.url)
    ttl_ms = int(TTL * 1000)
    sha: str | None = None

    async def acquire(name: str, wait: float) -> object | None:
        nonlocal sha
        if wait != 0:
            raise NotImplementedError("the floor makes one attempt only")
        if sha is None:
            sha = await client.script_load(FLOOR_RELEASE)
        token = secrets.token_hex(16)
        return (name, token) if await client.set(name, token, nx=True, px=ttl_ms) else None

    async def release(handle: object) -> None:
        name, token = cast("tuple[str, str]", handle)
        await client.evalsha(sha, 1, name, token)  # type: ignore[arg-type]

    return AsyncLocker(acquire, release, client.aclose)


def redis_py_lock(target: Target) -> Locker:
    """redis-py's `Lock` with its defaults: a blocking acquire polls every 0.1 s."""
    client = _redis_client(target)

    def acquire(name: str, wait: float) -> object | None:
        lock = client.lock(name, timeout=TTL)
        got = lock.acquire(blocking=wait > 0, blocking_timeout=wait if wait > 0 else None)
        return lock if got else None

    def release(handle: object) -> None:
        handle.release()  # type: ignore[attr-defined]

    return Locker(acquire, release, client.close)


def python_redis_lock(target: Target) -> Locker:
    """python-redis-lock: `SET NX EX`, a blocking acquire BLPOPs a signal list its release pushes to.

    Its `acquire()` first GETs the key to check that this `Lock` object does not already hold it: three round
    trips per cycle where the others make two. That is its normal use, so it is measured as it is.
    """
    import redis_lock  # a bench-only dependency: imported only when this row runs

    client = _redis_client(target)
    expire = int(TTL)

    def acquire(name: str, wait: float) -> object | None:
        lock = redis_lock.Lock(client, name, expire=expire)
        if wait > 0:
            # Its timeout is whole seconds (it truncates fractions), and may not exceed `expire`.
            got = lock.acquire(blocking=True, timeout=max(1, min(expire, round(wait))))
        else:
            got = lock.acquire(blocking=False)
        return lock if got else None

    def release(handle: object) -> None:
        handle.release()  # type: ignore[attr-defined]

    return Locker(acquire, release, client.close)


def floor_flock(target: Target) -> Locker:
    """The best hand-off this machine can do, without any network: `flock` on one file per name. The kernel wakes
    a blocked waiter the moment the holder unlocks. (Not fair, no TTL, one machine only: a bound, not a lock.)"""
    import fcntl  # POSIX only; the contended workload runs only where multiprocessing does
    import hashlib
    import os
    import tempfile

    files: dict[str, int] = {}

    def acquire(name: str, wait: float) -> object | None:
        fd = files.get(name)
        if fd is None:
            path = os.path.join(tempfile.gettempdir(), f"fencelock-bench-{hashlib.sha1(name.encode()).hexdigest()}")
            fd = files[name] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # wait > 0 blocks until the holder unlocks (the run's 10 s wait is never reached at this speed)
            fcntl.flock(fd, fcntl.LOCK_EX if wait > 0 else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        return fd

    def release(handle: object) -> None:
        fcntl.flock(cast(int, handle), fcntl.LOCK_UN)

    def close() -> None:
        for fd in files.values():
            os.close(fd)

    return Locker(acquire, release, close)


ONE_REDIS = Need("redis")

register(Contender(
    "floor", "floor: SET NX PX + EVALSHA", "floor", ONE_REDIS, make=floor, contended=False,
    reference=Reference(uncontended_us=272),
    note="hand-written with redis-py: the least a correct single-node lock can do",
))
register(Contender(
    "floor-flock", "floor: flock, no network", "floor", ONE_REDIS, make=floor_flock, uncontended=False,
    note="the kernel's hand-off between processes: what no network lock on this machine can beat",
))
register(Contender(
    "fencelock", "fencelock", "subject", ONE_REDIS, make=fencelock_sync,
    note="fencelock.connect(url): acquire(ttl=30) / lease.release()",
))
register(Contender(
    "fencelock-fair", "fencelock, fair", "subject", ONE_REDIS, make=fencelock_fair, uncontended=False,
    note="fencelock.connect(url): acquire(ttl=30, fair=True): waiters served in arrival order",
))
register(Contender(
    "redis-py", "redis-py Lock", "anchor", ONE_REDIS, make=redis_py_lock,
    reference=Reference(uncontended_us=324, per_s=401, wait_p99_ms=408, longest_ms=2325),
    note="r.lock(name, timeout=30): defaults, polls every 0.1 s",
))
register(Contender(
    "python-redis-lock", "python-redis-lock", "anchor", ONE_REDIS, make=python_redis_lock,
    reference=Reference(uncontended_us=297, per_s=508, wait_p99_ms=29, longest_ms=41),
    note="redis_lock.Lock(r, name, expire=30): BLPOP on a signal list",
))
register(Contender(
    "floor-aio", "floor, asyncio", "info", ONE_REDIS, make_async=floor_async, contended=False,
    note="the floor with redis.asyncio: the bar for fencelock.aio",
))
register(Contender(
    "fencelock-aio", "fencelock.aio", "info", ONE_REDIS, make_async=fencelock_async, contended=False,
    note="fencelock.aio.connect(url), one task, for information",
))
