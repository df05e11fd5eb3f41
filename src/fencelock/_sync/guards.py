# Generated from _async/guards.py by scripts/unasync.py: do not edit, edit that file instead.
"""The Redis fencing guard: storage kept in Redis rejects writes from stale holders, atomically.

A fencing token is useless unless the resource checks it. The guard keeps, per lock name, the highest fence it
has accepted (`fencelock:{name}:guard`) and writes a value only if the writer's fence is not lower, in one Lua
script (`_scripts/guard_set.lua`), so no stale write can slip in between the check and the write.
"""

from __future__ import annotations

from typing import Any

from redis import Redis, RedisCluster

from .._errors import BackendError, StaleFence
from .._logic.args import check_name, check_text
from .._logic.fencing import check_fence, check_value
from .._redis.keys import PREFIX, check_data_key, tag
from .._scripts import GUARD_SET
from .redis_commands import CLIENT_ERRORS, run_script


class RedisGuard:
    """Guarded writes to a Redis that holds the protected data (it may be the lock's Redis or another one)."""

    def __init__(self, client: Redis | RedisCluster, *, prefix: str = PREFIX) -> None:
        self._client = client
        self._prefix = prefix

    def key(self, name: str, suffix: str) -> str:
        """A data key in the same hash slot as `name`'s guard key: use it for guarded data on Redis Cluster."""
        name = check_name(name)
        return f"{tag(name, self._prefix)}:data:{check_text(suffix, 'suffix', name)}"

    def _guard_key(self, name: str) -> str:
        return f"{tag(name, self._prefix)}:guard"

    def set(self, name: str, fence: int, key: str, value: str | bytes | int | float) -> None:
        """SET `key` to `value` if `fence` is at least the highest fence accepted for `name`; else `StaleFence`.
        On a Redis Cluster `key` must be in the guard's hash slot (`key()` gives such keys): else `ValueError`,
        before anything is sent."""
        name = check_name(name)
        fence = check_fence(fence, name)
        key = check_text(key, "key", name)
        value = check_value(value, name)
        # The data key and value are the caller's: encoded as their client encodes them (fencelock's own key and
        # arguments go as UTF-8, `run_script`).
        encoder: Any = self._client.get_encoder()
        guard_key, data_key = self._guard_key(name), bytes(encoder.encode(key))
        check_data_key(guard_key, data_key, name, isinstance(self._client, RedisCluster))
        accepted, highest = run_script(self._client, GUARD_SET, [guard_key, data_key],
                                             [str(fence), encoder.encode(value)], name=name,
                                             where="the guarded Redis")
        if accepted != 1:
            highest = int(highest)  # a decimal string from the script: every digit, never a double
            raise StaleFence(f"write with fence {fence} rejected: fence {highest} was already accepted",
                             name=name, fence=fence, highest=highest)

    def highest(self, name: str) -> int | None:
        """The highest fence accepted so far for `name`, or None."""
        name = check_name(name)
        client: Any = self._client
        try:
            value = client.get(self._guard_key(name).encode("utf-8"))
        except CLIENT_ERRORS as exc:
            raise BackendError(f"reading the guard failed: {type(exc).__name__}: {exc}", name=name) from exc
        return None if value is None else int(value)
