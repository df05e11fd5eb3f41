"""Helpers for testing fencelock, and backends of your own, against real servers.

- `fencelock.testing.servers`: start, pause, kill and restart real Redis servers, nodes and Redis Clusters.
- `Deployment` (`fencelock.testing.deployment`): a lock service under test, as the conformance suite sees it;
  `RedisDeployment`, `ClusterDeployment` and `RedlockDeployment` (`redis_deployments`) are the Redis family's.
- `fencelock.testing.etcd`: start, pause, kill and restart real etcd members and clusters; `EtcdDeployment`.
- `fencelock.testing.zookeeper`: start, pause, kill and restart a standalone ZooKeeper; `ZooKeeperDeployment`;
  `zookeeper_ensemble`: the same for an ensemble.
- `timing`: `slack(s)`, the one scale (`FENCELOCK_TIME_SCALE`) every elapsed-time bound uses.
- `proxy` (delay or stall a connection), `faults` (fault one chosen Redis request), `invariants` (a watcher of the
  lock keys and the invariants a history must keep).
- `fencelock.testing.conformance`: the behavioural suite every backend passes (needs pytest; import it yourself).
"""

from .deployment import Deployment
from .etcd import EtcdDeployment
from .redis_deployments import ClusterDeployment, RedisDeployment, RedlockDeployment
from .zookeeper import ZooKeeperDeployment

__all__ = ["ClusterDeployment", "Deployment", "EtcdDeployment", "RedisDeployment", "RedlockDeployment",
           "ZooKeeperDeployment"]
