# Generated from _async/redlock.py by scripts/unasync.py: do not edit, edit that file instead.
"""The Redlock backend: one lock over N independent Redis masters, with fencing tokens.

The backend carries bytes and the model decides: every rule (quorum, tallies, rounds, heal, repair) is a pure
function in `fencelock._redis.redlock`; this module sends to every node at once what the model says, each with a
per-node timeout, and feeds the replies back.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
import zlib
from collections.abc import Iterable
from functools import partial
from typing import Any

from redis import Redis
from redis.exceptions import ReadOnlyError

from .._errors import BackendError, NotIndependent, QuorumUnavailable
from .._events import emit
from .._logic.args import DEFAULT_TTL
from .._logic.outcomes import Attempt, Released
from .._logic.status import LockStatus, NodeView, majority_status, split_views
from .._redis.keys import PREFIX, RedisKeys, fair_keys, fence_match, redis_keys
from .._redis.redlock import (
    DEFAULT_REPAIR_DELAY,
    GATE_TIMEOUT,
    MAX_ROUNDS,
    NEW_DEPLOYMENT,
    NO_ANSWER,
    REPAIR_BATCH,
    UNSURE,
    Answer,
    Gate,
    GateView,
    Heal,
    Identity,
    Next,
    NodesReport,
    Repair,
    Reply,
    batch_outcomes,
    batch_settled,
    check_ttl_within,
    decide,
    default_node_timeout,
    deployment_floor,
    deployment_id,
    deployment_step,
    durable_run,
    extend_outcome,
    fallback_pause,
    floor_seen,
    fresh_window,
    learned,
    live_ttl,
    look_timeout,
    mark_args,
    marked,
    newly_out,
    next_proposal,
    next_step,
    node_answer,
    node_code,
    node_states,
    not_independent,
    plan_heal,
    quorum,
    ready_in,
    release_outcome,
    repair_marks,
    repair_progress,
    repaired,
    required_delay,
    server_error,
    settled,
    tally,
    unavailable,
    unavailable_pause,
    verdict,
)
from .._redis.redlock_turns import TURN_LIMIT, Turns, turn_error
from .._redis.request import Held, ScriptRequest, Unwritten
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
from ._concurrency import Handle, Signal, given_up, in_background, now, sleep, start, then, wait_first
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


class _Waiter:
    """A round waiting for its turn (`Turns`): woken when it is handed one."""

    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal = Signal()


class _Turn:
    """`with`: one round's turn among its client's (`Turns`), waited for before its clock starts, given up
    after `TURN_LIMIT` (`BackendError`), handed on when the round is over (decision 2026-12-05-redlock-burst)."""

    __slots__ = ("_backend", "_name", "_urgent", "_what")

    def __init__(self, backend: RedlockBackend, what: str, name: str, urgent: bool) -> None:
        self._backend, self._what, self._name, self._urgent = backend, what, name, urgent

    def __enter__(self) -> None:
        backend = self._backend
        waiter = _Waiter()
        with backend._turns_lock:
            if backend._turns.ask(waiter, self._urgent):
                return
        try:
            handed = waiter.signal.wait(TURN_LIMIT)
        except BaseException:
            backend._withdraw(waiter)
            raise
        if not handed:
            with backend._turns_lock:
                withdrawn = backend._turns.withdraw(waiter)
                waiting = len(backend._turns)
            if withdrawn:
                raise BackendError(turn_error(self._what, TURN_LIMIT, waiting), name=self._name)
            # (handed a turn just as the wait ended: the round goes)

    def __exit__(self, *exc: object) -> None:
        self._backend._hand_on()


class RedlockBackend:
    """Locks held by a quorum of independent Redis masters (not replicas, not a Cluster).

    It carries bytes and the model decides: each reply goes back to a `fencelock._redis.redlock` function, which
    says what to send next."""

    def __init__(self, clients: list[Redis], *, owns_clients: bool, shown: list[str], prefix: str = PREFIX,
                 node_timeout: float | None = None, repair: bool = True,
                 repair_delay: float = DEFAULT_REPAIR_DELAY, places: list[set[str]] | None = None) -> None:
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
        self._incarnation = f"{prefix}:redlock:incarnation"
        self._ttls = f"{prefix}:redlock:ttls"  # lease TTLs and when the last lease with each expires there
        # (fencelock:redlock:seen is an older version's: a data set it marked seen is not a new one.)
        self._gate_keys = [self._marker, self._incarnation, f"{prefix}:redlock:seen"]
        self._known: dict[str, int] = {}  # name -> the highest hwm seen: where the next proposal starts
        self._floor = 0  # the highest node floor seen: where a name never locked starts
        # Who each node is (first contact): until a node said so, no "yes" of its counts (`_codes`, `_views`).
        self._places = places if places is not None else [set() for _ in clients]
        self._ids: list[Identity | None] = [None] * self._n
        self._roles = [False] * self._n  # its role (master or replica) is known
        self._contacted = False
        self._identifying = False
        self._identifying_now: Handle[None] | None = None  # the identities being asked (`_ask_unknown`)
        self._problem: str | None = None  # two nodes are one server, or one is a replica (`not_independent`)
        self._reported: dict[int, str] = {}  # node -> the state its last node_out event told (`newly_out`)
        self._repairing: set[int] = set()
        self._healing = False
        self._heal_now: Handle[tuple[bool, list[GateView | None]]] | None = None  # (`_shared_heal`)
        self._heal_lock = threading.Lock()
        self._closed = False
        self._eviction_checked = False  # (once per client, after its first grant: `_check_eviction`)
        self.supports_fair = False  # a fair queue would need a quorum of its own: not offered on Redlock
        self.always_queues = False
        self.renewal_requests = 0  # script calls the watchdog made (for benchmarks)
        self._rng = random.Random()
        # At most `ROUNDS_AT_ONCE` rounds at once, the others waiting for a turn before their clock starts (`_Turn`).
        self._turns: Turns[_Waiter] = Turns()
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

    def _turn(self, what: str, name: str, urgent: bool = False) -> _Turn:
        """A round's turn (`_Turn`): `urgent` for a held lease's (a release, an extend) and an attempt's next round,
        served before new acquires."""
        return _Turn(self, what, name, urgent)

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

    def _release_on(self, i: int, keys: RedisKeys, token: str, t: int) -> int:
        """Give back one node's key (a background cleanup), on that node's channel. After `close` it is skipped,
        and the key's TTL frees it. One begun before `close` never keeps or makes a connection after it (the
        channel's generation, read before the closed flag: `close` sets the flag first)."""
        channel = self._channels[i]
        generation = channel.generation
        if self._closed:
            return NO_ANSWER
        script_keys = [keys.lock, keys.fence, keys.waiters, keys.wake]
        return node_code(call_script(channel, REDLOCK_RELEASE, script_keys, [token, t], generation=generation))

    def _give_back_if_sent(self, handle: Handle[Any], i: int, keys: RedisKeys, token: str, t: int) -> int:
        """`_release_on`, unless the round's request to node i (`handle`, finished) was never sent: a request
        still waiting for a connection when its round ended is not sent (`run_scripts`), and holds nothing."""
        try:
            if isinstance(handle.result(), Unwritten):
                return NO_ANSWER
        except BaseException:  # (it failed or was cancelled: give back, as for a request that may have gone)
            pass
        return self._release_on(i, keys, token, t)

    def _check_eviction(self, i: int, name: str, key: str, generation: int) -> None:
        """Warn (an "evicting" event) if node `i` may evict held locks (`eviction_risk`). Begun before `close`
        (`generation`: the node channel's when it was started), it makes no connection after it."""
        if not self._closed:
            reply = call_script(self._channels[i], EVICTION, [key], [], generation=generation)
            if not isinstance(reply, Exception):
                warn_if_evicting(reply, name, "redlock", self._shown[i])

    # -- the protocol -----------------------------------------------------------------------------------------

    def try_acquire(self, name: str, token: str, ttl_ms: int, wait: float = 0.0,
                          fair: bool = False) -> Attempt:
        """One attempt: propose t to every node at once; on a stale t, propose again above what was learnt."""
        check_ttl_within(ttl_ms, self._repair_delay_ms, name)
        entered = now()  # the lease's validity counts from the granted round's start, not from here (`held_back`)
        timeout = self._timeout(ttl_ms / 1000.0)
        self._check_independent(name, timeout)
        keys = redis_keys(name, self._prefix)
        released = 0  # the fence of the release that woke us, if one did
        if wait > 0.0:
            # Every release pushes a wake-up on every node; the waiters of one name all block on the same node.
            at = zlib.crc32(name.encode()) % self._n
            try:
                woken = wait_for_wake(self._nodes[at], keys.wake, wait, name=name, where=self._shown[at])
            except BackendError:
                woken = None  # that node refuses BLPOP: the pause below (the other nodes may be fine)
            if woken is None:
                # That node failed: a short jittered pause instead, so that contenders do not collide again.
                sleep(self._rng.uniform(0.0, fallback_pause(wait)))
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
            with self._turn("acquire", name, urgent=rounds > 1):
                started = now()
                done, handles = run_scripts(requests, timeout, self._decided)
            answers = [node_answer(done.get(i)) for i in range(n)]  # no answer in time counts as a failure
            self._reconnecting(self._failures(done, started, timeout))
            problem = self._who_answered(answers, done)
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
            healed, views = self._shared_heal(timeout) if counted.heal is Heal.NOW else (False, None)
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
                return Attempt(step.next is Next.GRANT, step.t, step.retry_in, held_back=started - entered)
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

    def _codes(self, done: dict[int, Any]) -> dict[int, int]:
        """A release's or extend's codes as they count: a "done" from a node that has not said which server it is
        yet (its acquire reply, or `_identify`) counts as no answer, so that two names of one server can never
        make up a quorum; its "not ours" counts (it can only lower the count)."""
        codes = {i: node_code(reply) for i, reply in done.items()}
        return {i: NO_ANSWER if self._ids[i] is None and code not in (0, -1) else code for i, code in codes.items()}

    def _counted(self, done: dict[int, Any]) -> dict[int, int]:
        """`_codes`, once the identities being asked again (`_reconnecting`) are known, if a "yes" waits for one:
        a node that came back answers who it is as fast as it answered the script, so a release or extend right
        after a fault still counts it (one that does not answer holds nothing up: it has no "yes" to count)."""
        if any(self._ids[i] is None and node_code(reply) in (1, UNSURE) for i, reply in done.items()):
            self._identified()
        return self._codes(done)

    def _identified(self) -> None:
        """Wait, at most a look's timeout, for the identities being asked (`_ask_unknown`)."""
        handle = self._identifying_now
        if handle is not None and not handle.done():
            wait_first([handle], GATE_TIMEOUT)

    def _decided(self, done: dict[int, Any]) -> bool:
        return decide(map(node_answer, done.values()), self._n) is not None

    def release(self, name: str, token: str, fence: int) -> Released:
        keys = redis_keys(name, self._prefix)
        script_keys, args = [keys.lock, keys.fence, keys.waiters, keys.wake], [token, fence]
        requests = [ScriptRequest(channel, REDLOCK_RELEASE, script_keys, args) for channel in self._channels]
        self._ask_unknown(self._timeout(DEFAULT_TTL))
        with self._turn("release", name, urgent=True):
            started = now()
            done, _ = run_scripts(requests, self._timeout(DEFAULT_TTL), self._settled)
        self._reconnecting(self._failures(done, started, self._timeout(DEFAULT_TTL)))
        codes = self._counted(done)
        results = [codes.get(i, NO_ANSWER) for i in range(self._n)]
        outcome = release_outcome(results, self._n)
        if outcome is None:
            raise QuorumUnavailable(f"the release reached {self._n - results.count(NO_ANSWER)} of {self._n} nodes: "
                                    f"whether a majority held the lease is unknown; release again"
                                    f"{self._server_errors(done)}", name=name)
        return outcome

    def extend(self, name: str, token: str, fence: int, ttl_ms: int) -> bool:
        check_ttl_within(ttl_ms, self._repair_delay_ms, name)
        keys = redis_keys(name, self._prefix)
        script_keys, args = [keys.lock, keys.fence, self._ttls, self._marker, self._incarnation], [token, ttl_ms, fence]
        requests = [ScriptRequest(channel, REDLOCK_EXTEND, script_keys, args) for channel in self._channels]
        self._ask_unknown(self._timeout(ttl_ms / 1000.0))
        with self._turn("extend", name, urgent=True):
            started = now()
            done, handles = run_scripts(requests, self._timeout(ttl_ms / 1000.0), self._settled)
        self._reconnecting(self._failures(done, started, self._timeout(ttl_ms / 1000.0)))
        codes = self._counted(done)
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

    def leave(self, name: str, token: str) -> None:
        """Redlock has no fair queue: nothing to leave."""

    def extend_many(self, leases: list[tuple[str, str, int, int]]) -> list[bool | None]:
        """The watchdog's batch on every node at once; a lease is extended where a quorum extended it."""
        calls = [partial(self._extend_many_on, j, leases) for j in range(self._n)]
        longest = max(ttl for _, _, _, ttl in leases) / 1000.0
        self._ask_unknown(self._timeout(longest))  # (a node that failed is asked who it is again: `_reconnecting`)
        count = len(leases)
        started = now()
        done, _ = fan_out(calls, self._timeout(longest),
                                lambda so_far: batch_settled(self._known_rows(so_far), count, self._n),
                                lanes=self._channels)
        if now() - started >= self._timeout(longest):  # (a batch settled early waited for no one: no failure)
            self._reconnecting(i for i in range(self._n) if done.get(i) is None)
        if any(row is not None and 1 in row and self._ids[i] is None for i, row in done.items()):
            self._identified()  # (a "yes" waits for who its node is: see `_counted`)
        return batch_outcomes(self._known_rows(done), count, self._n)

    def _known_rows(self, done: dict[int, list[int] | None]) -> dict[int, list[int] | None]:
        """A renewal batch's replies as they count (see `_codes`)."""
        return {i: row if row is None or self._ids[i] is not None else [NO_ANSWER if c == 1 else c for c in row]
                for i, row in done.items()}

    def _extend_many_on(self, j: int, leases: list[tuple[str, str, int, int]]) -> list[int] | None:
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
                reply = run_script(self._nodes[j], REDLOCK_EXTEND_MANY,
                                         [*keys, self._ttls, self._marker, self._incarnation], args,
                                         name=leases[first][0], where=self._shown[j])
            except BackendError:
                return None
            codes += [node_code(code) for code in reply]  # (a node that does not count: no answer)
        return codes

    # -- operators (fencelock status / list / release --force) -----------------------------------------------

    def _views(self, lua: Any, name: str, removing: bool) -> list[NodeView | None]:
        """`lua` (status or force_release) on every node at once; None for a node that did not answer."""
        self._contact(self._timeout(DEFAULT_TTL), name)
        keys = redis_keys(name, self._prefix)
        deadlines, _ = fair_keys(name, self._prefix)
        # With the marker and the incarnation: a node that does not count answers "not ready" (`NodeView.unready`).
        script_keys = ([keys.lock, keys.fence, keys.waiters, keys.wake, keys.queue, deadlines] if removing
                       else [keys.lock, keys.fence, deadlines]) + [self._marker, self._incarnation]
        args: list[Any] = [0, "redlock"] if removing else []
        requests = [ScriptRequest(channel, lua, script_keys, args) for channel in self._channels]
        done, _ = run_scripts(requests, look_timeout(self._timeout(DEFAULT_TTL)),
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

    def status(self, name: str) -> LockStatus:
        """The lock as a majority sees it: held when a quorum holds one grant (see `majority_status`)."""
        return self._majority(name, self._views(STATUS, name, False), "the status")

    def scan(self, pattern: str) -> list[LockStatus]:
        """Every lock a quorum holds whose name matches `pattern`: SCAN on every node, then each name's status.

        Any quorum of answering nodes shares a node with the quorum that holds a lock, so it sees every held one.
        """
        self._contact(self._timeout(DEFAULT_TTL), None)
        calls = [partial(self._scan_node, i, pattern) for i in range(self._n)]
        done, _ = fan_out(calls, SCAN_TIMEOUT, lambda so_far: len(so_far) == self._n, lanes=self._channels)
        found = [names for i, names in done.items() if isinstance(names, set) and self._ids[i] is not None]
        if len(found) < self._q:
            unready = [self._shown[i] for i, names in done.items() if names is False]
            out = f" ({', '.join(unready)} not ready: lost its data or restarted)" if unready else ""
            raise QuorumUnavailable(f"listing the locks matching {pattern!r} reached {len(found)} of {self._n} "
                                    f"nodes that count{out}; {self._q} are needed")
        held = []
        for name in sorted(set[str]().union(*found)):
            status = self.status(name)
            if status.held:
                held.append(status)
        return held

    def _scan_node(self, i: int, pattern: str) -> set[str] | bool | None:
        """Node i's names matching `pattern`; False if it does not count (not ready: its names may lack a holder's,
        as its gate says), None if it failed."""
        view = self._gate(i, True)
        if view is not None and view.gate is not Gate.READY:
            return None if view.gate is Gate.UNKNOWN else False
        try:
            return scan_names(self._nodes[i], pattern, self._prefix, where=self._shown[i], cluster=False)
        except BackendError:
            return None

    def force_release(self, name: str) -> LockStatus:
        """Remove the lock's key on every node, whoever holds it; returns what a majority held before (if no
        majority agrees: QuorumUnavailable, and the nodes that answered are clear)."""
        views = self._views(FORCE_RELEASE, name, True)
        return self._majority(name, views, "the forced release (run it again: the nodes that answered are clear)")

    # -- nodes that lost their data -------------------------------------------------------------------------

    def _unavailable(self, why: str, name: str, answers: list[Answer],
                     views: list[GateView | None] | None) -> QuorumUnavailable:
        """QuorumUnavailable naming every node, its state and when its quarantine ends (`unavailable`)."""
        text, states, found = unavailable(why, self._shown, answers, views, time.time())
        if not given_up():  # (a cancelled caller's requests were not sent: that says nothing about the nodes)
            changed, self._reported = newly_out(self._reported, states)
            for i in changed:  # once per change of a node's state, not at every retry of a waiter
                emit("node_out", name, "redlock", "acquire", error=states[i].describe())
        return QuorumUnavailable(text, name=name, nodes=tuple(states), retry_in=found.eta)

    def nodes(self) -> NodesReport:
        """Every node's bookkeeping as an operator sees it, read without changing anything, and the verdict."""
        self._contact(GATE_TIMEOUT, None)
        views = self._look(GATE_TIMEOUT, peek=True)
        states = node_states(self._shown, views, time.time(), self._repair_delay_ms / 1000.0)
        return NodesReport(tuple(states), verdict(states, self._n))

    # -- who each node is ---------------------------------------------------------------------------------------

    def _check_independent(self, name: str | None, timeout: float) -> None:
        """Raise `NotIndependent` if the nodes were found not to be independent; ask the others (`_ask_unknown`)."""
        self._ask_unknown(timeout)
        if self._problem is not None:
            raise NotIndependent(self._problem, name=name)

    def _ask_unknown(self, timeout: float) -> None:
        """Ask the nodes whose role is not known yet who they are, in the background (a replica is refused at the
        next request); meanwhile each node's acquire reply says which server it is (`_who_answered`)."""
        if self._problem is None and not all(self._roles) and not self._identifying and not self._closed:
            self._identifying = self._contacted = True
            self._identifying_now = start(partial(self._identify, look_timeout(timeout)))

    def _who_answered(self, answers: list[Answer], done: dict[int, Any]) -> str | None:
        """Learn each node's server from its acquire reply (its run_id), and ask a node that refused as a
        replica (READONLY) who it is; why the nodes are not independent, if they are not (`not_independent`)."""
        for i, answer in enumerate(answers):
            known = self._ids[i]
            if answer.run and (known is None or known.run_id != answer.run):
                self._ids[i] = Identity(answer.run, None if known is None else known.replica_of)
        replicas = [i for i, reply in done.items() if isinstance(reply, ReadOnlyError)]
        if replicas:
            found, _ = fan_out([partial(self._identity, i) for i in replicas], GATE_TIMEOUT,
                                     lambda so_far: len(so_far) == len(replicas))
            for k, i in enumerate(replicas):
                self._ids[i] = found.get(k) or self._ids[i]
                self._roles[i] = self._roles[i] or k in found
        self._problem = self._problem or not_independent(self._shown, self._ids, self._places)
        return self._problem

    def _contact(self, timeout: float, name: str | None) -> None:
        """Before an operator's request: at first contact, and after a node failed (it may reconnect to another
        server: `_reconnecting`), ask the nodes not known who they are (`Identity`) and wait for the answers, so
        that only the replies of distinct masters count (`_codes`, `_views`); else in the background.
        `NotIndependent` names the URLs if they are not independent."""
        if self._problem is None and not all(self._roles) and (not self._contacted or not self._identifying):
            self._contacted = self._identifying = True
            self._identify(look_timeout(timeout))
        self._check_independent(name, timeout)

    def _server_errors(self, done: dict[int, Any]) -> str:
        """The nodes that answered with an error of their own (`server_error`), for a message: they are not down."""
        found = [(i, server_error(reply)) for i, reply in sorted(done.items())]
        return "".join(f"; {self._shown[i]}: server error: {error}" for i, error in found if error is not None)

    @staticmethod
    def _failed(reply: Any) -> bool:
        """No answer, or a network fault (not the server's own error): its next request connects anew. A request
        the client kept (`Held`: it never left the client) says nothing about its node."""
        return reply is None or (isinstance(reply, Exception) and not isinstance(reply, Held)
                                 and server_error(reply) is None)

    def _failures(self, done: dict[int, Any], started: float, timeout: float) -> list[int]:
        """The nodes that failed a request sent at `started`: a network fault, or no answer within `timeout`. A node
        whose reply was still on its way when a quorum settled the request early has not failed."""
        timed_out = now() - started >= timeout
        return [i for i in range(self._n)
                if (timed_out or done.get(i) is not None) and self._failed(done.get(i))]

    def _reconnecting(self, nodes: Iterable[int]) -> None:
        """These nodes failed: their next connection may reach another server (a moved DNS name or virtual IP,
        a replica promoted behind a proxy). Who each is gets asked again (`_ask_unknown`, `_contact`), and until
        then no "yes" of theirs counts (`_codes`); an acquire's reply says at once (`_who_answered`)."""
        for i in nodes:
            self._ids[i], self._roles[i] = None, False

    def _identify(self, timeout: float) -> None:
        """Ask every node whose role is not known yet who it is (`_identity`); nothing once the client is closed."""
        try:
            asked = [i for i in range(self._n) if not self._roles[i] and not self._closed]
            done, _ = fan_out([partial(self._identity, i) for i in asked], timeout,
                                    lambda so_far: len(so_far) == len(asked))
            for k, i in enumerate(asked):
                found = done.get(k)
                if found is not None:
                    self._ids[i], self._roles[i] = found, True
            self._problem = self._problem or not_independent(self._shown, self._ids, self._places)
        finally:
            self._identifying = False

    def _identity(self, i: int) -> Identity | None:
        """Node i's run_id and role, or None if it did not say (`Identity`)."""
        client: Any = self._nodes[i]
        try:
            with client.pipeline(transaction=False) as pipe:
                pipe.info("server")
                pipe.info("replication")
                server, replication = pipe.execute()
        except CLIENT_ERRORS:
            return None
        return Identity.from_info(server, replication)

    # -- gates ----------------------------------------------------------------------------------------------------

    def _durable_run(self, i: int) -> str:
        """Node i's run_id if that very process runs AOF with fsync always (`durable_run`), else ''."""
        client: Any = self._nodes[i]
        try:
            with client.pipeline(transaction=False) as pipe:
                pipe.config_get("appendonly")
                pipe.config_get("appendfsync")
                pipe.info("server")
                appendonly, appendfsync, info = pipe.execute(raise_on_error=False)
        except CLIENT_ERRORS:
            return ""
        if any(isinstance(reply, Exception) for reply in (appendonly, appendfsync, info)):
            return ""  # CONFIG refused (a managed service, an ACL): not known to be durable
        return durable_run(appendonly.get("appendonly"), appendfsync.get("appendfsync"), info)

    def _gate(self, i: int, peek: bool, delay_ms: int | None = None) -> GateView | None:
        """Node i's gate (`redlock_gate.lua`); UNKNOWN if it failed. If its server restarted since, the gate asks
        whether it is durable (`_durable_run`), and is asked again saying so. `delay_ms`: the quarantine to ask for
        (default: this client's repair delay)."""
        durable = "?"
        while True:
            args = [self._repair_delay_ms if delay_ms is None else delay_ms, self._window_ms,
                    secrets.token_hex(16), 1 if peek else 0, durable]
            try:
                raw = run_script(self._nodes[i], REDLOCK_GATE, self._gate_keys, args, name="",
                                       where=self._shown[i])
                view = GateView.decode(raw)
            except (BackendError, ValueError, TypeError):
                return GateView(Gate.UNKNOWN)
            if view.gate is not Gate.RESTARTED or durable != "?":
                return view
            durable = self._durable_run(i)

    def _look(self, timeout: float, peek: bool = False) -> list[GateView | None]:
        done, _ = fan_out([partial(self._gate, i, peek) for i in range(self._n)], look_timeout(timeout),
                                lambda so_far: len(so_far) == self._n)
        return [done.get(i) for i in range(self._n)]

    def _heal(self, timeout: float) -> tuple[bool, list[GateView | None]]:
        """Look at every node's gate and follow `plan_heal`: mark a new deployment, repair what can be repaired.

        Returns whether some node counts again (worth another round now), and the look.
        """
        self._healing = True
        try:
            views = self._look(timeout)
            plan = plan_heal(views, self._n, self._repair, busy=self._repairing)
            if plan.fresh:
                return self._mark_new(views, timeout), views
            if not plan:
                return False, views
            calls = ([partial(self._mark, i, views[i], "plain") for i in plan.plain]
                     + [partial(self._repair_node, r) for r in plan.repairs])
            done, _ = fan_out(calls, look_timeout(timeout) * 2, lambda so_far: len(so_far) == len(calls))
            return any(done.values()), views
        finally:
            self._healing = False

    def _shared_heal(self, timeout: float) -> tuple[bool, list[GateView | None] | None]:
        """The heal an attempt called for: the one already running if there is one. Attempts that meet unready
        nodes at the same time (many waiters of a new client) share it, so its requests and connections stay few.
        A heal not done in time counts as one that healed nothing."""
        with self._heal_lock:  # (threads look at once)
            handle = self._heal_now
            if handle is None or handle.done():
                handle = self._heal_now = start(partial(self._heal, timeout))
        done, _ = wait_first({handle}, look_timeout(timeout) * 4)
        return handle.result() if handle in done else (False, None)

    def _mark_new(self, views: list[GateView | None], timeout: float) -> bool:
        """A new deployment (every node fresh): claim every node for it, then, if every claim held, mark all, with
        one floor (`deployment_floor`)."""
        deployment, floor = deployment_id(views), deployment_floor(views)
        for mode in NEW_DEPLOYMENT:
            calls = [partial(self._mark, i, views[i], mode, deployment, floor) for i in range(self._n)]
            done, _ = fan_out(calls, look_timeout(timeout), lambda so_far: len(so_far) == self._n)
            step = deployment_step(mode, [bool(done.get(i)) for i in range(self._n)])
            if step is not None:
                return step
        return True

    def _mark(self, i: int, view: GateView | None, mode: str, deployment: str = "0", floor: int = 0) -> bool:
        """Claim or mark node i (claim, fresh: a new deployment; plain: repair=False) as `mark_args` says."""
        try:
            code = run_script(self._nodes[i], REDLOCK_MARK, self._gate_keys[:2],
                                    mark_args(view, mode, deployment, floor), name="", where=self._shown[i])
        except BackendError:
            return False
        return marked(int(code))

    def _repair_node(self, repair: Repair) -> bool:
        """Raise node i's hwm to what `repaired` merges from the ready others, then mark it (`repair_marks`)."""
        i = repair.node
        self._repairing.add(i)
        try:
            others, delays = [], []
            for j in repair.sources:
                read = self._read_fences(j)
                if read is not None:
                    others.append((read[0], read[1]))
                    delays.append(read[2])
            merged = repaired(others, self._n, repair.clock)
            if merged is None:
                return False  # not enough ready nodes answered: it stays out, and a later attempt tries again
            delay_ms = round(required_delay(self._repair_delay_ms / 1000.0, delays) * 1000)
            if delay_ms > self._repair_delay_ms:
                # A client with a longer repair delay (so maybe a longer TTL) was granted a lease on the others:
                # the quarantine must last that long. The gate keeps the longest asked for; the mark checks it.
                view = self._gate(i, False, delay_ms)
                if view is None or view.nonce != repair.nonce:
                    return False
            for fence_keys, args in repair_marks(repair, *merged):
                code = int(run_script(self._nodes[i], REDLOCK_MARK, self._gate_keys[:2] + fence_keys, args,
                                            name="", where=self._shown[i]))
                progress = repair_progress(code)
                if progress is not None:
                    return progress
            return True
        except BackendError:
            return False
        finally:
            self._repairing.discard(i)

    def _read_fences(self, j: int) -> tuple[int, dict[str, int], float] | None:
        """A ready node's floor, hwm keys and the longest TTL of a lease there that may still be valid (seconds,
        `live_ttl`). None: it did not count before or after the reads (not ready, or its server restarted since it
        was marked), or failed."""
        client: Any = self._nodes[j]
        before = self._gate(j, True)
        if before is None or before.gate is not Gate.READY:
            return None
        try:
            # Keys as bytes whatever the client's decoding; kept as text that goes back out as the same bytes.
            keys = [key for key in client.scan_iter(match=fence_match(self._prefix).encode("utf-8"),
                                                          count=1000, NEVER_DECODE=True)]
            values: dict[str, int] = {}
            for start in range(0, len(keys), REPAIR_BATCH):
                batch = keys[start:start + REPAIR_BATCH]
                for key, value in zip(batch, client.mget(batch), strict=True):
                    if value is not None:
                        values[bytes(key).decode("utf-8", "surrogateescape")] = int(value)
            with client.pipeline(transaction=False) as pipe:
                pipe.time()
                pipe.zrange(self._ttls, 0, -1, withscores=True)
                (seconds, micros), entries = pipe.execute()
            delay = live_ttl(entries, seconds * 1000 + micros / 1000)
        except CLIENT_ERRORS:
            return None
        after = self._gate(j, True)  # one process throughout: a restart in between would show here
        if after is None or after.gate is not Gate.READY or after.nonce != before.nonce:
            return None
        return before.floor, values, delay

    def close(self) -> None:
        self._closed = True
        for channel in self._channels:
            channel.close()
        if self._owns_clients:
            for node in self._nodes:
                client: Any = node
                close_client(client)
