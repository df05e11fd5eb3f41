"""What the etcd tests read behind fencelock's back: a name's keys, the server's leases, a queue's length."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import fencelock
from fencelock._etcd.rules import name_dir, range_end
from fencelock.testing.etcd import EtcdCluster


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def keys_of(cluster: EtcdCluster, name: str) -> list[dict[str, Any]]:
    """The name's keys on the server, oldest first (each with create_revision, lease and value)."""
    directory = name_dir("fencelock", name)
    answer = cluster.request("/v3/kv/range", {"key": b64(directory), "range_end": b64(range_end(directory)),
                                              "sort_order": "ASCEND", "sort_target": "CREATE"})
    found: list[dict[str, Any]] = answer.get("kvs", [])
    return found


def leases_of(cluster: EtcdCluster) -> set[int]:
    return {int(lease["ID"]) for lease in cluster.request("/v3/lease/leases", {}).get("leases", [])}


def lease_ttl(cluster: EtcdCluster, lease: int) -> int:
    """Seconds the server still gives the lease (-1: it has no such lease)."""
    return int(cluster.request("/v3/lease/timetolive", {"ID": lease}).get("TTL", 0))


async def queued(locks: fencelock.aio.Locks, name: str, waiters: int, timeout: float = 5.0) -> None:
    backend: Any = locks.backend
    for _ in range(int(timeout / 0.02)):
        if (await backend.status(name)).queued == waiters:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{waiters} waiters did not queue within {timeout} s")


def lease_keys(cluster: EtcdCluster, lease: int) -> list[bytes]:
    """The keys attached to `lease` (the server's own answer; none when it carries no key)."""
    answer = cluster.request("/v3/lease/timetolive", {"ID": lease, "keys": True})
    return [base64.b64decode(key) for key in answer.get("keys", [])]
