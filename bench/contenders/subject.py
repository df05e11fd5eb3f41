"""fencelock's own rows: one factory for every service (one Redis, Redlock, etcd, ZooKeeper), given to `connect()`."""

from __future__ import annotations

from typing import cast

import fencelock
import fencelock.aio

from .registry import TTL, AsyncLocker, Locker, Target


def _fencelock_target(target: Target) -> str | list[str]:
    """What `fencelock.connect()` is given: the URL of one node (or of an etcd cluster), or the list of URLs of the
    Redlock nodes."""
    return list(target.urls) if target.service == "redlock" else target.url


def fencelock_sync(target: Target, *, fair: bool = False) -> Locker:
    locks = fencelock.connect(_fencelock_target(target))

    def acquire(name: str, wait: float) -> object | None:
        try:
            return locks.acquire(name, ttl=TTL, wait=wait, fair=fair)
        except fencelock.NotAcquired:
            return None

    def release(handle: object) -> None:
        cast(fencelock.Lease, handle).release()

    return Locker(acquire, release, locks.close)


def fencelock_fair(target: Target) -> Locker:
    return fencelock_sync(target, fair=True)


def fencelock_async(target: Target) -> AsyncLocker:
    locks = fencelock.aio.connect(_fencelock_target(target))

    async def acquire(name: str, wait: float) -> object | None:
        try:
            return await locks.acquire(name, ttl=TTL, wait=wait)
        except fencelock.NotAcquired:
            return None

    async def release(handle: object) -> None:
        await cast(fencelock.aio.Lease, handle).release()

    return AsyncLocker(acquire, release, locks.aclose)
