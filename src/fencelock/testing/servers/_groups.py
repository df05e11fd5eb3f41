"""Groups of :class:`RedisServer`: independent masters (Redlock) and a primary with one replica (failover)."""

from __future__ import annotations

import time

from .._harness import Harness
from ._process import _command
from ._server import START_TIMEOUT, RedisServer


class _ServerGroup(Harness):
    """Several :class:`RedisServer` handled together: stop, resume and close them all."""

    nodes: list[RedisServer]

    def pause(self) -> None:
        """SIGSTOP every node."""
        for node in self.nodes:
            node.pause()

    def resume(self) -> None:
        """SIGCONT every node."""
        for node in self.nodes:
            node.resume()

    def _close_nodes(self) -> None:
        errors: list[BaseException] = []
        for node in self.nodes:
            try:
                node.close()
            except Exception as exc:  # keep closing the others
                errors.append(exc)
        if errors:
            raise errors[0]


class RedisNodes(_ServerGroup):
    """``n`` independent Redis masters (for Redlock): no replication, no cluster, each its own process."""

    def __init__(self, n: int = 5, binary: str | None = None, *, durable: bool = False) -> None:
        self.nodes = [RedisServer(binary, durable=durable, name=f"node{i}") for i in range(n)]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start(self) -> RedisNodes:
        for node in self.nodes:
            if not node.running:
                node.start()
        return self

    def close(self) -> None:
        """Close every node (idempotent)."""
        self._close_nodes()


class RedisPrimaryReplica(_ServerGroup):
    """A primary and one replica (``REPLICAOF``), for failover faults.

    Replication runs through a :class:`~fencelock.testing.proxy.Proxy`, so that :meth:`pause_replication` can hold
    back the replication stream at once and for certain: a write the primary acknowledges from then on never
    reaches the replica. :meth:`fail_over` then kills the primary (SIGKILL) and promotes the replica
    (``REPLICAOF NO ONE``), as Sentinel would, so the replica serves without what it never received.
    """

    def __init__(self, binary: str | None = None) -> None:
        from ..proxy import Proxy

        # No 5 s wait before a full sync (the default for diskless sync), so the replica is up at once.
        self.primary = RedisServer(binary, name="primary", extra_args=["--repl-diskless-sync-delay", "0"])
        self.replica = RedisServer(binary, name="replica")
        self.nodes = [self.primary, self.replica]
        self.link: Proxy | None = None
        self._proxy_type = Proxy

    def start(self, timeout: float = START_TIMEOUT) -> RedisPrimaryReplica:
        try:
            self.primary.start()
            self.link = self._proxy_type(self.primary.host, self.primary.port, name="replication").start()
            self.replica.extra_args = (*self.replica.extra_args, "--replicaof", self.link.host, str(self.link.port))
            self.replica.start()
            self.wait_in_sync(timeout)
        except BaseException:
            self.close()
            raise
        return self

    def wait_in_sync(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until the replica's link is up, it has every write the primary made so far, and it acknowledges
        them (a `WAIT 1` answered), so that the first durable grant does not pay for the link's first round."""
        primary, replica = self.primary.client(), self.replica.client()
        deadline = time.monotonic() + timeout
        while True:
            p = primary.info("replication")
            r = replica.info("replication")
            if (r.get("master_link_status") == "up" and p.get("connected_slaves", 0) >= 1
                    and int(r.get("slave_repl_offset", -1)) >= int(p.get("master_repl_offset", 0))):
                left_ms = max(1, int((deadline - time.monotonic()) * 1000))
                primary.set("fencelock-testing:in-sync", "1")
                if int(primary.wait(1, left_ms)) >= 1:
                    primary.delete("fencelock-testing:in-sync")
                    return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the replica did not catch up within {timeout:g} s: primary {p}, replica {r}")
            time.sleep(0.02)

    def pause_replication(self) -> None:
        """Hold back the replication stream: the primary's next writes do not reach the replica."""
        assert self.link is not None
        self.link.stall()

    def fail_over(self) -> None:
        """Cut the replication link (dropping what it held back), SIGKILL the primary, promote the replica.

        The link goes first, so that the replica, which reconnects at once, finds nothing to connect to."""
        if self.link is not None:
            self.link.close()
        self.primary.kill()
        _command(self.replica.client(), "REPLICAOF", "NO", "ONE")

    def close(self) -> None:
        try:
            self._close_nodes()
        finally:
            if self.link is not None:
                self.link.close()
