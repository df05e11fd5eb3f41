"""Redlock over N independent Redis masters, with fencing tokens: every rule, without I/O.

The fencing rule borrows the Paxos acceptor. Each node keeps, per name, a high-water mark `hwm` (no TTL). A node
grants a proposal `t` only if the lock key is absent AND `t > hwm`; then it sets the key and `hwm = t`. A client
proposes `t = 1 + the highest hwm it knows`, and a grant is a quorum of nodes that accepted the same `t`; the
lease's fence is `t`.

Why fences then increase: any two quorums share a node, and one node runs one script at a time, so whichever
grant that node saw second needed a larger `t`. A holder that paused past its TTL therefore always holds a smaller
fence than the holder after it. Clocks (TTL expiry, client drift, a server's clock jumping) decide *when* a grant
is possible, never *which* fence it gets.

That holds while no node's `hwm` goes backwards. A node counts only while it has its marker key; a node that lost
its data (restarted without fsync) comes back without it, and every unmarked data set is brought back by one of
three exits (`plan_heal`; the reasons are in docs/design/redlock.md):

1. fresh: a data set first seen less than `FRESH_WINDOW` ago, never marked, answers "fresh" to every client. A
   client that hears "fresh" from *every* node in one look claims each for the deployment it saw (the digest
   of all nonces), and once every claim held marks them all: a new deployment, nothing to lose. Concurrent
   clients see the same nonces, so their claims agree and they all mark (idempotent); a look that straddled
   another client's marks and a node's loss has another digest, and its claim fails;
2. repair: any other unmarked data set is quarantined for `repair_delay` (longer than any TTL in use) from when it
   was first seen, so every lease from before the loss has expired. Then its `hwm` for every name becomes the
   maximum over a quorum of the *other*, ready nodes (any earlier grant's quorum shares a node with it);
3. floor: with fewer than a quorum of ready others (a minority down at first contact, a crashed initialisation, a
   majority restarted empty), it gets the maximum of what the ready others answered and a *floor* taken from its
   own clock in microseconds, far above any counter: fences keep increasing as long as no node's clock is behind
   an earlier floor by more than the proposals made since.

Each data set has a random nonce (its incarnation), and the mark lands only on the incarnation the client looked
at, after its quarantine: a node that loses its data again mid-repair is never marked with what it lost.

`NodeModel` is the acceptor as plain Python: the specification `_scripts/redlock_acquire.lua` implements, and the
model the Hypothesis state machine in `tests/logic/test_redlock_model.py` runs against.
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._logic.outcomes import Released
from .channel import Resent

DEFAULT_REPAIR_DELAY = 60.0
"""Seconds a node that lost its data stays out before it is repaired: must exceed the longest TTL in use."""

FRESH_WINDOW = 5.0
"""Seconds a never-marked data set answers "fresh" after it is first seen (at most the repair delay)."""


def fresh_window(repair_delay: float) -> float:
    return min(FRESH_WINDOW, repair_delay)

MAX_ROUNDS = 3
"""Proposals one attempt may make: a refusal for a stale `t` teaches the client the nodes' hwm at once."""


def quorum(n: int) -> int:
    return n // 2 + 1


NO_ANSWER = -2
"""A node's release or extend that got no answer (its scripts answer 1, 0 or -1)."""
UNSURE = 2
"""A node's release whose second sending found the key gone: its first sending may have deleted it."""


def node_code(reply: Any) -> int:
    """A node's release or extend reply as 1, 0, -1, NO_ANSWER or UNSURE."""
    if reply is None or isinstance(reply, Exception):
        return NO_ANSWER
    code = int(reply)
    return UNSURE if code == 0 and isinstance(reply, Resent) else code


def release_outcome(codes: Sequence[int], n: int) -> Released | None:
    """A release's result from every node's code: RELEASED on a quorum; UNSURE when a quorum released or may
    have; None when the nodes that did not answer could make that quorum (whether it held is unknown)."""
    q = quorum(n)
    released, unsure = codes.count(1), codes.count(UNSURE)
    if released >= q:
        return Released.RELEASED
    if released + unsure >= q:
        return Released.UNSURE
    if released + unsure + codes.count(NO_ANSWER) >= q:
        return None
    return Released.TAKEN if -1 in codes else Released.EXPIRED


