"""The Redlock backend: one lock over N independent Redis masters, with fencing tokens.

The backend carries bytes and the model decides: every rule (quorum, tallies, rounds, heal, repair) is a pure
function in `fencelock._redis.redlock`; this module sends to every node at once what the model says, each with a
per-node timeout, and feeds the replies back. Who each node is and its gate (heal, mark, repair) are its base's,
`RedlockNodes` (`redlock_nodes.py`).
"""

from __future__ import annotations

import random
import threading
import zlib
from functools import partial
from typing import Any

from redis.asyncio import Redis

from .._errors import BackendError, NotIndependent, QuorumUnavailable
from .._logic.admission import Admission, Urgency, turn_wait
from .._logic.args import DEFAULT_TTL
from .._logic.outcomes import Attempt, Released
from .._logic.status import LockStatus, NodeView, majority_status, split_views
from .._logic.timing import Clock, lease_clock
from .._redis.keys import PREFIX, RedisKeys, fair_keys, redis_keys
from .._redis.redlock import (
    DEFAULT_REPAIR_DELAY,
    MAX_ROUNDS,
    NO_ANSWER,
    Answer,
    Gate,
    Heal,
    Next,
    Reply,
    batch_outcomes,
    batch_settled,
    check_ttl_within,
    decide,
    default_node_timeout,
    extend_outcome,
    fallback_pause,
    floor_seen,
    fresh_window,
    learned,
    look_timeout,
    next_proposal,
    next_step,
    node_answer,
    node_code,
    quorum,
    ready_in,
    release_outcome,
    settled,
    tally,
    unavailable_pause,
)
from .._redis.redlock_turns import ROUNDS_AT_ONCE, TURN_LIMIT, turn_error
from .._redis.request import ScriptRequest, Unwritten
from .._scripts import (
    EVICTION,
    FORCE_RELEASE,
    REDLOCK_ACQUIRE,
    REDLOCK_EXTEND,
    REDLOCK_EXTEND_MANY,
    REDLOCK_RELEASE,
    STATUS,
)
from ._concurrency import Handle, Signal, in_background, now, sleep, then
from ._connection import close_client
from ._fanout import fan_out
from ._multiplex import run_scripts
from ._transport import Channel, call_script
from .redis_commands import (
    BATCH,
    MIN_BLOCK,
    run_script,
    scan_names,
    socket_timeout,
    wait_for_wake,
    warn_if_evicting,
)
from .redlock_nodes import RedlockNodes

SCAN_TIMEOUT = 10.0  # seconds: the longest one node's SCAN for `list` is given


class _Waiter:
    """A round waiting for its turn (`Admission`): woken when it is handed one."""

    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal = Signal()


class _Turn:
    """`async with`: one round's turn among its client's (`Admission`, `ROUNDS_AT_ONCE`), waited for before its clock
    starts, given up after `TURN_LIMIT` or its caller's deadline (`BackendError`), handed on when the round is over
    (decision 2026-12-05-redlock-burst)."""

    __slots__ = ("_backend", "_floor", "_name", "_urgency", "_what")

    def __init__(self, backend: AsyncRedlockBackend, what: str, name: str, urgency: Urgency, floor: float) -> None:
        self._backend, self._what, self._name, self._urgency, self._floor = backend, what, name, urgency, floor

    async def __aenter__(self) -> None:
        backend = self._backend
        waiter = _Waiter()
        with backend._turns_lock:
            if backend._turns.enter(waiter, self._urgency):
                return
        limit = turn_wait(TURN_LIMIT, self._floor, now())
        try:
            handed = await waiter.signal.wait(limit)
        except BaseException:
            backend._withdraw(waiter)
            raise
        if not handed:
            with backend._turns_lock:
                withdrawn = backend._turns.withdraw(waiter)
                waiting = backend._turns.waiting
            if withdrawn:
                raise BackendError(turn_error(self._what, limit, waiting), name=self._name)
            # (handed a turn just as the wait ended: the round goes)

    async def __aexit__(self, *exc: object) -> None:
        self._backend._hand_on()


