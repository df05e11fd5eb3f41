"""A lock service under test, as the conformance suite (`fencelock.testing.conformance`) sees it.

Each backend's harness gives one subclass: where the service is (`target`, what `fencelock.connect` takes), a way to
look behind fencelock's back (`holder`), a way to take the lock away from its holder (`steal`), and a fault switch
(`pause`/`resume`). A third-party backend runs the same suite by writing one more subclass.
"""

from __future__ import annotations

import abc
from typing import Any

import fencelock


class Deployment(abc.ABC):
    """One running lock service: a single Redis, a Redis Cluster, Redlock nodes, etcd, ZooKeeper, or yours."""

    kind: str = "?"
    """A short name, shown in test ids ("redis", "cluster", "redlock", "etcd", "zookeeper")."""

    supports_fair: bool = False
    """Whether `fair=True` is offered (the suite checks that it is refused where it is not)."""

    min_ttl: float = 0.01
    """The shortest TTL, in seconds, that the service really honours. Tests that let a lease expire use
    `max(min_ttl, their own TTL)`, so a service with coarser leases (etcd counts whole seconds) runs them too."""

    nodes_per_request: int = 1
    """Servers one request goes to (Redlock: N), for tests that count round trips."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind}>"

    def connect(self) -> fencelock.Locks:
        return fencelock.connect(self.target)

    def aconnect(self) -> fencelock.aio.Locks:
        return fencelock.aio.connect(self.target)

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