def extend_outcome(codes: Sequence[int], n: int) -> bool | None:
    """An extend's result: True on a quorum; None when the nodes that did not answer could make it."""
    q = quorum(n)
    extended = codes.count(1)
    if extended >= q:
        return True
    return None if extended + codes.count(NO_ANSWER) >= q else False


def settled(codes: Sequence[int], n: int) -> bool:
    """A release or extend is decided once a quorum did it (`codes`: those of the nodes that answered so far),
    or every node answered."""
    return len(codes) == n or codes.count(1) >= quorum(n)


def check_node_count(n: int) -> None:
    if n < 3:
        raise ValueError(f"url: Redlock needs at least 3 independent nodes (5 recommended), got {n}")


def default_node_timeout(ttl: float) -> float:
    """How long one node may take to answer one attempt: 50 ms plus 1 % of the TTL (why: docs/decisions/0005).

    Safety never depends on it, only how soon a slow node stops counting; an attempt ends once a quorum answered.
    """
    return 0.05 + ttl * 0.01


class Reply(enum.Enum):
    GRANTED = "granted"     # the node accepted our proposal
    HELD = "held"           # another token holds the key on that node
    STALE = "stale"         # the key is free there, but our proposal was not above its hwm
    UNREADY = "unready"     # the node lost its data and is not repaired yet
    FAILED = "failed"       # no answer in time, or an error


@dataclass(frozen=True)
class Answer:
    reply: Reply
    hwm: int = 0                  # the node's hwm when it refused (or our t when it granted)
    pttl: float | None = None     # HELD: seconds until the holder's key expires there


def decode(raw: Sequence[int]) -> Answer:
    """A node's script reply: {1, t} granted, {0, hwm, pttl_ms} refused, {-1, 0, 0} unready."""
    code = int(raw[0])
    if code == 1:
        return Answer(Reply.GRANTED, int(raw[1]))
    if code == -1:
        return Answer(Reply.UNREADY)
    pttl = int(raw[2])
    if pttl >= 0:
        return Answer(Reply.HELD, int(raw[1]), pttl / 1000.0)
    return Answer(Reply.STALE, int(raw[1]))


_FAILED = Answer(Reply.FAILED)


def node_answer(reply: Any) -> Answer:
    """A node's acquire reply as an Answer: no reply, or an error, is a failure."""
    return _FAILED if reply is None or isinstance(reply, Exception) else decode(reply)


class Outcome(enum.Enum):
    GRANTED = "granted"
    REFUSED = "refused"           # enough nodes said no: the lock is held, or our t was stale
    UNAVAILABLE = "unavailable"   # too many nodes did not answer for any quorum to be possible


def decide(answers: Iterable[Answer | None], n: int) -> Outcome | None:
    """The attempt's outcome as soon as it is known (None: wait for more answers; pending ones are None)."""
    q = quorum(n)
    granted = failed = refused = 0
    for answer in answers:
        if answer is None:
            continue
        if answer.reply is Reply.GRANTED:
            granted += 1
        elif answer.reply is Reply.FAILED:
            failed += 1
        else:
            refused += 1
    if granted >= q:
        return Outcome.GRANTED
    if granted + (n - granted - failed - refused) >= q:
        return None  # a quorum is still possible
    return Outcome.UNAVAILABLE if failed > n - q else Outcome.REFUSED


def next_proposal(known: int, answers: Iterable[Answer | None]) -> int:
    """1 + the highest hwm the client knows of, including what these answers taught it."""
    highest = known
    for answer in answers:
        if answer is not None and answer.reply is not Reply.FAILED:
            highest = max(highest, answer.hwm)
    return highest + 1


def worth_another_round(answers: Iterable[Answer | None], n: int, released: int = 0) -> bool:
    """A refused attempt may propose again at once if enough refusals were not for a key that stays held.

    A refusal for a stale `t` is not (the answer taught the client the node's hwm). Neither is a key whose hwm is
    at most `released`, the fence of the release that just woke this waiter: that is the releaser's own key, and
    its release is on its way to that node (it reached the waiter's home node first). Blocking again instead
    would wait for a wake-up that already came, while the lock is free.
    """
    held = sum(1 for a in answers
               if a is not None and (a.reply is Reply.UNREADY or (a.reply is Reply.HELD and a.hwm > released)))
    return held <= n - quorum(n)


