"""Scenario 4d: scenario 4's failover, with the lock granted under `durability="replica"`.

A acquires while replication is healthy, so its grant counts only once the replica acknowledged it (WAIT,
pipelined after the grant); then the primary is killed and the replica promoted. B asks the promoted replica for
the lock and must not get it: the lock itself survives (docs/design/durability.md). Registered in `run.py` after
`scenarios.SCENARIOS`.
"""

from __future__ import annotations

from fencelock.testing.servers import RedisPrimaryReplica

from .configs import SOCKET_TIMEOUT, redis_url
from .scenarios import KLEPPMANN, REDLOCK, Cell, Scenario, _acquire, _lock_key_on, _takes_over, always

DURABLE_SOCKET_TIMEOUT = 2.0
"""Seconds: A's socket timeout, so that its confirmation may take up to half of it on a busy machine."""


def _durable_url(host: str, port: int) -> str:
    return (f"redis://{host}:{port}/0?socket_timeout={DURABLE_SOCKET_TIMEOUT}"
            f"&socket_connect_timeout={SOCKET_TIMEOUT}")


def failover_durable(cell: Cell) -> None:
    t = cell.ttl
    pair = RedisPrimaryReplica().start()
    cell.cleanup(pair.close)
    replica = redis_url(pair.replica.host, pair.replica.port)
    a = cell.worker("A", target=_durable_url(pair.primary.host, pair.primary.port),
                    options={"durability": "replica", "durability_timeout": DURABLE_SOCKET_TIMEOUT / 2})
    _acquire(a, t * 8)
    a.call("read")
    replicated = _lock_key_on(pair.replica, cell.name) is not None  # no polling: WAIT answered after the replica
    cell.fault("A's grant was confirmed by the replica (WAIT 1, pipelined after the grant)", ok=replicated)
    pair.fail_over()
    cell.fault("the primary is killed (SIGKILL) while A holds the lock; the replica is promoted (REPLICAOF NO ONE)",
               ok=replicated)
    b = cell.worker("B", target=replica, options={})
    _takes_over(b, t * 8, 1.0)  # refused while the promoted replica keeps A's lock; a write of B's if not
    a.call("write")
    a.call("release")  # (to a server that is gone: A's key on the replica expires with its TTL)


SCENARIOS_DURABLE: list[Scenario] = [
    Scenario("4d", 4, "the primary fails after a grant confirmed by its replica (durability=\"replica\")",
             "A's grant waits for the replica's WAIT acknowledgement; the primary is SIGKILLed and the replica "
             "promoted; a second client acquires", f"{REDLOCK} (why failover is not enough); {KLEPPMANN}",
             failover_durable, always("UNSAFE"),
             beyond=lambda c: ("with durability=\"replica\" a grant counts only once a replica acknowledged it "
                               "(docs/design/durability.md): the promoted replica still holds A's lock, so B "
                               "does not get it; WAIT does not promise this for every failover (another replica "
                               "promoted, a replica restarted before its fsync)"),
             evidence="fault", kinds=("redis",),
             not_applicable="Redlock refuses durability (a majority of independent masters), and etcd and "
             "ZooKeeper commit a lock to a quorum before they grant it"),
]
"""The scenarios of this module, run after `scenarios.SCENARIOS` (see `run.py`)."""
