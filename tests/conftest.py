"""Shared fixtures: real servers on free loopback ports, started here and stopped afterwards. No fakes.

`BACKENDS` is the registry of every backend the conformance suite (`tests/suite/test_conformance.py`) runs on: a kind
mapped to a function that starts a `fencelock.testing.Deployment` of it. Adding a backend is one line there. The
first test that needs a kind starts its shared deployment, which lives for the session; tests that pause or kill
servers get a deployment of their own (`own_deployment`), so a failure can never leave a shared server stopped.

The Redis-specific tests (scripts, key layout, TLS, ACL, Redlock internals, the fair queue) use `deployment`
parametrised over the Redis family only (`REDIS_KINDS`), and the servers behind it (`standalone`, `cluster`,
`redlock_nodes`).
"""

from __future__ import annotations

import gc
import os
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.register_assert_rewrite("fencelock.testing.conformance")

import redis  # noqa: E402

import fencelock  # noqa: E402
from fencelock._redis.keys import redis_keys  # noqa: E402
from fencelock.testing import ClusterDeployment, Deployment, RedisDeployment, RedlockDeployment  # noqa: E402
from fencelock.testing.etcd import EtcdCluster, EtcdDeployment, EtcdServer, find_etcd_binary  # noqa: E402
from fencelock.testing.redis_deployments import initialise_redlock  # noqa: E402
from fencelock.testing.servers import RedisClusterServers, RedisNodes, RedisServer, find_server_binary  # noqa: E402

pytest_plugins = ["pytester"]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

__all__ = ["BACKENDS", "IN_CI", "REDIS_KINDS", "initialise_redlock", "lock_value"]


def _require_server_binary() -> str:
    try:
        return find_server_binary()
    except RuntimeError as exc:
        if IN_CI:
            pytest.fail(f"CI must run every backend's tests: {exc}")
        pytest.skip(str(exc))


def redis_deployment() -> Deployment:
    _require_server_binary()
    return RedisDeployment.start()


def cluster_deployment() -> Deployment:
    _require_server_binary()
    return ClusterDeployment.start(3)


def redlock_deployment() -> Deployment:
    _require_server_binary()
    return RedlockDeployment.start(5)


def zookeeper_deployment() -> Deployment:
    _require_zookeeper()
    from fencelock.testing.zookeeper import ZooKeeperDeployment
    return ZooKeeperDeployment.start()


def zookeeper_ensemble_deployment() -> Deployment:
    _require_zookeeper()
    from fencelock.testing.zookeeper_ensemble import ZooKeeperEnsembleDeployment
    return ZooKeeperEnsembleDeployment.start()


def require_etcd_binary() -> str:
    """The etcd binary; in CI its absence fails the test, locally it skips with how to install it."""
    try:
        return find_etcd_binary()
    except RuntimeError as exc:
        if IN_CI:
            pytest.fail(f"CI must run every backend's tests: {exc}")
        pytest.skip(str(exc))


def etcd_deployment() -> Deployment:
    require_etcd_binary()
    return EtcdDeployment.start()


def etcd_cluster_deployment() -> Deployment:
    require_etcd_binary()
    return EtcdDeployment.start(3)


BACKENDS: dict[str, Callable[[], Deployment]] = {
    "redis": redis_deployment,        # a single Redis
    "cluster": cluster_deployment,    # a Redis Cluster of three masters
    "redlock": redlock_deployment,    # Redlock over five independent nodes
    "etcd": etcd_deployment,          # one etcd member (data in memory; 1 s minimum lease)
    "etcd3": etcd_cluster_deployment,  # three etcd members (etcd's default timing: 2 s minimum lease)
    "zookeeper": zookeeper_deployment,  # a standalone ZooKeeper (each deployment its own chroot)
    "zookeeper3": zookeeper_ensemble_deployment,  # a ZooKeeper ensemble of three members
}
"""Every backend the conformance suite runs on. Each function starts a deployment that its `close()` stops, and
skips (in CI: fails) when the server is not installed."""

REDIS_KINDS = ["redis", "cluster", "redlock"]
"""The backends the Redis-specific tests run on."""


class SharedDeployments:
    """One deployment per kind for the whole session, started when a test first needs it."""

    def __init__(self) -> None:
        self._started: dict[str, Deployment] = {}

    def get(self, kind: str) -> Deployment:
        if kind not in self._started:
            self._started[kind] = BACKENDS[kind]()
        return self._started[kind]

    def close(self) -> None:
        for deployment in self._started.values():
            deployment.close()
        self._started.clear()


@pytest.fixture(scope="session")
def shared_deployments() -> Iterator[SharedDeployments]:
    shared = SharedDeployments()
    yield shared
    shared.close()


@pytest.fixture(scope="session")
def standalone(shared_deployments: SharedDeployments) -> RedisServer:
    deployment = shared_deployments.get("redis")
    assert isinstance(deployment, RedisDeployment)
    return deployment.server