def holder_ttl(answers: Iterable[Answer | None], n: int) -> float | None:
    """When a quorum could be free again: the quorum-th shortest remaining TTL among the holders' keys."""
    ttls = sorted(a.pttl for a in answers if a is not None and a.pttl is not None)
    free_elsewhere = n - len(ttls)
    needed = quorum(n) - free_elsewhere
    if needed <= 0:
        return 0.0
    return ttls[needed - 1] if needed <= len(ttls) else None


def learned(known: int, answers: Iterable[Answer | None], t: int) -> int:
    """Where the next proposal for a name starts: the highest hwm the answers showed, and at least `t`.

    At least `t`, because a failed round's give-backs may still be on their way and match this token and `t`."""
    return max(t, next_proposal(known, answers) - 1)


FALLBACK_PAUSE = 0.05
"""Seconds: the longest retry pause of a waiter whose home node cannot be reached."""


def fallback_pause(wait: float) -> float:
    """The longest pause of a waiter whose home node could not be reached (the pause itself is drawn at random)."""
    return min(wait, FALLBACK_PAUSE)


class Heal(enum.Enum):
    """Whether a round's answers call for a look at every node's gate."""

    NO = "no"
    BACKGROUND = "background"   # granted while a node is out: bring it back, but not on the caller's time
    NOW = "now"                 # refused while a node is out that, ready again, could make up a quorum


@dataclass(frozen=True)
class Tally:
    """One round's answers counted: its outcome, the nodes to give its `t` back on, and whether to heal."""

    outcome: Outcome
    reachable: int                  # nodes that answered
    usable: int                     # ... and have their data
    give_back: tuple[int, ...]      # refused: the nodes that granted `t`, or did not answer (they may still)
    heal: Heal


def tally(answers: Sequence[Answer], n: int, healing: bool = False) -> Tally:
    """Count one round's answers, one per node (no answer in time is FAILED); `healing`: a heal is running."""
    outcome = decide(answers, n)
    if outcome is None or len(answers) != n:
        raise ValueError(f"answers: a round is counted with one answer per node ({n}), got {len(answers)}")
    unready = any(a.reply is Reply.UNREADY for a in answers)
    reachable = sum(1 for a in answers if a.reply is not Reply.FAILED)
    usable = sum(1 for a in answers if a.reply not in (Reply.FAILED, Reply.UNREADY))
    if outcome is Outcome.GRANTED:
        return Tally(outcome, reachable, usable, (), Heal.BACKGROUND if unready and not healing else Heal.NO)
    give_back = tuple(i for i, a in enumerate(answers) if a.reply in (Reply.GRANTED, Reply.FAILED))
    return Tally(outcome, reachable, usable, give_back, Heal.NOW if unready and reachable >= quorum(n) else Heal.NO)


class Next(enum.Enum):
    GRANT = "grant"               # the lease is ours, with fence `t`
    REFUSE = "refuse"             # the lock is held (or the rounds are used up): retry after `retry_in`
    PROPOSE = "propose"           # propose `t` at once
    UNAVAILABLE = "unavailable"   # too few nodes count: raise QuorumUnavailable saying `why`


@dataclass(frozen=True)
class Step:
    """What an attempt does after a round (and the heal it called for)."""

    next: Next
    t: int = 0                      # GRANT: the fence; PROPOSE: the next proposal
    retry_in: float | None = None   # REFUSE: when a quorum could be free again (None: unknown)
    why: str = ""                   # UNAVAILABLE: the error's reason, before the nodes' states


def next_step(answers: Sequence[Answer], counted: Tally, t: int, n: int, *, rounds: int, healed: bool = False,
              released: int = 0, timeout: float = 0.0) -> Step:
    """After round `rounds` (from 1) proposed `t`: grant, refuse, propose again, or give up as unavailable.

    `healed`: the heal this round called for brought some node back; `released`: the fence of the release that
    woke this waiter (see `worth_another_round`); `timeout`: the per-node timeout, for the error."""
    q = quorum(n)
    if counted.outcome is Outcome.GRANTED:
        return Step(Next.GRANT, t)
    if counted.outcome is Outcome.UNAVAILABLE:
        return Step(Next.UNAVAILABLE, why=f"only {counted.reachable} of {n} nodes answered within {timeout:.3f} s; "
                                          f"{q} are needed")
    if not healed and counted.usable < q:
        # Nobody holds it: too few nodes count. Say which, and until when (never "the lock is busy").
        return Step(Next.UNAVAILABLE, why=f"only {counted.usable} of {n} nodes are ready; {q} are needed")
    if not (healed or worth_another_round(answers, n, released)):
        return Step(Next.REFUSE, retry_in=holder_ttl(answers, n))
    if rounds >= MAX_ROUNDS:
        return Step(Next.REFUSE)
    return Step(Next.PROPOSE, next_proposal(t, answers))


