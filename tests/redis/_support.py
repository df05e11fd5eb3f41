"""What the idle-connection and lost-reply tests share: a deployment of each Redis kind (one per test module, as
their tests close every client connection on its servers) and the lock key's PTTL on each of its servers; and
what tests that count a server's commands need to tell fencelock's one background eviction check apart."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fencelock._redis.keys import redis_keys
from fencelock._scripts import EVICTION
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


def eviction_checks(raw: Any) -> int:
    """How many times clients sent this server the eviction script (each client once, after its first grant
    there), from its slow log, which must log every command (`slowlog-log-slower-than 0`). Each sending begins
    with the script's EVALSHA (an EVAL of its source follows if the server did not have it yet)."""
    entries: Any = raw.slowlog_get(10000)
    return sum(1 for entry in entries if bytes(entry["command"]).startswith(b"EVALSHA " + EVICTION.sha.encode()))
