"""The Redis backend's renewals: the watchdog's batch of extends, in script calls of at most `BATCH` leases, one
pipeline per server (per primary on a Cluster). `RedisRenewal`: a base of `AsyncRedisBackend`."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from redis.crc import key_slot
from redis.exceptions import AskError, NoScriptError

from .._errors import BackendError, NotDurable
from .._redis.channel import PATIENCE
from .._redis.durability import Durability, Unsupported
from .._redis.fences import fence_keep_ms
from .._redis.keys import redis_keys
from .._redis.request import Confirmed
from .._redis.resp import utf8
from .._scripts import EXTEND_MANY, Lua
from ._cluster import cluster_refresh, node_of, node_redis
from ._fanout import fan_out
from .redis_commands import BATCH, CLIENT_ERRORS, AnyRedis, socket_timeout


class RedisRenewal:
    """`extend_many` and `renewal_group`: a base class of `AsyncRedisBackend`, which sets the attributes declared
    here and sends a single call with its `_run`."""

    _client: AnyRedis
    _cluster: bool
    _prefix: str
    _durability: Durability | None
    _fence_retention: float
    _node_clients: dict[str, Any]
    renewal_requests: int

    if TYPE_CHECKING:
        async def _run(self, lua: Lua, name: str, keys: list[str], args: list[Any],
                       wake: tuple[str, float] | None = None, confirm: bool = False) -> Any: ...

    def renewal_group(self, name: str) -> object:
        """Which server renews `name` (the watchdog sends a batch per server): on a Cluster, the primary of its
        slot as the client last read the layout (None: one Redis, or not known)."""
        if not self._cluster:
            return None
        node = node_of(self._client, redis_keys(name, self._prefix).lock.encode())
        return None if node is None else node.name

    async def extend_many(self, leases: list[tuple[str, str, int, int]]) -> list[bool | None]:
        """The watchdog's batch: (name, token, fence, ttl_ms) each; True extended, False not ours, None no answer.

        Leases go in script calls of at most `BATCH` (on a Cluster, one slot per call). All the calls for one
        server travel in one pipeline: one round trip however many leases are due. A Cluster's primaries are
        asked at once, each bounded by its own socket timeout, so a stalled one delays none of the others.
        """
        groups: dict[int, list[int]] = {}
        for i, (name, _, _, _) in enumerate(leases):
            slot = key_slot(redis_keys(name, self._prefix).lock.encode()) if self._cluster else 0
            groups.setdefault(slot, []).append(i)
        calls: list[list[int]] = []
        for members in groups.values():
            calls.extend(members[start:start + BATCH] for start in range(0, len(members), BATCH))
        results: list[bool | None] = [None] * len(leases)
        if not self._cluster:
            await self._extend_pipelined(self._client, calls, leases, results, self._durability)
            return results
        if self._durability is not None:  # confirmed per slot, over the slot primary's own connections
            for members in calls:
                _apply(results, members, await self._extend_call(leases, members))
            return results
        by_node: dict[str, tuple[Any, list[list[int]]]] = {}
        for members in calls:
            node = node_of(self._client, redis_keys(leases[members[0]][0], self._prefix).lock.encode())
            if node is not None:  # (not known: no answer; the next renewal reads the layout again)
                by_node.setdefault(node.name, (node, []))[1].append(members)
        jobs = [partial(self._extend_on_node, node, node_calls, leases, results)
                for node, node_calls in by_node.values()]
        timeout = socket_timeout(self._client) or PATIENCE
        await fan_out(jobs, 2 * timeout + 1.0, lambda done: len(done) == len(jobs))
        return results

    async def _extend_on_node(self, node: Any, calls: list[list[int]], leases: list[tuple[str, str, int, int]],
                              results: list[bool | None]) -> None:
        """One Cluster primary's share of a batch, pipelined on a plain client of that node (redis-py sends no
        script in a cluster pipeline). A slot that moved answers MOVED: the layout is read again for the next."""
        try:
            moved = await self._extend_pipelined(node_redis(self._client, node, self._node_clients), calls,
                                                 leases, results, None)
            if moved:
                await cluster_refresh(self._client)
        except Exception:  # (anything: those leases just got no answer)
            return

    async def _extend_pipelined(self, client: Any, calls: list[list[int]], leases: list[tuple[str, str, int, int]],
                                results: list[bool | None], durability: Durability | None) -> bool:
        """`calls` in one pipeline on `client` (one server), their answers spread over `results`. True if a slot
        answered MOVED or ASK (it is served elsewhere now)."""
        moved = False
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            for members in calls:
                keys, args = self._extend_args(leases, members)
                pipe.evalsha(EXTEND_MANY.sha, len(keys), *utf8(keys), *utf8(args))
            if durability is not None:  # the whole batch's writes, confirmed at once
                pipe.execute_command(*durability.command)
            self.renewal_requests += len(calls)
            try:
                replies = await pipe.execute(raise_on_error=False)
            except CLIENT_ERRORS:
                return moved
            if durability is not None and not self._batch_confirmed(replies.pop()):
                return moved  # not confirmed: no answer counted (the leases keep the validity they had)
            missing = []
            for members, reply in zip(calls, replies, strict=True):
                if isinstance(reply, NoScriptError):
                    missing.append(members)
                else:
                    moved = moved or isinstance(reply, AskError)
                    _apply(results, members, reply)
            if not missing or attempt:
                break
            # The server lost its scripts (restart, failover, SCRIPT FLUSH): load once, then send again what
            # failed, still in one pipeline, rather than one call after another.
            try:
                await client.script_load(EXTEND_MANY.source.encode("utf-8"))
            except CLIENT_ERRORS:
                break
            calls = missing
        return moved

    def _batch_confirmed(self, confirmation: Any) -> bool:
        assert self._durability is not None
        try:
            return self._durability.confirmed(confirmation)
        except Unsupported:
            return False

    def _extend_args(self, leases: list[tuple[str, str, int, int]], members: list[int]) -> tuple[list[str], list[Any]]:
        keys: list[str] = []
        args: list[Any] = []
        for i in members:
            name, token, _, ttl = leases[i]
            lease_keys = redis_keys(name, self._prefix)
            keys += [lease_keys.lock, lease_keys.fence]
            args += [token, ttl, fence_keep_ms(self._fence_retention, ttl)]
        return keys, args

    async def _extend_call(self, leases: list[tuple[str, str, int, int]], members: list[int]) -> Any:
        keys, args = self._extend_args(leases, members)
        self.renewal_requests += 1
        try:
            reply = await self._run(EXTEND_MANY, leases[members[0]][0], keys, args, confirm=True)
        except BackendError as exc:
            return exc
        if isinstance(reply, Confirmed):
            return reply.reply if self._batch_confirmed(reply.confirmation) else NotDurable("not confirmed")
        return reply



def _apply(results: list[bool | None], members: list[int], reply: Any) -> None:
    """Spread one batch script's answers (1 extended, 0 not ours) over the leases it carried."""
    if isinstance(reply, Exception):
        return
    for i, code in zip(members, reply, strict=True):
        results[i] = int(code) == 1
