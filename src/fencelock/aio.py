"""fencelock for asyncio: the same API as `fencelock`, with `await` and `async with`.

    locks = fencelock.aio.connect("redis://127.0.0.1:6379/0")
    async with locks.lock("orders:42", ttl=30.0, wait=5.0) as lease:
        ...
    await locks.aclose()

The errors are the same classes as in `fencelock`.
"""

from __future__ import annotations

from ._async.client import AsyncLockContext as LockContext
from ._async.client import AsyncLocks as Locks
from ._async.connect import connect
from ._async.guards import AsyncRedisGuard as RedisGuard
from ._async.lease import AsyncLease as Lease
from ._logic.status import LockStatus

__all__ = ["Lease", "LockContext", "LockStatus", "Locks", "RedisGuard", "connect"]
