"""A lock service under test, as the conformance suite (`fencelock.testing.conformance`) sees it.

Each backend's harness gives one subclass: where the service is (`target`, what `fencelock.connect` takes), a way to
look behind fencelock's back (`holder`), a way to take the lock away from its holder (`steal`), and a fault switch
(`pause`/`resume`). A third-party backend runs the same suite by writing one more subclass.

Only `holder`, `steal`, `pause` and `resume` must be written. Everything else has a default that suits most
services; the optional look-ups (`ttl_left`, `leftovers`, `queued`) return None, "cannot tell", by default, and
the suite then checks only what it can see through the API. Say what your service can tell: the more it says, the
more the suite proves.
"""

from __future__ import annotations

import abc
from types import TracebackType
from typing import Any

import fencelock


class Deployment(abc.ABC):
    """One running lock service: a single Redis, a Redis Cluster, Redlock nodes, etcd, ZooKeeper, or yours.

    A deployment owns what it started: `close()` stops it (it is also a context manager).
    """

    kind: str = "?"
    """A short name, shown in test ids ("redis", "cluster", "redlock", "etcd", "zookeeper")."""

    supports_fair: bool = False
    """Whether `fair=True` is offered (the suite checks that it is refused where it is not)."""

    min_ttl: float = 0.01
    """The shortest TTL, in seconds, that the service really honours. Tests that let a lease expire use
    `max(min_ttl, their own TTL)`, so a service with coarser leases (etcd counts whole seconds) runs them too."""

    expiry_slack: float = 0.0
    """How much later than its TTL, at most, the service frees a lease nobody renewed, in seconds (etcd checks
    its leases every 0.5 s; Redis frees a key when it is asked for it). Tests that wait for an expiry allow it."""

    stall_timeout: float = 2.0
    """The longest, in seconds, that one request to a paused service takes to fail with `BackendError` on a client
    made by `connect()` (Redis: the 2 s socket timeout). The suite's bound for a paused service is built on it."""

    nodes_per_request: int = 1
    """Servers one request goes to (Redlock: N), for tests that count round trips."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind}>"

    def connect(self) -> fencelock.Locks:
        """A new sync client of the service (the caller closes it)."""
        return fencelock.connect(self.target)

    def aconnect(self) -> fencelock.aio.Locks:
        """A new asyncio client of the service (the caller closes it)."""
        return fencelock.aio.connect(self.target)

    def close(self) -> None:  # noqa: B027 (a default, not abstract: most deployments have something to stop)
        """Stop what this deployment started (servers, admin clients). Idempotent. The default does nothing."""

    def __enter__(self) -> Deployment:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @abc.abstractmethod
    def holder(self, name: str) -> str | None:
        """The token that holds `name` now, read from the servers directly (None: nobody holds it)."""

    @abc.abstractmethod
    def steal(self, name: str) -> None:
        """Take `name` away from its holder behind fencelock's back (delete its key or node), as an operator or a
        buggy client would. The holder must notice: its lease is lost."""

    @abc.abstractmethod
    def pause(self) -> None:
        """Stall every server of the deployment (SIGSTOP): connections stay open, nothing answers."""

    @abc.abstractmethod
    def resume(self) -> None:
        """Undo `pause`."""

    def ttl_left(self, name: str) -> float | None:
        """Seconds the service will still keep `name`'s lease if nobody renews it (None: it cannot tell)."""
        return None

    def leftovers(self, name: str) -> list[str] | None:
        """What the service still stores for `name` on behalf of a holder or a waiter: lock keys on any node, queue
        entries, ephemeral nodes. Not what must outlive them (fence counters). [] once everyone is gone; None: it
        cannot tell."""
        return None

    def queued(self, name: str) -> int | None:
        """How many waiters are queued for `name` now (None: it cannot tell, or the service keeps no queue)."""
        return None