def repaired_hwm(others: Sequence[Mapping[str, int]], n: int) -> dict[str, int] | None:
    """The hwm to give a repaired node: per key, the maximum over the other nodes' answers.

    `others` are the fence keys and values read from other, healthy nodes. Fewer than a quorum of them: None,
    because only a quorum of others is sure to share a node with every earlier grant.
    """
    if len(others) < quorum(n):
        return None
    merged: dict[str, int] = {}
    for values in others:
        for key, value in values.items():
            if value > merged.get(key, 0):
                merged[key] = value
    return merged


class Gate(enum.Enum):
    """Where a node's data set stands, as `_scripts/redlock_gate.lua` answers."""

    READY = "ready"               # it has its marker: it counts
    FRESH = "fresh"               # first seen less than the fresh window ago, never marked
    QUARANTINED = "quarantined"   # unmarked; waiting out the repair delay
    REPAIRABLE = "repairable"     # unmarked, and the delay is over: repair it now
    UNKNOWN = "unknown"           # the node did not answer


@dataclass(frozen=True)
class GateView:
    """One node's gate answer: its state, its incarnation, seconds until its quarantine ends, and its floor."""

    gate: Gate
    nonce: str = ""
    left: float = 0.0
    floor: int = 0

    @classmethod
    def decode(cls, raw: Sequence[object]) -> GateView:
        state, nonce, left, floor = (x.decode() if isinstance(x, bytes) else x for x in raw)
        return cls(Gate(str(state)), str(nonce), int(str(left)) / 1000.0, int(str(floor)))


@dataclass(frozen=True)
class Repair:
    """Raise node `node` (incarnation `nonce`) from the ready nodes `sources`, then mark it.

    `clock`: fewer than a quorum of ready others, so its floor is also taken from its own clock."""

    node: int
    nonce: str
    sources: tuple[int, ...]
    clock: bool


@dataclass(frozen=True)
class HealPlan:
    fresh: tuple[int, ...] = ()         # a new deployment: mark these at once
    repairs: tuple[Repair, ...] = ()
    plain: tuple[int, ...] = ()         # repair=False: mark every unmarked node at once, with a clock floor

    def __bool__(self) -> bool:
        return bool(self.fresh or self.repairs or self.plain)


def deployment_id(views: Sequence[GateView | None]) -> str:
    """A new deployment as one look saw it: the digest of every node's nonce. Every client that looked at the
    same data sets computes the same one, and a node is claimed for one only (`redlock_mark.lua`, claim)."""
    joined = "|".join("" if view is None else view.nonce for view in views)
    return hashlib.sha256(joined.encode()).hexdigest()[:32]


def plan_heal(views: Sequence[GateView | None], n: int, repair: bool = True,
              busy: Collection[int] = ()) -> HealPlan:
    """What a client does after one look at every node's gate (None: no answer); `busy`: nodes this client is
    repairing already, left out of the repairs."""
    if all(v is not None and v.gate is Gate.FRESH for v in views):
        return HealPlan(fresh=tuple(range(n)))  # every node answered, none was ever used: a new deployment
    answered = [(i, v) for i, v in enumerate(views) if v is not None and v.gate is not Gate.UNKNOWN]
    if not repair:
        return HealPlan(plain=tuple(i for i, v in answered if v.gate is not Gate.READY))
    ready = tuple(i for i, v in answered if v.gate is Gate.READY)
    return HealPlan(repairs=tuple(Repair(i, v.nonce, ready, len(ready) < quorum(n))
                                  for i, v in answered if v.gate is Gate.REPAIRABLE and i not in busy))


def repaired(others: Sequence[tuple[int, Mapping[str, int]]], n: int, clock: bool) -> tuple[int, dict[str, int]] | None:
    """The floor and hwm to give a repaired node: the maximum over the others' (floor, hwm) answers.

    Without `clock`, fewer than a quorum of others is None: only a quorum of others is sure to share a node with
    every earlier grant. With it, whatever answered is merged, and the node's clock supplies the rest.
    """
    if not clock and len(others) < quorum(n):
        return None
    merged = repaired_hwm([values for _, values in others], 0) or {}
    return max((floor for floor, _ in others), default=0), merged


