"""fencelock: distributed locks that stay correct when things go wrong.

    import fencelock

    locks = fencelock.connect("redis://127.0.0.1:6379/0")
    with locks.lock("orders:42", ttl=30.0, wait=5.0) as lease:
        storage.write(..., fence=lease.fence)      # the storage rejects fences older than one it has seen

Every lease carries a fencing token (`lease.fence`) that strictly increases with every grant of a name; the guards
(`RedisGuard`, `SQLGuard`) let storage reject writes from holders whose lease ran out. `fencelock.aio` is the
same API for asyncio.
"""

from __future__ import annotations

from . import aio
from ._errors import (
    AcquireTimeout,
    BackendError,
    LockError,
    LockLost,
    NotAcquired,
    NotDurable,
    NotIndependent,
    QuorumUnavailable,
    StaleFence,
)
from ._events import LockEvent, subscribe
from ._guards_sql import SQLGuard
from ._logic.args import DEFAULT_TTL, DEFAULT_WAIT
from ._logic.status import LockStatus
from ._sync.client import LockContext, Locks
from ._sync.connect import connect
from ._sync.guards import RedisGuard
from ._sync.lease import Lease
from ._version import __version__ as __version__

__all__ = [
    "DEFAULT_TTL",
    "DEFAULT_WAIT",
    "AcquireTimeout",
    "BackendError",
    "Lease",
    "LockContext",
    "LockError",
    "LockEvent",
    "LockLost",
    "LockStatus",
    "Locks",
    "NotAcquired",
    "NotDurable",
    "NotIndependent",
    "QuorumUnavailable",
    "RedisGuard",
    "SQLGuard",
    "StaleFence",
    "aio",
    "connect",
    "subscribe",
]