@pytest.fixture(scope="session")
def cluster(shared_deployments: SharedDeployments) -> RedisClusterServers:
    deployment = shared_deployments.get("cluster")
    assert isinstance(deployment, ClusterDeployment)
    return deployment.cluster


@pytest.fixture(scope="session")
def redlock_nodes(shared_deployments: SharedDeployments) -> RedisNodes:
    deployment = shared_deployments.get("redlock")
    assert isinstance(deployment, RedlockDeployment)
    return deployment.nodes


RedisFamily = RedisDeployment | ClusterDeployment | RedlockDeployment


@pytest.fixture(params=REDIS_KINDS)
def deployment(request: pytest.FixtureRequest, shared_deployments: SharedDeployments) -> RedisFamily:
    """A Redis-specific test runs on a single Redis, on a Redis Cluster of three masters, and on Redlock over
    five independent nodes."""
    found = shared_deployments.get(request.param)
    assert isinstance(found, RedisDeployment | ClusterDeployment | RedlockDeployment)
    return found


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A single Redis of this test's own, for faults that only make sense on one node."""
    _require_server_binary()
    with RedisServer(name="own") as server:
        yield server


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A lock name no other test uses."""
    return f"test:{request.node.name}:{uuid.uuid4().hex[:8]}"


@pytest.fixture
def locks(deployment: Deployment) -> Iterator[fencelock.Locks]:
    client = deployment.connect()
    yield client
    client.close()


def lock_value(raw: redis.Redis | redis.RedisCluster, name: str) -> str | None:
    """The token stored in `name`'s lock key, read directly from the server (None: no key)."""
    value: Any = raw.get(redis_keys(name).lock)
    return None if value is None else bytes(value).decode()


# -- ZooKeeper ------------------------------------------------------------------------------------------------

def _require_zookeeper() -> None:
    from fencelock.testing.zookeeper import find_zookeeper
    try:
        find_zookeeper()
    except RuntimeError as exc:
        if IN_CI:
            pytest.fail(f"CI must run every backend's tests: {exc}")
        pytest.skip(str(exc))
    try:
        import kazoo  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("CI must run the ZooKeeper tests: ./dev test installs kazoo")
        pytest.skip("kazoo is not installed: ./dev test installs it (or pip install 'fencelock[zookeeper]')")


@pytest.fixture(scope="session")
def zookeeper_server(shared_deployments: SharedDeployments) -> Any:
    """The conformance suite's shared ZooKeeper; every ZooKeeper-specific test gets its own chroot on it (`zk`)."""
    deployment = shared_deployments.get("zookeeper")
    return deployment.server  # type: ignore[attr-defined]


@pytest.fixture
def zk(zookeeper_server: Any) -> Iterator[Any]:
    """A `ZooKeeperDeployment` with a chroot no other test uses."""
    from fencelock.testing.zookeeper import ZooKeeperDeployment
    deployment = ZooKeeperDeployment(zookeeper_server)
    yield deployment
    deployment.close()


@pytest.fixture
def own_zk() -> Iterator[Any]:
    """A ZooKeeper server of this test's own, for tests that pause or kill it."""
    _require_zookeeper()
    from fencelock.testing.zookeeper import ZooKeeperDeployment, ZooKeeperServer
    with ZooKeeperServer(name="zk-own") as server:
        deployment = ZooKeeperDeployment(server)
        yield deployment
        if server.running:
            server.resume()
        deployment.close()


# ------------------------------------------------------------------------------------------------ etcd


@pytest.fixture(scope="session")
def etcd_server(shared_deployments: SharedDeployments) -> EtcdServer:
    """The etcd member of the session's shared etcd deployment (tests that do not inject faults; each uses its
    own lock names)."""
    deployment = shared_deployments.get("etcd")
    assert isinstance(deployment, EtcdDeployment)
    assert isinstance(deployment.cluster, EtcdServer)
    return deployment.cluster


@pytest.fixture
def own_etcd_server() -> Iterator[EtcdServer]:
    """One etcd member for this test alone: for tests that pause or kill it."""
    require_etcd_binary()
    with EtcdServer(memory=True) as server:
        yield server


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    """Three etcd members for this test alone (etcd's default timing: 100 ms heartbeat, 1 s election).

    Tests keep etcd's data in memory (/dev/shm): they check the protocol, and a disk fsync per write would only
    make them slower on a busy machine."""
    require_etcd_binary()
    with EtcdCluster(3, memory=True) as cluster:
        yield cluster


def until(condition: Callable[..., object], timeout: float, what: str) -> None:
    """Poll `condition` until it is true; AssertionError naming `what` if `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.01)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Full garbage collections skip what lives for the whole run (every imported module, every collected test):
    frozen once, before the first test, so a collection during a test walks that test's objects and the
    session's servers and clients, not the whole interpreter (docs/decisions/2026-12-03-test-gc.md)."""
    gc.collect()
    gc.freeze()
