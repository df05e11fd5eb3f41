"""The Redlock backend: one lock over N independent Redis masters, with fencing tokens.

The backend carries bytes and the model decides: every rule (quorum, tallies, rounds, heal, repair) is a pure
function in `fencelock._redis.redlock`; this module sends to every node at once what the model says, each with a
per-node timeout, and feeds the replies back.
"""

from __future__ import annotations

import random
import secrets
import time
import zlib
from functools import partial
from typing import Any

from redis.asyncio import Redis

from .._errors import BackendError, QuorumUnavailable
from .._events import emit
from .._logic.args import DEFAULT_TTL
from .._logic.outcomes import Attempt, Released
from .._logic.status import LockStatus, NodeView, majority_status
from .._logic.timing import backoff
from .._redis.channel import ScriptRequest
from .._redis.keys import PREFIX, RedisKeys, fair_keys, redis_keys
from .._redis.redlock import (
    DEFAULT_REPAIR_DELAY,
    GATE_TIMEOUT,
    MAX_ROUNDS,
    NEW_DEPLOYMENT,
    NO_ANSWER,
    REPAIR_BATCH,
    Answer,
    GateView,
    Heal,
    Next,
    NodesReport,
    Repair,
    batch_outcomes,
    batch_settled,
    decide,
    default_node_timeout,
    deployment_id,
    deployment_step,
    extend_outcome,
    fallback_pause,
    fresh_window,
    learned,
    look_timeout,
    mark_args,
    marked,
    marker_floor,
    next_proposal,
    next_step,
    node_answer,
    node_code,
    node_states,
    plan_heal,
    quorum,
    release_outcome,
    repair_marks,
    repair_progress,
    repaired,
    settled,
    tally,
    unavailable,
    verdict,
)
from .._scripts import (
    EVICTION,
    FORCE_RELEASE,
    REDLOCK_ACQUIRE,
    REDLOCK_EXTEND,
    REDLOCK_EXTEND_MANY,
    REDLOCK_GATE,
    REDLOCK_MARK,
    REDLOCK_RELEASE,
    STATUS,
)
from ._concurrency import in_background, sleep, then
from ._connection import close_client
from ._fanout import fan_out
from ._multiplex import run_scripts
from ._transport import Channel, call_script
from .redis import (
    BATCH,
    CLIENT_ERRORS,
    MIN_BLOCK,
    run_script,
    scan_names,
    socket_timeout,
    wait_for_wake,
    warn_if_evicting,
)

SCAN_TIMEOUT = 10.0  # seconds: the longest one node's SCAN for `list` is given


