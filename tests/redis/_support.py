"""What the idle-connection and lost-reply tests share: a deployment of each Redis kind (one per test module, as
their tests close every client connection on its servers) and the lock key's PTTL on each of its servers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fencelock._redis.keys import redis_keys
from fencelock.testing import ClusterDeployment, RedisDeployment, RedlockDeployment
from tests.conftest import RedisFamily, _require_server_binary

KINDS = ["redis", "cluster", "redlock"]


def _start(kind: str) -> RedisFamily:
    _require_server_binary()
    if kind == "redis":
        return RedisDeployment.start()
    if kind == "cluster":
        return ClusterDeployment.start(3)
    return RedlockDeployment.start(5)


@pytest.fixture(scope="module", params=KINDS)
def idle_deployment(request: pytest.FixtureRequest) -> Iterator[RedisFamily]:
    """A deployment of this module's own: its tests close every client connection on the servers."""
    deployment = _start(request.param)
    try:
        yield deployment
    finally:
        deployment.close()


def _pttls(deployment: RedisFamily, name: str) -> list[int]:
    key = redis_keys(name).lock
    return [int(raw.pttl(key)) for raw in deployment.raws()]
