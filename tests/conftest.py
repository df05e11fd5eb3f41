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
from fencelock.testing.servers import RedisClusterServers, RedisServer, find_server_binary

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
    """A lock service under test: its URL, a direct client to look at its keys, and its fault switches."""

    kind: str
    url: str
    servers: RedisServer | RedisClusterServers

    def raw(self) -> Any:
        """A plain redis-py client (Redis or RedisCluster) for looking behind fencelock's back."""
        return self.servers.client()

    def pause(self) -> None:
        self.servers.pause()

    def resume(self) -> None:
        self.servers.resume()

    def url_with(self, query: str) -> str:
        sep = "&" if "?" in self.url else "?"
        return f"{self.url}{sep}{query}"


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


@pytest.fixture(params=["redis", "cluster"])
def deployment(request: pytest.FixtureRequest) -> Deployment:
    """Every behavioural test runs on a single Redis and on a Redis Cluster of three masters."""
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("standalone")
        return Deployment("redis", server.url, server)
    servers: RedisClusterServers = request.getfixturevalue("cluster")
    return Deployment("cluster", servers.url, servers)


@pytest.fixture(params=["redis", "cluster"])
def own_deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """Like `deployment`, but started for this test alone: for tests that pause or kill servers."""
    _require_server_binary()
    if request.param == "redis":
        with RedisServer(name="own") as server:
            yield Deployment("redis", server.url, server)
    else:
        with RedisClusterServers(3) as servers:
            yield Deployment("cluster", servers.url, servers)


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