class AsyncRedlockBackend:
    """Locks held by a quorum of independent Redis masters (not replicas, not a Cluster).

    It carries bytes and the model decides: each reply goes back to a `fencelock._redis.redlock` function, which
    says what to send next."""

    def __init__(self, clients: list[Redis], *, owns_clients: bool, shown: list[str], prefix: str = PREFIX,
                 node_timeout: float | None = None, repair: bool = True,
                 repair_delay: float = DEFAULT_REPAIR_DELAY) -> None:
        self._nodes = clients
        self._channels = [Channel(client) for client in clients]  # dedicated connections for the scripts
        self._owns_clients = owns_clients
        self._n = len(clients)
        self._q = quorum(self._n)
        self._shown = shown
        self.shown = f"redlock over {self._n} nodes: {', '.join(shown)}"
        self._prefix = prefix
        self._node_timeout = node_timeout
        self._repair = repair
        self._repair_delay_ms = max(1, round(repair_delay * 1000))
        self._window_ms = max(1, round(fresh_window(repair_delay) * 1000))
        self._marker = f"{prefix}:redlock:node"
        # (fencelock:redlock:seen is an older version's: a data set it marked seen is not a new one.)
        self._gate_keys = [self._marker, f"{prefix}:redlock:incarnation", f"{prefix}:redlock:seen"]
        self._known: dict[str, int] = {}  # name -> the highest hwm seen: where the next proposal starts
        self._repairing: set[int] = set()
        self._healing = False
        self._closed = False
        self._eviction_checked = False  # (once per client, after its first grant: `_check_eviction`)
        self.supports_fair = False  # a fair queue would need a quorum of its own: not offered on Redlock
        self.always_queues = False
        self.renewal_requests = 0  # script calls the watchdog made (for benchmarks)
        self._rng = random.Random()
        # A waiter blocks on its home node's wake list; one wait must end before that socket's timeout does.
        timeouts = [socket_timeout(client) for client in clients]
        self.block_cap = 30.0 if None in timeouts else max(MIN_BLOCK, min(t for t in timeouts if t) * 0.75)

    def retry_after(self, exc: BackendError, failures: int) -> float | None:
        """No quorum answered: try again after a jittered back-off, while the caller's wait allows."""
        return backoff(failures - 1, self._rng, base=0.01, cap=0.25) if isinstance(exc, QuorumUnavailable) else None

    def _timeout(self, ttl: float) -> float:
        return self._node_timeout if self._node_timeout is not None else default_node_timeout(ttl)

    # -- one node ---------------------------------------------------------------------------------------------

    async def _release_on(self, i: int, keys: RedisKeys, token: str, t: int) -> int:
        """Give back one node's key (a background cleanup), on that node's channel. After `aclose` it is skipped,
        and the key's TTL frees it. One begun before `aclose` never keeps or makes a connection after it (the
        channel's generation, read before the closed flag: `aclose` sets the flag first)."""
        channel = self._channels[i]
        generation = channel.generation
        if self._closed:
            return NO_ANSWER
        script_keys = [keys.lock, keys.fence, keys.waiters, keys.wake]
        return node_code(await call_script(channel, REDLOCK_RELEASE, script_keys, [token, t], generation=generation))

    async def _check_eviction(self, i: int, name: str, key: str, generation: int) -> None:
        """Warn (an "evicting" event) if node `i` may evict held locks (`eviction_risk`). Begun before `aclose`
        (`generation`: the node channel's when it was started), it makes no connection after it."""
        if not self._closed:
            reply = await call_script(self._channels[i], EVICTION, [key], [], generation=generation)
            if not isinstance(reply, Exception):
                warn_if_evicting(reply, name, "redlock", self._shown[i])

    # -- the protocol -----------------------------------------------------------------------------------------

    async def try_acquire(self, name: str, token: str, ttl_ms: int, wait: float = 0.0,
                          fair: bool = False) -> Attempt:
        """One attempt: propose t to every node at once; on a stale t, propose again above what was learnt."""
        keys = redis_keys(name, self._prefix)
        released = 0  # the fence of the release that woke us, if one did
        if wait > 0.0:
            # Every release pushes a wake-up on every node; the waiters of one name all block on the same node.
            at = zlib.crc32(name.encode()) % self._n
            try:
                woken = await wait_for_wake(self._nodes[at], keys.wake, wait, name=name, where=self._shown[at])
            except BackendError:
                woken = None  # that node refuses BLPOP: the pause below (the other nodes may be fine)
            if woken is None:
                # That node failed: a short jittered pause instead, so that contenders do not collide again.
                await sleep(self._rng.uniform(0.0, fallback_pause(wait)))
            elif woken:
                released = woken  # the release told us its fence: propose above it at once
                self._known[name] = max(self._known.get(name, 0), woken)
        timeout = self._timeout(ttl_ms / 1000.0)
        n = self._n
        t = next_proposal(self._known.get(name, 0), ())
        for rounds in range(1, MAX_ROUNDS + 1):
            script_keys, args = [keys.lock, keys.fence, self._marker, keys.waiters], [token, ttl_ms, t]
            requests = [ScriptRequest(channel, REDLOCK_ACQUIRE, script_keys, args) for channel in self._channels]
            done, handles = await run_scripts(requests, timeout,
                                              lambda so_far: decide(map(node_answer, so_far.values()), n) is not None)
            answers = [node_answer(done.get(i)) for i in range(n)]  # no answer in time counts as a failure
            self._learn(name, answers, t)
            counted = tally(answers, n, self._healing)
            if counted.heal is Heal.BACKGROUND:
                in_background(partial(self._heal, timeout))
            # Give back each after its own request finished, matching t, so no later round's grant is touched.
            for i in counted.give_back:
                then(handles[i], partial(self._release_on, i, keys, token, t))
            healed, views = await self._heal(timeout) if counted.heal is Heal.NOW else (False, None)
            step = next_step(answers, counted, t, n, rounds=rounds, healed=healed, released=released,
                             timeout=timeout)
            if step.next is Next.UNAVAILABLE:
                raise self._unavailable(step.why, name, answers, views)
            if step.next is not Next.PROPOSE:
                if step.next is Next.GRANT and not self._eviction_checked:
                    self._eviction_checked = True
                    for i in range(n):
                        in_background(partial(self._check_eviction, i, name, keys.lock, self._channels[i].generation))
                return Attempt(step.next is Next.GRANT, step.t, step.retry_in)
            t = step.t
        raise AssertionError("next_step proposes no round past MAX_ROUNDS")

    def _learn(self, name: str, answers: list[Answer], t: int) -> None:
        """Remember where the next attempt's proposal starts (`learned`)."""
        if len(self._known) > 10_000:
            self._known.clear()  # only a hint for the first proposal: forgetting costs one round
        self._known[name] = learned(self._known.get(name, 0), answers, t)

    async def release(self, name: str, token: str, fence: int) -> Released:
        keys = redis_keys(name, self._prefix)
        script_keys, args = [keys.lock, keys.fence, keys.waiters, keys.wake], [token, fence]
        requests = [ScriptRequest(channel, REDLOCK_RELEASE, script_keys, args) for channel in self._channels]
        done, _ = await run_scripts(requests, self._timeout(DEFAULT_TTL), self._settled)
        results = [node_code(done.get(i)) for i in range(self._n)]
        outcome = release_outcome(results, self._n)
        if outcome is None:
            raise QuorumUnavailable(f"the release reached {self._n - results.count(NO_ANSWER)} of {self._n} nodes: "
                                    "whether a majority held the lease is unknown; release again", name=name)
        return outcome

    async def extend(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        keys = redis_keys(name, self._prefix)
        script_keys, args = [keys.lock, keys.fence], [token, ttl_ms, fence]
        requests = [ScriptRequest(channel, REDLOCK_EXTEND, script_keys, args) for channel in self._channels]
        done, handles = await run_scripts(requests, self._timeout(ttl_ms / 1000.0), self._settled)
        results = [node_code(done.get(i)) for i in range(self._n)]
        extended = extend_outcome(results, self._n)
        if extended:
            return True
        if extended is None:
            raise QuorumUnavailable(f"the extend reached {self._n - results.count(NO_ANSWER)} of {self._n} nodes: "
                                    "whether a majority extended the lease is unknown", name=name)
        # Lost: a minority still holds keys of ours, which only get in others' way. Give them back.
        for i, handle in enumerate(handles):
            then(handle, partial(self._release_on, i, keys, token, fence))
        return False

    def _settled(self, done: dict[int, Any]) -> bool:
        return settled([node_code(reply) for reply in done.values()], self._n)

    async def leave(self, name: str, token: str) -> None:
        """Redlock has no fair queue: nothing to leave."""

    async def extend_many(self, leases: list[tuple[str, str, int, int]]) -> list[bool | None]:
        """The watchdog's batch on every node at once; a lease is extended where a quorum extended it."""
        calls = [partial(self._extend_many_on, j, leases) for j in range(self._n)]
        longest = max(ttl for _, _, _, ttl in leases) / 1000.0
        count = len(leases)
        done, _ = await fan_out(calls, self._timeout(longest), lambda so_far: batch_settled(so_far, count, self._n),
                                lanes=self._channels)
        return batch_outcomes(done, count, self._n)

    async def _extend_many_on(self, j: int, leases: list[tuple[str, str, int, int]]) -> list[int] | None:
        codes: list[int] = []
        for start in range(0, len(leases), BATCH):
            keys: list[str] = []
            args: list[Any] = []
            for name, token, fence, ttl in leases[start:start + BATCH]:
                k = redis_keys(name, self._prefix)
                keys += [k.lock, k.fence]
                args += [token, ttl, fence]
            self.renewal_requests += 1
            try:
                reply = await run_script(self._nodes[j], REDLOCK_EXTEND_MANY, keys, args, name=leases[start][0],
                                         where=self._shown[j])
            except BackendError:
                return None
            codes += [int(code) for code in reply]
        return codes

    # -- operators (fencelock status / list / release --force) -----------------------------------------------

    async def _views(self, lua: Any, name: str, removing: bool) -> list[NodeView | None]:
        """`lua` (status or force_release) on every node at once; None for a node that did not answer."""
        keys = redis_keys(name, self._prefix)
        deadlines, _ = fair_keys(name, self._prefix)
        script_keys = ([keys.lock, keys.fence, keys.waiters, keys.wake, keys.queue, deadlines] if removing
                       else [keys.lock, keys.fence, deadlines])
        requests = [ScriptRequest(channel, lua, script_keys, []) for channel in self._channels]
        done, _ = await run_scripts(requests, look_timeout(self._timeout(DEFAULT_TTL)),
                                    lambda so_far: len(so_far) == self._n)
        views: list[NodeView | None] = []
        for i in range(self._n):
            reply = done.get(i)
            views.append(None if reply is None or isinstance(reply, Exception) else NodeView.decode(reply))
        return views

    def _majority(self, name: str, views: list[NodeView | None], what: str) -> LockStatus:
        status = majority_status(name, views, self._n)
        if status is None:
            answered = sum(1 for view in views if view is not None)
            raise QuorumUnavailable(f"{what} reached {answered} of {self._n} nodes; {self._q} are needed",
                                    name=name)
        return status

    async def status(self, name: str) -> LockStatus:
        """The lock as a majority sees it: held when a quorum holds one grant (see `majority_status`)."""
        return self._majority(name, await self._views(STATUS, name, False), "the status")

    async def scan(self, pattern: str) -> list[LockStatus]:
        """Every lock a quorum holds whose name matches `pattern`: SCAN on every node, then each name's status.

        Any quorum of answering nodes shares a node with the quorum that holds a lock, so it sees every held one.
        """
        calls = [partial(self._scan_node, i, pattern) for i in range(self._n)]
        done, _ = await fan_out(calls, SCAN_TIMEOUT, lambda so_far: len(so_far) == self._n, lanes=self._channels)
        found = [names for names in done.values() if names is not None]
        if len(found) < self._q:
            raise QuorumUnavailable(f"listing the locks matching {pattern!r} reached {len(found)} of {self._n} "
                                    f"nodes; {self._q} are needed")
        held = []
        for name in sorted(set[str]().union(*found)):
            status = await self.status(name)
            if status.held:
                held.append(status)
        return held

    async def _scan_node(self, i: int, pattern: str) -> set[str] | None:
        try:
            return await scan_names(self._nodes[i], pattern, self._prefix, where=self._shown[i], cluster=False)
        except BackendError:
            return None

    async def force_release(self, name: str) -> LockStatus:
        """Remove the lock's key on every node, whoever holds it; returns what a majority held before."""
        views = await self._views(FORCE_RELEASE, name, True)
        return self._majority(name, views, "the forced release (run it again: the nodes that answered are clear)")

    # -- nodes that lost their data -------------------------------------------------------------------------

    def _unavailable(self, why: str, name: str, answers: list[Answer],
                     views: list[GateView | None] | None) -> QuorumUnavailable:
        """QuorumUnavailable naming every node, its state and when its quarantine ends (`unavailable`)."""
        text, states, found = unavailable(why, self._shown, answers, views, time.time())
        for state in states:
            if not state.ready:
                emit("node_out", name, "redlock", "acquire", error=state.describe())
        return QuorumUnavailable(text, name=name, nodes=tuple(states), retry_in=found.eta)

    async def nodes(self) -> NodesReport:
        """Every node's bookkeeping as an operator sees it, read without changing anything, and the verdict."""
        views = await self._look(GATE_TIMEOUT, peek=True)
        states = node_states(self._shown, views, time.time())
        return NodesReport(tuple(states), verdict(states, self._n))

    async def _gate(self, i: int, peek: bool) -> GateView | None:
        args = [self._repair_delay_ms, self._window_ms, secrets.token_hex(16), 1 if peek else 0]
        try:
            raw = await run_script(self._nodes[i], REDLOCK_GATE, self._gate_keys, args, name="",
                                   where=self._shown[i])
            return GateView.decode(raw)
        except (BackendError, ValueError, TypeError):
            return None

    async def _look(self, timeout: float, peek: bool = False) -> list[GateView | None]:
        done, _ = await fan_out([partial(self._gate, i, peek) for i in range(self._n)], look_timeout(timeout),
                                lambda so_far: len(so_far) == self._n)
        return [done.get(i) for i in range(self._n)]

    async def _heal(self, timeout: float) -> tuple[bool, list[GateView | None]]:
        """Look at every node's gate and follow `plan_heal`: mark a new deployment, repair what can be repaired.

        Returns whether some node counts again (worth another round now), and the look.
        """
        self._healing = True
        try:
            views = await self._look(timeout)
            plan = plan_heal(views, self._n, self._repair, busy=self._repairing)
            if plan.fresh:
                return await self._mark_new(views, timeout), views
            if not plan:
                return False, views
            calls = ([partial(self._mark, i, views[i], "plain") for i in plan.plain]
                     + [partial(self._repair_node, r) for r in plan.repairs])
            done, _ = await fan_out(calls, look_timeout(timeout) * 2, lambda so_far: len(so_far) == len(calls))
            return any(done.values()), views
        finally:
            self._healing = False

    async def _mark_new(self, views: list[GateView | None], timeout: float) -> bool:
        """A new deployment (every node fresh): claim every node for it, then, if every claim held, mark all."""
        deployment = deployment_id(views)
        for mode in NEW_DEPLOYMENT:
            calls = [partial(self._mark, i, views[i], mode, deployment) for i in range(self._n)]
            done, _ = await fan_out(calls, look_timeout(timeout), lambda so_far: len(so_far) == self._n)
            step = deployment_step(mode, [bool(done.get(i)) for i in range(self._n)])
            if step is not None:
                return step
        return True

    async def _mark(self, i: int, view: GateView | None, mode: str, deployment: str = "0") -> bool:
        """Claim or mark node i (claim, fresh: a new deployment; plain: repair=False) as `mark_args` says."""
        try:
            code = await run_script(self._nodes[i], REDLOCK_MARK, self._gate_keys[:2],
                                    mark_args(view, mode, deployment), name="", where=self._shown[i])
        except BackendError:
            return False
        return marked(int(code))

    async def _repair_node(self, repair: Repair) -> bool:
        """Raise node i's hwm to what `repaired` merges from the ready others, then mark it (`repair_marks`)."""
        i = repair.node
        self._repairing.add(i)
        try:
            others = []
            for j in repair.sources:
                values = await self._read_fences(j)
                if values is not None:
                    others.append(values)
            merged = repaired(others, self._n, repair.clock)
            if merged is None:
                return False  # not enough ready nodes answered: it stays out, and a later attempt tries again
            for fence_keys, args in repair_marks(repair, *merged):
                code = int(await run_script(self._nodes[i], REDLOCK_MARK, self._gate_keys[:2] + fence_keys, args,
                                            name="", where=self._shown[i]))
                progress = repair_progress(code)
                if progress is not None:
                    return progress
            return True
        except BackendError:
            return False
        finally:
            self._repairing.discard(i)

    async def _read_fences(self, j: int) -> tuple[int, dict[str, int]] | None:
        """A ready node's floor and hwm keys (None: it is not ready, or did not answer)."""
        client: Any = self._nodes[j]
        pattern = f"{self._prefix}:{{*}}:fence"
        try:
            marker = await client.get(self._marker.encode("utf-8"))
            if marker is None:
                return None
            floor = marker_floor(marker.decode() if isinstance(marker, bytes) else str(marker))
            # Keys as bytes whatever the client's decoding; kept as text that goes back out as the same bytes.
            keys = [key async for key in client.scan_iter(match=pattern.encode("utf-8"), count=1000,
                                                          NEVER_DECODE=True)]
            values: dict[str, int] = {}
            for start in range(0, len(keys), REPAIR_BATCH):
                batch = keys[start:start + REPAIR_BATCH]
                for key, value in zip(batch, await client.mget(batch), strict=True):
                    if value is not None:
                        values[bytes(key).decode("utf-8", "surrogateescape")] = int(value)
            return floor, values
        except CLIENT_ERRORS:
            return None

    async def aclose(self) -> None:
        self._closed = True
        for channel in self._channels:
            await channel.aclose()
        if self._owns_clients:
            for node in self._nodes:
                client: Any = node
                await close_client(client)
