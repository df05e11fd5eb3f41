"""The registry of contenders: name -> a factory that connects to a `Target` and gives acquire/release callables.

To add a row (etcd, ZooKeeper, ...): write a factory `(Target) -> Locker` (or an async one giving an
`AsyncLocker`), and `register()` it with the `Need` it has (which service, how many nodes). The Redlock rows
(`Need("redlock", n)`: n independent Redis masters) show how a multi-node row is added.
`services.py` starts what the needs ask for; `workload.py` runs every registered contender the same way.

The contract every factory keeps, so that the rows compare like with like:

- `acquire(name, wait)` makes one acquisition with a 30 s TTL and returns a handle, or None if the lock stayed
  busy: `wait == 0` is one attempt, `wait > 0` blocks at most that many seconds in the library's own way.
- `release(handle)` gives that acquisition back (compare-and-delete on the server).
- Each acquisition builds whatever a user would build for it (a new `Lock` object, a new token): the cost of
  the library's normal use is measured, not a hand-tuned reuse of its internals.
- Each factory makes its own client (connection pool) with the library's default settings.

    registry.py   the types and `register()`
    subject.py    fencelock's factories, one for every service
    single.py     the rows on one Redis
    redlock.py    the Redlock rows (3 and 5 nodes)
    queues.py     the etcd and ZooKeeper rows

Importing this package registers every row, in that order.
"""

from __future__ import annotations

# isort: off
from . import single, redlock, queues  # noqa: F401  (each registers its rows when imported, in this order)
# isort: on
from .registry import REGISTRY, TTL, AsyncLocker, Contender, Locker, Need, Reference, Role, Target, register
from .single import ONE_REDIS

__all__ = ["ONE_REDIS", "REGISTRY", "TTL", "AsyncLocker", "Contender", "Locker", "Need", "Reference", "Role",
           "Target", "register"]
