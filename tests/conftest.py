"""Shared fixtures: real servers on free loopback ports, started here and stopped afterwards. No fakes.

`deployment` runs a test once on a single Redis and once on a three-master Redis Cluster. Tests that inject
faults (pause, kill) get servers of their own, so a failure can never leave a shared server stopped.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

import fencelock
from fencelock._logic.keys import redis_keys
from fencelock.testing.servers import RedisClusterServers, RedisNodes, RedisServer, find_server_binary

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _require_server_binary() -> str:
    try:
        return find_server_binary()
    except RuntimeError as exc:
        if IN_CI:
            pytest.fail(f"CI must run every backend's tests: {exc}")
        pytest.skip(str(exc))


@dataclass
class Deployment:
    """A lock service under test: where it is, a way to look behind fencelock's back, and its fault switches."""

    kind: str                                   # "redis", "cluster" or "redlock"
    url: str | list[str]
    servers: RedisServer | RedisClusterServers | RedisNodes

    @property
    def nodes_per_request(self) -> int:
        return len(self.servers.nodes) if isinstance(self.servers, RedisNodes) else 1

    def raw(self) -> Any:
        """A plain redis-py client (Redis or RedisCluster; Redlock: its first node), e.g. as a guarded store."""
        if isinstance(self.servers, RedisNodes):
            return self.servers.nodes[0].client()
        return self.servers.client()

    def raws(self) -> list[Any]:
        """One plain client per node that holds locks (one for Redis and Cluster, N for Redlock)."""
        if isinstance(self.servers, RedisNodes):
            return [node.client() for node in self.servers.nodes]
        return [self.servers.client()]

    def holder(self, name: str) -> str | None:
        """The token holding `name`, read from the servers (Redlock: the token a majority of nodes hold)."""
        tokens = [lock_value(raw, name) for raw in self.raws()]
        for token in set(tokens) - {None}:
            if tokens.count(token) > len(tokens) // 2:
                return token
        return None

    def pttl(self, name: str) -> int:
        """Milliseconds left on `name`'s key (Redlock: the longest, on any node)."""
        return max(int(raw.pttl(redis_keys(name).lock)) for raw in self.raws())

    def target(self) -> Any:
        """What to pass to `fencelock.connect` to use your own redis-py client(s)."""
        raws = self.raws()
        return raws if isinstance(self.servers, RedisNodes) else raws[0]

    def pause(self) -> None:
        self.servers.pause()

    def resume(self) -> None:
        self.servers.resume()


@pytest.fixture(scope="session")
def standalone() -> Iterator[RedisServer]:
    _require_server_binary()
    with RedisServer(name="shared") as server:
        yield server


@pytest.fixture(scope="session")
def cluster() -> Iterator[RedisClusterServers]:
    _require_server_binary()
    with RedisClusterServers(3) as servers:
        yield servers


def initialise_redlock(urls: list[str]) -> None:
    """A first acquisition with every node up: a new Redlock deployment counts all its nodes from then on."""
    locks = fencelock.connect(urls)
    try:
        locks.acquire("fencelock-tests:init", ttl=1.0, wait=5.0).release()
    finally:
        locks.close()


@pytest.fixture(scope="session")
def redlock_nodes() -> Iterator[RedisNodes]:
    _require_server_binary()
    nodes = RedisNodes(5).start()
    initialise_redlock(nodes.urls)
    yield nodes
    nodes.close()


@pytest.fixture(params=["redis", "cluster", "redlock"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    """Every behavioural test runs on a single Redis, on a Redis Cluster of three masters, and on Redlock over
    five independent nodes."""
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("standalone")
        return Deployment("redis", server.url, server)
    if request.param == "cluster":
        servers: RedisClusterServers = request.getfixturevalue("cluster")
        return Deployment("cluster", servers.url, servers)
    nodes: RedisNodes = request.getfixturevalue("redlock_nodes")
    return Deployment("redlock", nodes.urls, nodes)


@pytest.fixture(params=["redis", "cluster", "redlock"])
def own_deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """Like `deployment`, but started for this test alone: for tests that pause or kill servers."""
    _require_server_binary()
    if request.param == "redis":
        with RedisServer(name="own") as server:
            yield Deployment("redis", server.url, server)
    elif request.param == "cluster":
        with RedisClusterServers(3) as servers:
            yield Deployment("cluster", servers.url, servers)
    else:
        nodes = RedisNodes(5).start()
        try:
            initialise_redlock(nodes.urls)
            yield Deployment("redlock", nodes.urls, nodes)
        finally:
            nodes.close()


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
    client = fencelock.connect(deployment.url)
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
            pytest.fail("CI must run the ZooKeeper tests: pip install -e '.[test]' installs kazoo")
        pytest.skip("kazoo is not installed: pip install -e '.[test]' (or 'fencelock[zookeeper]')")


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[Any]:
    """One standalone ZooKeeper for the session; every test gets its own chroot on it (`zk`)."""
    _require_zookeeper()
    from fencelock.testing.zookeeper import ZooKeeperServer
    with ZooKeeperServer(name="zk-shared") as server:
        yield server


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