GATE_TIMEOUT = 1.0
"""Seconds: the least time a look at every node's gate (or a mark) is given; it must hear every node, over cold
connections too, to call a deployment new."""


def look_timeout(timeout: float) -> float:
    """How long a look at the gates, a claim or a fresh mark may take, given the attempt's per-node timeout."""
    return max(timeout, GATE_TIMEOUT)


NEW_DEPLOYMENT = ("claim", "fresh")
"""The marks a new deployment takes, in order, each on every node: claim each for its digest, then mark all."""


def deployment_step(mode: str, held: Sequence[bool]) -> bool | None:
    """After `mode` ran on every node (`held`: it held there): None to go on, or whether some node counts now.

    A claim that failed anywhere ends it (another look has another digest); a fresh mark counts where it held."""
    if mode not in NEW_DEPLOYMENT:
        raise ValueError(f"mode: a new deployment's marks are {NEW_DEPLOYMENT}, got {mode!r}")
    if all(held):
        return True if mode == NEW_DEPLOYMENT[-1] else None
    return mode == "fresh" and any(held)


def mark_args(view: GateView | None, mode: str, deployment: str = "0") -> list[object]:
    """`redlock_mark.lua`'s ARGV for a claim, a fresh mark or a plain one: on the incarnation looked at, and a
    plain mark (repair=False) takes a fence floor from the node's own clock."""
    return ["" if view is None else view.nonce, mode, deployment, 1 if mode == "plain" else 0]


def marked(code: int) -> bool:
    """A claim or mark held (1 done, 0 already marked), or not (another data set, or still quarantined)."""
    return code >= 0


REPAIR_BATCH = 200
"""Fence keys per request when a repair reads or raises them."""


def repair_marks(repair: Repair, floor: int, hwm: Mapping[str, int],
                 batch: int = REPAIR_BATCH) -> list[tuple[list[str], list[object]]]:
    """A repair's `redlock_mark.lua` calls, in order, as (fence keys, ARGV): every batch raises the hwm, and the
    last one also marks the node ("repair"), so that it counts only once every value landed."""
    items = sorted(hwm.items())
    calls: list[tuple[list[str], list[object]]] = []
    for start in range(0, max(1, len(items)), batch):
        chunk = items[start:start + batch]
        mode = "repair" if start + batch >= len(items) else "raise"
        calls.append(([key for key, _ in chunk],
                      [repair.nonce, mode, floor, 1 if repair.clock else 0, *(value for _, value in chunk)]))
    return calls


def repair_progress(code: int) -> bool | None:
    """After one of a repair's marks: None to go on; False when the node lost its data again or is still
    quarantined (a later look starts over); True when another client marked it meanwhile."""
    if code < 0:
        return False
    return True if code == 0 else None


def marker_floor(marker: str) -> int:
    """The fence floor a node's marker carries (`floor:<n>`; any other marker has none)."""
    return int(marker[6:]) if marker.startswith("floor:") and marker[6:].isdigit() else 0


@dataclass(frozen=True)
class NodeState:
    """One Redlock node as an operator sees it (`fencelock nodes`, `Locks.nodes()`). Never shows a password."""

    node: str                        # the node as shown (URL without its password)
    reachable: bool
    ready: bool
    state: str                       # ready, fresh, quarantined, repairable or unreachable
    quarantine_left: float | None    # seconds until its quarantine ends (fresh, quarantined)
    quarantined_until: float | None  # ... as a Unix time, by this machine's clock
    repairable: bool
    floor: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"node": self.node, "reachable": self.reachable, "ready": self.ready, "state": self.state,
                "quarantine_left": self.quarantine_left, "quarantined_until": self.quarantined_until,
                "repairable": self.repairable, "floor": self.floor}

    def describe(self) -> str:
        if self.state == "unreachable":
            return f"{self.node}: unreachable"
        if self.quarantine_left is not None and self.quarantined_until is not None:
            until = time.strftime("%H:%M:%S UTC", time.gmtime(self.quarantined_until))
            waits = "fresh (new or emptied; counts at once only if every node is)" if self.state == "fresh" \
                else "quarantined"
            return f"{self.node}: {waits}, repairable in {self.quarantine_left:.1f} s (at {until})"
        return f"{self.node}: {self.state}"