class AsyncRedlockBackend(RedlockNodes):
    """Locks held by a quorum of independent Redis masters (not replicas, not a Cluster).

    It carries bytes and the model decides: each reply goes back to a `fencelock._redis.redlock` function, which
    says what to send next."""

    def __init__(self, clients: list[Redis], *, owns_clients: bool, shown: list[str], prefix: str = PREFIX,
                 node_timeout: float | None = None, repair: bool = True,
                 repair_delay: float = DEFAULT_REPAIR_DELAY, places: list[set[str]] | None = None,
                 clock: Clock = lease_clock) -> None:
        self._nodes = clients
        self._clock = clock  # the client's: a grant's validity counts from its round's start on it
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
        self._incarnation = f"{prefix}:redlock:incarnation"
        self._ttls = f"{prefix}:redlock:ttls"  # lease TTLs and when the last lease with each expires there
        # (fencelock:redlock:seen is an older version's: a data set it marked seen is not a new one.)
        self._gate_keys = [self._marker, self._incarnation, f"{prefix}:redlock:seen"]
        self._known: dict[str, int] = {}  # name -> the highest hwm seen: where the next proposal starts
        self._floor = 0  # the highest node floor seen: where a name never locked starts
        self._init_nodes(places)  # who each node is, and its gate (`RedlockNodes`)
        self._closed = False
        self._eviction_checked = False  # (once per client, after its first grant: `_check_eviction`)
        self.supports_fair = False  # a fair queue would need a quorum of its own: not offered on Redlock
        self.always_queues = False
        self.renewal_requests = 0  # script calls the watchdog made (for benchmarks)
        self._rng = random.Random()
        # At most `ROUNDS_AT_ONCE` rounds at once, the others waiting for a turn before their clock starts (`_Turn`).
        self._turns: Admission[_Waiter] = Admission(ROUNDS_AT_ONCE)
        self._turns_lock = threading.Lock()  # (never held across an await)
        # A waiter blocks on its home node's wake list; one wait must end before that socket's timeout does.
        timeouts = [socket_timeout(client) for client in clients]
        self.block_cap = 30.0 if None in timeouts else max(MIN_BLOCK, min(t for t in timeouts if t) * 0.75)

    def retry_after(self, exc: BackendError, failures: int) -> float | None:
        """No quorum answered or is ready: try again while the caller's wait allows, after a short back-off, then
        when the quarantine ends (at most `QUARANTINE_POLL` apart): `unavailable_pause`."""
        if not isinstance(exc, QuorumUnavailable):
            return None
        if any(getattr(state, "state", None) == "error" for state in exc.nodes):
            return None  # a server refused (OOM, WRONGTYPE, NOPERM...): not waited out as if a node were down
        return unavailable_pause(failures, exc.retry_in, self._rng)

    def _timeout(self, ttl: float) -> float:
        return self._node_timeout if self._node_timeout is not None else default_node_timeout(ttl)

    def _turn(self, what: str, name: str, urgency: Urgency, floor: float = 0.0) -> _Turn:
        """A round's turn (`_Turn`), in `urgency`'s order: a held lease's extend, an attempt's next round, a release,
        then new acquires; `floor`: the least it waits, whatever its caller's deadline (`turn_wait`)."""
        return _Turn(self, what, name, urgency, floor)

    def _hand_on(self) -> None:
        """A round is over: its turn goes to the next one waiting."""
        with self._turns_lock:
            waiter = self._turns.done()
        if waiter is not None:
            waiter.signal.set()

    def _withdraw(self, waiter: _Waiter) -> None:
        """A round stopped waiting for its turn (cancelled): one it was handed meanwhile goes on."""
        with self._turns_lock:
            withdrawn = self._turns.withdraw(waiter)
        if not withdrawn:
            self._hand_on()

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

    async def _give_back_if_sent(self, handle: Handle[Any], i: int, keys: RedisKeys, token: str, t: int) -> int:
        """`_release_on`, unless the round's request to node i (`handle`, finished) was never sent: a request
        still waiting for a connection when its round ended is not sent (`run_scripts`), and holds nothing."""
        try:
            if isinstance(handle.result(), Unwritten):
                return NO_ANSWER
        except BaseException:  # (it failed or was cancelled: give back, as for a request that may have gone)
            pass
        return await self._release_on(i, keys, token, t)

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
        check_ttl_within(ttl_ms, self._repair_delay_ms, name)
        timeout = self._timeout(ttl_ms / 1000.0)
        self._check_independent(name, timeout)
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
        n = self._n
        t = next_proposal(max(self._known.get(name, 0), self._floor), ())
        for rounds in range(1, MAX_ROUNDS + 1):
            script_keys = [keys.lock, keys.fence, self._marker, keys.waiters, self._incarnation, self._ttls]
            args = [token, ttl_ms, t]
            requests = [ScriptRequest(channel, REDLOCK_ACQUIRE, script_keys, args) for channel in self._channels]
            # Its clock starts once it has its turn (issue 14); a later round of an attempt under way goes first.
            async with self._turn("acquire", name, Urgency.ONGOING if rounds > 1 else Urgency.NEW, floor=timeout):
                started, round_sent = now(), self._clock()
                done, handles = await run_scripts(requests, timeout, self._decided)
            answers = [node_answer(done.get(i)) for i in range(n)]  # no answer in time counts as a failure
            self._reconnecting(self._failures(done, started, timeout))
            problem = await self._who_answered(answers, done)
            if problem is not None:  # two names of one server, or a replica: nothing of this round counts
                for i, answer in enumerate(answers):
                    if answer.reply in (Reply.GRANTED, Reply.FAILED):
                        then(handles[i], partial(self._release_on, i, keys, token, t))
                raise NotIndependent(problem, name=name)
            self._learn(name, answers, t)
            counted = tally(answers, n, self._healing)
            if counted.heal is Heal.BACKGROUND:
                in_background(partial(self._shared_heal, timeout))
            # Give back each after its own request finished, matching t, so no later round's grant is touched.
            for i in counted.give_back:
                if not isinstance(done.get(i), Unwritten):  # (one never sent holds nothing there)
                    then(handles[i], partial(self._give_back_if_sent, handles[i], i, keys, token, t))
            healed, views = await self._shared_heal(timeout) if counted.heal is Heal.NOW else (False, None)
            step = next_step(answers, counted, t, n, rounds=rounds, healed=healed, released=released,
                             timeout=timeout, ready_in=None if views is None else ready_in(views))
            if step.next is Next.UNAVAILABLE:
                raise self._unavailable(step.why, name, answers, views)
            if step.next is not Next.PROPOSE:
                if step.next is Next.GRANT and not self._eviction_checked:
                    self._eviction_checked = True
                    for i in range(n):
                        in_background(partial(self._check_eviction, i, name, keys.lock, self._channels[i].generation))
                # Nothing this grant depends on was sent before this round started: its validity counts from then.
                return Attempt(step.next is Next.GRANT, step.t, step.retry_in, valid_from=round_sent)
            t = step.t
        raise AssertionError("next_step proposes no round past MAX_ROUNDS")

    def _learn(self, name: str, answers: list[Answer], t: int) -> None:
        """Remember where the next attempt's proposal starts (`learned`)."""
        if len(self._known) > 10_000:
            self._known.clear()  # only a hint for the first proposal: forgetting costs one round
        self._known[name] = learned(self._known.get(name, 0), answers, t)
        self._floor = floor_seen(self._floor, answers)
        for i, answer in enumerate(answers):
            if answer.reply in (Reply.GRANTED, Reply.HELD, Reply.STALE):
                self._reported.pop(i, None)  # it counts again: a later outage is news

    def _decided(self, done: dict[int, Any]) -> bool:
        return decide(map(node_answer, done.values()), self._n) is not None

    async def release(self, name: str, token: str, fence: int) -> Released:
        """After `aclose` (a lease of the closed client released), the connections it made are closed again after
        it, as on one Redis (`AsyncRedisBackend._run`)."""
        if not self._closed:
            return await self._release(name, token, fence)
        try:
            return await self._release(name, token, fence)
        finally:
            await self.aclose()

    async def _release(self, name: str, token: str, fence: int) -> Released:
        keys = redis_keys(name, self._prefix)
        script_keys, args = [keys.lock, keys.fence, keys.waiters, keys.wake], [token, fence]
        requests = [ScriptRequest(channel, REDLOCK_RELEASE, script_keys, args) for channel in self._channels]
        self._ask_unknown(self._timeout(DEFAULT_TTL))
        async with self._turn("release", name, Urgency.RELEASE):
            started = now()
            done, _ = await run_scripts(requests, self._timeout(DEFAULT_TTL), self._settled)
        self._reconnecting(self._failures(done, started, self._timeout(DEFAULT_TTL)))
        codes = await self._counted(done)
        results = [codes.get(i, NO_ANSWER) for i in range(self._n)]
        outcome = release_outcome(results, self._n)
        if outcome is None:
            raise QuorumUnavailable(f"the release reached {self._n - results.count(NO_ANSWER)} of {self._n} nodes: "
                                    f"whether a majority held the lease is unknown; release again"
                                    f"{self._server_errors(done)}", name=name)
        return outcome

    async def extend(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        """After `aclose` (a lease of the closed client extended), the connections it made are closed again after
        it, as `release` does."""
        if not self._closed:
            return await self._extend(name, token, fence, ttl_ms)
        try:
            return await self._extend(name, token, fence, ttl_ms)
        finally:
            await self.aclose()

    async def _extend(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        check_ttl_within(ttl_ms, self._repair_delay_ms, name)
        keys = redis_keys(name, self._prefix)
        script_keys, args = [keys.lock, keys.fence, self._ttls, self._marker, self._incarnation], [token, ttl_ms, fence]
        requests = [ScriptRequest(channel, REDLOCK_EXTEND, script_keys, args) for channel in self._channels]
        self._ask_unknown(self._timeout(ttl_ms / 1000.0))
        async with self._turn("extend", name, Urgency.RENEWAL):
            started = now()
            done, handles = await run_scripts(requests, self._timeout(ttl_ms / 1000.0), self._settled)
        self._reconnecting(self._failures(done, started, self._timeout(ttl_ms / 1000.0)))
        codes = await self._counted(done)
        results = [codes.get(i, NO_ANSWER) for i in range(self._n)]
        extended = extend_outcome(results, self._n)
        if extended:
            return True
        if extended is None:
            raise QuorumUnavailable(f"the extend reached {self._n - results.count(NO_ANSWER)} of {self._n} nodes: "
                                    f"whether a majority extended the lease is unknown{self._server_errors(done)}",
                                    name=name)
        # Lost: a minority still holds keys of ours, which only get in others' way. Give them back.
        for i, handle in enumerate(handles):
            then(handle, partial(self._release_on, i, keys, token, fence))
        return False

    def _settled(self, done: dict[int, Any]) -> bool:
        return settled(list(self._codes(done).values()), self._n)

    async def leave(self, name: str, token: str) -> None:
        """Redlock has no fair queue: nothing to leave."""

    async def extend_many(self, leases: list[tuple[str, str, int, int]]) -> list[bool | None]:
        """The watchdog's batch on every node at once; a lease is extended where a quorum extended it."""
        calls = [partial(self._extend_many_on, j, leases) for j in range(self._n)]
        longest = max(ttl for _, _, _, ttl in leases) / 1000.0
        self._ask_unknown(self._timeout(longest))  # (a node that failed is asked who it is again: `_reconnecting`)
        count = len(leases)
        started = now()
        done, _ = await fan_out(calls, self._timeout(longest),
                                lambda so_far: batch_settled(self._known_rows(so_far), count, self._n),
                                lanes=self._channels)
        if now() - started >= self._timeout(longest):  # (a batch settled early waited for no one: no failure)
            self._reconnecting(i for i in range(self._n) if done.get(i) is None)
        if any(row is not None and 1 in row and self._ids[i] is None for i, row in done.items()):
            await self._identified()  # (a "yes" waits for who its node is: see `_counted`)
        return batch_outcomes(self._known_rows(done), count, self._n)

    async def _extend_many_on(self, j: int, leases: list[tuple[str, str, int, int]]) -> list[int] | None:
        codes: list[int] = []
        for first in range(0, len(leases), BATCH):
            keys: list[str] = []
            args: list[Any] = []
            for name, token, fence, ttl in leases[first:first + BATCH]:
                k = redis_keys(name, self._prefix)
                keys += [k.lock, k.fence]
                args += [token, ttl, fence]
            self.renewal_requests += 1
            try:
                reply = await run_script(self._nodes[j], REDLOCK_EXTEND_MANY,
                                         [*keys, self._ttls, self._marker, self._incarnation], args,
                                         name=leases[first][0], where=self._shown[j])
            except BackendError:
                return None
            codes += [node_code(code) for code in reply]  # (a node that does not count: no answer)
        return codes

    # -- operators (fencelock status / list / release --force) -----------------------------------------------

    async def _views(self, lua: Any, name: str, removing: bool) -> list[NodeView | None]:
        """`lua` (status or force_release) on every node at once; None for a node that did not answer."""
        await self._contact(self._timeout(DEFAULT_TTL), name)
        keys = redis_keys(name, self._prefix)
        deadlines, _ = fair_keys(name, self._prefix)
        # With the marker and the incarnation: a node that does not count answers "not ready" (`NodeView.unready`).
        script_keys = ([keys.lock, keys.fence, keys.waiters, keys.wake, keys.queue, deadlines] if removing
                       else [keys.lock, keys.fence, deadlines]) + [self._marker, self._incarnation]
        args: list[Any] = [0, "redlock"] if removing else []
        requests = [ScriptRequest(channel, lua, script_keys, args) for channel in self._channels]
        done, _ = await run_scripts(requests, look_timeout(self._timeout(DEFAULT_TTL)),
                                    lambda so_far: len(so_far) == self._n)
        self._reconnecting(i for i in range(self._n) if self._failed(done.get(i)))
        views: list[NodeView | None] = []
        for i in range(self._n):
            reply = done.get(i) if self._ids[i] is not None else None  # (who it is is not known yet)
            views.append(None if reply is None or isinstance(reply, Exception) else NodeView.decode(reply))
        return views

    def _majority(self, name: str, views: list[NodeView | None], what: str) -> LockStatus:
        """What a quorum agrees on (`majority_status`); else QuorumUnavailable naming what each node answered."""
        status = majority_status(name, views, self._n)
        if status is None:
            answered = sum(1 for view in views if view is not None)
            raise QuorumUnavailable(f"{what} reached {answered} of {self._n} nodes ({split_views(self._shown, views)}"
                                    f"): the nodes that did not answer could complete a holder's quorum of "
                                    f"{self._q}, so whether the lock is held cannot be told", name=name)
        return status

    async def status(self, name: str) -> LockStatus:
        """The lock as a majority sees it: held when a quorum holds one grant (see `majority_status`)."""
        return self._majority(name, await self._views(STATUS, name, False), "the status")

    async def scan(self, pattern: str) -> list[LockStatus]:
        """Every lock a quorum holds whose name matches `pattern`: SCAN on every node, then each name's status.

        Any quorum of answering nodes shares a node with the quorum that holds a lock, so it sees every held one.
        """
        await self._contact(self._timeout(DEFAULT_TTL), None)
        calls = [partial(self._scan_node, i, pattern) for i in range(self._n)]
        done, _ = await fan_out(calls, SCAN_TIMEOUT, lambda so_far: len(so_far) == self._n, lanes=self._channels)
        found = [names for i, names in done.items() if isinstance(names, set) and self._ids[i] is not None]
        if len(found) < self._q:
            unready = [self._shown[i] for i, names in done.items() if names is False]
            out = f" ({', '.join(unready)} not ready: lost its data or restarted)" if unready else ""
            raise QuorumUnavailable(f"listing the locks matching {pattern!r} reached {len(found)} of {self._n} "
                                    f"nodes that count{out}; {self._q} are needed")
        held = []
        for name in sorted(set[str]().union(*found)):
            status = await self.status(name)
            if status.held:
                held.append(status)
        return held

    async def _scan_node(self, i: int, pattern: str) -> set[str] | bool | None:
        """Node i's names matching `pattern`; False if it does not count (not ready: its names may lack a holder's,
        as its gate says), None if it failed."""
        view = await self._gate(i, True)
        if view is not None and view.gate is not Gate.READY:
            return None if view.gate is Gate.UNKNOWN else False
        try:
            return await scan_names(self._nodes[i], pattern, self._prefix, where=self._shown[i], cluster=False)
        except BackendError:
            return None

    async def force_release(self, name: str) -> LockStatus:
        """Remove the lock's key on every node, whoever holds it; returns what a majority held before (if no
        majority agrees: QuorumUnavailable, and the nodes that answered are clear)."""
        views = await self._views(FORCE_RELEASE, name, True)
        return self._majority(name, views, "the forced release (run it again: the nodes that answered are clear)")

    async def aclose(self) -> None:
        self._closed = True
        for channel in self._channels:
            await channel.aclose()
        if self._owns_clients:
            for node in self._nodes:
                client: Any = node
                await close_client(client)
