"""The fault matrix: every fault at every request fencelock sends, sync and asyncio, on one Redis, a Redis Cluster
and Redlock, ZooKeeper's row (its faults and requests: `cells.ZOOKEEPER_FAULTS`, `cells.ZOOKEEPER_REQUESTS`) and
etcd's (`cells.ETCD_FAULTS`, `cells.ETCD_REQUESTS`), each cell checked against the invariants
(`fencelock.testing.invariants`) by a watcher that reads the servers directly. See `scenario.py` for the story
every cell runs.

Each backend runs every fault x request once, on a front end picked by a seeded coin (the Cluster always on the
other one than the single Redis, so that each fault x request runs on both); asyncio cancellation after each
request a call sends is its own table. `--duration S` adds a randomised soak of S seconds (`--seed N` picks its
cells); the options are this folder's, so name it on the command line:

    pytest tests/matrix -k soak --duration 600 --seed 7
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import random
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from tests.conftest import _require_zookeeper, require_etcd_binary

from .cells import (
    DURABLE_TARGETS,
    ETCD_FAULTS,
    ETCD_REQUESTS,
    FAULTS,
    PAST_TTL_FAULT,
    PAST_TTL_REQUESTS,
    REQUESTS,
    ZOOKEEPER_FAULTS,
    ZOOKEEPER_REQUESTS,
    Cell,
    random_cell,
)
from .rigs import Rig, start_rig
from .scenario import run_cancel_cell, run_cell

SEED = 14
FRONTS = ["sync", "async"]


def _cells(kind: str) -> list[Cell]:
    """Every fault x request; the front end alternates by a seeded coin, the Cluster's opposite to the single
    Redis's, so that each fault x request runs on both front ends."""
    rng = random.Random(f"{SEED}:{'redis' if kind in ('redis', 'cluster') else kind}")
    cells = []
    for fault, request in itertools.product(FAULTS, REQUESTS):
        front = rng.randrange(2) ^ (kind == "cluster")
        if not (kind == "redlock" and request == "acquire_fair"):
            cells.append(Cell(FRONTS[front], fault, request))
    for request in PAST_TTL_REQUESTS:
        front = rng.randrange(2) ^ (kind == "cluster")
        if not (kind == "redlock" and request == "acquire_fair"):
            cells.append(Cell(FRONTS[front], PAST_TTL_FAULT, request))
    return cells


def _zookeeper_cells() -> list[Cell]:
    """ZooKeeper's row (`ZOOKEEPER_FAULTS` x `ZOOKEEPER_REQUESTS`), the front end by a seeded coin."""
    rng = random.Random(f"{SEED}:zookeeper")
    return [Cell(FRONTS[rng.randrange(2)], fault, request)
            for fault, request in itertools.product(ZOOKEEPER_FAULTS, ZOOKEEPER_REQUESTS)]


def _etcd_cells() -> list[Cell]:
    """etcd's row (`ETCD_FAULTS` x `ETCD_REQUESTS`), the front end by a seeded coin."""
    rng = random.Random(f"{SEED}:etcd")
    return [Cell(FRONTS[rng.randrange(2)], fault, request)
            for fault, request in itertools.product(ETCD_FAULTS, ETCD_REQUESTS)]


CANCEL_REQUESTS = [r for r in REQUESTS if r != "renewal"]  # the watchdog's own task is not the caller's to cancel
CLUSTER_CANCEL = ["acquire", "extend_same", "release"]
"""The Cluster's cancellation cells: what differs from one Redis there is redis-py's cluster client (a cancelled
command makes it read the cluster's layout again, seconds per cell), so only one request of each kind."""
DURABLE_CANCEL = ["acquire", "acquire_fair", "extend_same", "extend_longer", "exit"]
"""`durability=`'s cancellation cells: a cancellation while the WAIT's reply is awaited, on grants and extends."""
ZOOKEEPER_CANCEL = [r for r in ZOOKEEPER_REQUESTS if r != "renewal"]
"""ZooKeeper's cancellation cells: every request of its row that a caller sends."""
ETCD_CANCEL = [r for r in ETCD_REQUESTS if r != "renewal"]
"""etcd's cancellation cells: every request of its row that a caller sends."""
_KINDS = {"redis": CANCEL_REQUESTS, "cluster": CLUSTER_CANCEL, "redlock": CANCEL_REQUESTS, "durable": DURABLE_CANCEL,
          "zookeeper": ZOOKEEPER_CANCEL, "etcd": ETCD_CANCEL}