def node_states(shown: Sequence[str], views: Sequence[GateView | None], now: float) -> list[NodeState]:
    """The operator's records from one look (`now`: this machine's Unix time)."""
    states = []
    for where, view in zip(shown, views, strict=True):
        if view is None or view.gate is Gate.UNKNOWN:
            states.append(NodeState(where, False, False, "unreachable", None, None, False))
            continue
        waiting = view.gate in (Gate.FRESH, Gate.QUARANTINED)
        states.append(NodeState(where, True, view.gate is Gate.READY, view.gate.value,
                                view.left if waiting else None, now + view.left if waiting else None,
                                view.gate is Gate.REPAIRABLE, view.floor))
    return states


@dataclass(frozen=True)
class Verdict:
    available: bool
    ready: int
    needed: int
    eta: float | None    # seconds until a quorum can be ready at the latest (None: not while nodes are out)
    text: str

    def as_dict(self) -> dict[str, object]:
        return {"available": self.available, "ready": self.ready, "needed": self.needed, "eta": self.eta,
                "verdict": self.text}


@dataclass(frozen=True)
class NodesReport:
    """`Locks.nodes()`: every Redlock node's record, and the deployment's verdict."""

    nodes: tuple[NodeState, ...]
    verdict: Verdict

    def as_dict(self) -> dict[str, object]:
        return {**self.verdict.as_dict(), "nodes": [node.as_dict() for node in self.nodes]}


def verdict(states: Sequence[NodeState], n: int) -> Verdict:
    """The deployment as a whole: can a lock be granted now, and if not, when at the latest."""
    q = quorum(n)
    ready = sum(s.ready for s in states)
    reachable = [s for s in states if s.reachable]
    if ready >= q:
        return Verdict(True, ready, q, 0.0, f"available: {ready} of {n} nodes ready, {q} needed")
    if len(reachable) < q:
        return Verdict(False, ready, q, None, f"unavailable: only {len(reachable)} of {n} nodes reachable, "
                                              f"{q} needed; start or reach the others")
    if len(reachable) == n and all(s.state == "fresh" for s in states):
        return Verdict(False, ready, q, 0.0, "new: every node is fresh; the first acquire marks them all")
    lefts = sorted(0.0 if s.quarantine_left is None else s.quarantine_left for s in reachable if not s.ready)
    eta = lefts[q - ready - 1]
    return Verdict(False, ready, q, eta, f"unavailable: {ready} of {n} nodes ready, {q} needed; the next acquire "
                                         f"repairs enough of them in {eta:.1f} s at the latest")


def attempt_states(shown: Sequence[str], answers: Sequence[Answer], views: Sequence[GateView | None] | None,
                   now: float) -> list[NodeState]:
    """Every node's record for an attempt's error: from the look at the gates, or without one (`views` None)
    from the attempt's answers. A node that answered the look but not the attempt is unreachable."""
    if views is None:
        return [NodeState(where, a.reply is not Reply.FAILED, a.reply not in (Reply.FAILED, Reply.UNREADY),
                          {Reply.FAILED: "unreachable", Reply.UNREADY: "not ready"}.get(a.reply, "ready"),
                          None, None, False) for where, a in zip(shown, answers, strict=True)]
    states = node_states(shown, views, now)
    for i, answer in enumerate(answers):
        if answer.reply is Reply.FAILED and states[i].reachable:
            states[i] = NodeState(shown[i], False, False, "unreachable", None, None, False)
    return states


def unavailable(why: str, shown: Sequence[str], answers: Sequence[Answer], views: Sequence[GateView | None] | None,
                now: float) -> tuple[str, list[NodeState], Verdict]:
    """An attempt's QuorumUnavailable: its message naming every node, its state and when its quarantine ends,
    the records, and the verdict (whose `eta` is the error's retry_in)."""
    states = attempt_states(shown, answers, views, now)
    found = verdict(states, len(shown))
    parts = "; ".join(state.describe() for state in states)
    return f"{why}: {parts}. {found.text}", states, found


