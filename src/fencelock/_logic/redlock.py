"""Redlock over N independent Redis masters, with fencing tokens: every rule, without I/O.

The fencing rule borrows the Paxos acceptor. Each node keeps, per name, a high-water mark `hwm` (no TTL). A node
grants a proposal `t` only if the lock key is absent AND `t > hwm`; then it sets the key and `hwm = t`. A client
proposes `t = 1 + the highest hwm it knows`, and a grant is a quorum of nodes that accepted the same `t`; the
lease's fence is `t`.

Why fences then increase: any two quorums share a node, and one node runs one script at a time, so whichever
grant that node saw second needed a larger `t`. A holder that paused past its TTL therefore always holds a smaller
fence than the holder after it. Clocks (TTL expiry, client drift, a server's clock jumping) decide *when* a grant
is possible, never *which* fence it gets.

That holds while no node's `hwm` goes backwards. A node that lost its data (restarted without fsync) comes back
without its marker key; it refuses everything until it is repaired:

1. quarantine: it stays out for `repair_delay` (longer than any TTL in use), so every attempt that was in flight
   when it crashed has either finished or failed its validity check;
2. repair: its `hwm` for every name becomes the maximum over a quorum of the *other* nodes. Any earlier grant's
   quorum shares a node with that quorum, so the repaired `hwm` is at least every fence granted so far;
3. only then it gets its marker back and counts again.

A brand-new deployment (every node answers "fresh") counts at once. With any node silent, "fresh" nodes are
treated as nodes that lost their data: a majority that is unreachable while the rest restarted empty must not
look like a new deployment.

`NodeModel` is the acceptor as plain Python: the specification `_scripts/redlock_acquire.lua` implements, and the
model the Hypothesis state machine in `tests/test_redlock_model.py` runs against.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_REPAIR_DELAY = 60.0
"""Seconds a node that lost its data stays out before it is repaired: must exceed the longest TTL in use."""

MAX_ROUNDS = 3
"""Proposals one attempt may make: a refusal for a stale `t` teaches the client the nodes' hwm at once."""


def quorum(n: int) -> int:
    return n // 2 + 1


def check_node_count(n: int) -> None:
    if n < 3:
        raise ValueError(f"url: Redlock needs at least 3 independent nodes (5 recommended), got {n}")


def default_node_timeout(ttl: float) -> float:
    """How long one node may take to answer one attempt: 50 ms plus 1 % of the TTL.

    Safety never depends on it, only how soon a slow node stops counting, and an attempt ends as soon as a
    quorum has answered. Shorter values made healthy nodes miss it on this 2-core machine: at 5 ms on cold
    connections (connect, then redis-py's handshake), and at 20 ms on cold connections under a full test suite.
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
    """What a node without its marker key needs, as `_scripts/redlock_gate.lua` answers."""

    READY = "ready"               # it has its marker: it counts
    FRESH = "fresh"               # no client saw this data set before: a new node, or one that lost everything
    QUARANTINED = "quarantined"   # lost its data; waiting out the repair delay
    REPAIRABLE = "repairable"     # lost its data, and the delay is over: repair it now
    UNKNOWN = "unknown"           # the node did not answer


@dataclass
class NodeModel:
    """One node's acceptor state, as the Lua scripts keep it (used as the specification and in the model test)."""

    ready: bool = True
    hwm: dict[str, int] = field(default_factory=dict)
    locks: dict[str, tuple[str, float]] = field(default_factory=dict)  # name -> (token, expires_at)

    def acquire(self, name: str, token: str, t: int, ttl: float, now: float) -> Answer:
        if not self.ready:
            return Answer(Reply.UNREADY)
        held = self.locks.get(name)
        if held is not None and held[1] <= now:
            del self.locks[name]
            held = None
        hwm = self.hwm.get(name, 0)
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
        """Restart without persistence: everything is gone, the marker too."""
        self.ready = False
        self.hwm.clear()
        self.locks.clear()