CANCEL_CELLS = [(kind, request) for kind, requests in _KINDS.items() for request in requests]


@pytest.fixture(scope="module")
def redis_rig() -> Iterator[Rig]:
    with start_rig("redis") as rig:
        yield rig


@pytest.fixture(scope="module")
def cluster_rig() -> Iterator[Rig]:
    with start_rig("cluster") as rig:
        yield rig


@pytest.fixture(scope="module")
def durable_rig() -> Iterator[Rig]:
    with start_rig("durable") as rig:
        yield rig


@pytest.fixture(scope="module")
def zookeeper_rig() -> Iterator[Rig]:
    _require_zookeeper()
    with start_rig("zookeeper") as rig:
        yield rig


@pytest.fixture(scope="module")
def etcd_rig() -> Iterator[Rig]:
    require_etcd_binary()
    with start_rig("etcd") as rig:
        yield rig


@pytest.fixture(scope="module")
def redlock_rig() -> Iterator[Rig]:
    with start_rig("redlock") as rig:
        yield rig


def _run(coro: Coroutine[Any, Any, list[str]]) -> list[str]:
    """Run a cell; what it left unclosed is collected now, so that a leak fails this cell, not a later one."""
    try:
        return asyncio.run(coro)
    finally:
        gc.collect()


def _assert_cell(rig: Rig, cell: Cell) -> None:
    problems = _run(run_cell(rig, cell))
    assert not problems, f"{rig.kind} {cell}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("cell", _cells("redis"), ids=str)
def test_redis(redis_rig: Rig, cell: Cell) -> None:
    _assert_cell(redis_rig, cell)


@pytest.mark.parametrize("cell", _cells("cluster"), ids=str)
def test_cluster(cluster_rig: Rig, cell: Cell) -> None:
    _assert_cell(cluster_rig, cell)


@pytest.mark.parametrize("cell", [c for c in _cells("durable") if c.request in DURABLE_TARGETS | {"exit"}], ids=str)
def test_durable(durable_rig: Rig, cell: Cell) -> None:
    _assert_cell(durable_rig, cell)


@pytest.mark.parametrize("cell", _cells("redlock"), ids=str)
def test_redlock(redlock_rig: Rig, cell: Cell) -> None:
    _assert_cell(redlock_rig, cell)


@pytest.mark.parametrize("cell", _zookeeper_cells(), ids=str)
def test_zookeeper(zookeeper_rig: Rig, cell: Cell) -> None:
    _assert_cell(zookeeper_rig, cell)


@pytest.mark.parametrize("cell", _etcd_cells(), ids=str)
def test_etcd(etcd_rig: Rig, cell: Cell) -> None:
    _assert_cell(etcd_rig, cell)


@pytest.mark.parametrize(("kind", "request_name"), CANCEL_CELLS, ids=[f"{k}-{r}" for k, r in CANCEL_CELLS])
def test_cancel_at_every_request(kind: str, request_name: str, request: pytest.FixtureRequest) -> None:
    if kind == "redlock" and request_name == "acquire_fair":
        request_name = "acquire"  # Redlock has no fair mode
    rig: Rig = request.getfixturevalue(f"{kind}_rig")
    problems = _run(run_cancel_cell(rig, request_name))
    assert not problems, f"{kind} async-cancel-{request_name}:\n  " + "\n  ".join(problems)


def test_soak(request: pytest.FixtureRequest, redis_rig: Rig, cluster_rig: Rig, redlock_rig: Rig,
              durable_rig: Rig, zookeeper_rig: Rig, etcd_rig: Rig) -> None:
    """Random cells (`--seed`) of every row for `--duration` seconds; without --duration, one of them."""
    seed = int(request.config.getoption("seed", SEED))
    duration = float(request.config.getoption("duration", 0.0))
    rng = random.Random(seed)
    rigs = {"redis": redis_rig, "cluster": cluster_rig, "redlock": redlock_rig, "durable": durable_rig,
            "zookeeper": zookeeper_rig, "etcd": etcd_rig}
    end = time.monotonic() + duration
    failures = []
    runs = 0
    while runs < 1 or time.monotonic() < end:
        kind, cell = random_cell(rng, list(rigs))
        problems = _run(run_cell(rigs[kind], cell))
        failures += [f"{kind} {cell} (held back {cell.held_back:.2f}s): {line}" for line in problems]
        runs += 1
    assert not failures, f"seed {seed}, {runs} cells:\n  " + "\n  ".join(failures)