@dataclass
class NodeModel:
    """One node's state, as the Lua scripts keep it (used as the specification and in the model tests).

    Times are seconds on the node's clock; `clock_us` turns them into the microseconds a floor is taken from.
    """

    ready: bool = True
    hwm: dict[str, int] = field(default_factory=dict)
    locks: dict[str, tuple[str, float]] = field(default_factory=dict)  # name -> (token, expires_at)
    floor: int = 0
    nonce: str | None = None     # the incarnation (None: this data set was never looked at)
    born: float = 0.0
    until: float = 0.0
    fresh: bool = False
    legacy: bool = False         # a key an older fencelock left (fencelock:redlock:seen)
    claim: str | None = None     # the new deployment this data set was claimed for (see `deployment_id`)

    def acquire(self, name: str, token: str, t: int, ttl: float, now: float) -> Answer:
        if not self.ready:
            return Answer(Reply.UNREADY)
        held = self.locks.get(name)
        if held is not None and held[1] <= now:
            del self.locks[name]
            held = None
        hwm = max(self.hwm.get(name, 0), self.floor)
        if held is not None and held[0] != token:
            return Answer(Reply.HELD, hwm, held[1] - now)
        # Free, or held by this same acquisition (an earlier round, or a retry): grant t above the hwm, and the
        # same t again only to the token that holds it.
        if t < hwm or (t == hwm and held is None):
            return Answer(Reply.STALE, hwm)
        self.locks[name] = (token, now + ttl)
        self.hwm[name] = t
        return Answer(Reply.GRANTED, t)

    def release(self, name: str, token: str, t: int) -> bool:
        """Delete the key if it is this grant's, and raise the hwm to t, so the grant's own late acquire is
        refused should this release overtake it (t = 0: any grant of this token, no raise). Never under another
        holder's key: its extend and release must still find hwm equal to its t."""
        held = self.locks.get(name)
        if held is None or held[0] == token:
            self.hwm[name] = max(self.hwm.get(name, 0), t)
        if held is not None and held[0] == token and (t == 0 or self.hwm[name] == t):
            del self.locks[name]
            return True
        return False

    def lose_data(self) -> None:
        """Restart without persistence: everything is gone, the marker and the incarnation too."""
        self.ready = False
        self.hwm.clear()
        self.locks.clear()
        self.floor = 0
        self.nonce = None
        self.born = self.until = 0.0
        self.fresh = self.legacy = False
        self.claim = None

    def gate(self, now: float, delay: float, window: float, nonce: str, peek: bool = False) -> GateView:
        """`redlock_gate.lua`: the first look at a data set starts its fresh window and its quarantine."""
        if self.ready:
            return GateView(Gate.READY, self.nonce or "", 0.0, self.floor)
        born, until, fresh, seen = self.born, self.until, self.fresh, self.nonce
        if seen is None:
            born, until, fresh = now, now + delay, not self.legacy
            if not peek:
                self.nonce, self.born, self.until, self.fresh = nonce, born, until, fresh
                seen = nonce
        if fresh and now < born + window:
            return GateView(Gate.FRESH, seen or "", until - now)
        if now < until:
            return GateView(Gate.QUARANTINED, seen or "", until - now)
        return GateView(Gate.REPAIRABLE, seen or "")

    def mark(self, nonce: str, mode: str, floor: int, clock: bool, values: Mapping[str, int], now: float,
             clock_us: int, deployment: str = "") -> int:
        """`redlock_mark.lua`: 1 done, 0 already marked, -1 another (or not a new) data set, -2 quarantined."""
        if mode == "claim":
            if self.nonce != nonce:
                return -1
            if self.claim is not None:
                return 1 if self.claim == deployment else -1
            if self.ready or not self.fresh:
                return -1
            self.claim = deployment
            return 1
        if self.ready:
            return 0
        if mode != "plain" and self.nonce != nonce:
            return -1
        if mode == "fresh":
            if self.claim != deployment:
                return -1
            self.floor, self.ready = 0, True
            return 1
        if mode == "repair" and now < self.until:
            return -2
        for key, value in values.items():
            if value > self.hwm.get(key, 0):
                self.hwm[key] = value
        if mode == "raise":
            return 1
        self.floor = max(floor, clock_us) if clock else floor
        self.ready = True
        return 1

    def fences(self) -> tuple[int, dict[str, int]] | None:
        """What a repair reads from a ready node: its floor and hwm (None: it is not ready)."""
        return (self.floor, dict(self.hwm)) if self.ready else None
