"""Redlock over N independent Redis masters, with fencing tokens: the acquire, release and extend rules, without I/O.

The fencing rule borrows the Paxos acceptor. Each node keeps, per name, a high-water mark `hwm` (no TTL). A node
grants a proposal `t` only if the lock key is absent AND `t > hwm`; then it sets the key and `hwm = t`. A client
proposes `t = 1 + the highest hwm it knows`, and a grant is a quorum of nodes that accepted the same `t`; the
lease's fence is `t`.

Why fences then increase: any two quorums share a node, and one node runs one script at a time, so whichever
grant that node saw second needed a larger `t`. A holder that paused past its TTL therefore always holds a smaller
fence than the holder after it. Clocks (TTL expiry, client drift, a server's clock jumping) decide *when* a grant
is possible, never *which* fence it gets.

That holds while no node's `hwm` goes backwards: how a node that lost its data is brought back is in
`redlock_heal`, and the node's side (the acceptor), as plain Python, in `redlock_node`. `redlock` re-exports all three.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    MasterDownError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)

from .._logic.outcomes import Released
from .._logic.timing import backoff
from .request import Resent

DEFAULT_REPAIR_DELAY = 60.0
"""Seconds a node that lost its data stays out before it is repaired: must exceed the longest TTL in use."""


def check_ttl_within(ttl_ms: int, repair_delay_ms: int, name: str) -> None:
    """A lease's TTL must not exceed the repair delay: a node that lost the lease's key would count again (its
    quarantine over) while the lease is still valid. `ValueError` naming both, before anything is sent."""
    if ttl_ms > repair_delay_ms:
        raise ValueError(f"ttl {ttl_ms / 1000:g} s is longer than this Redlock client's repair_delay of "
                         f"{repair_delay_ms / 1000:g} s: a node that lost its data would count again while the "
                         f"lease is valid; use a ttl of at most {repair_delay_ms / 1000:g} s, or connect with "
                         f"repair_delay >= {ttl_ms / 1000:g} (lock {name!r})")

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
UNCOUNTED = -3
"""An extend's answer from a node that does not count (not marked, or its data set is an earlier server process's
and the gate has not judged it): neither yes nor no, as no answer."""
UNSURE = 2
"""A node's release whose second sending found the key gone or another's: its first sending may have deleted it."""


def node_code(reply: Any) -> int:
    """A node's release or extend reply as 1, 0, -1, NO_ANSWER or UNSURE."""
    if reply is None or isinstance(reply, Exception):
        return NO_ANSWER
    code = int(reply)
    if code == UNCOUNTED:
        return NO_ANSWER
    return UNSURE if code != 1 and isinstance(reply, Resent) else code


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


def batch_outcomes(replies: Mapping[int, Sequence[int] | None], count: int, n: int) -> list[bool | None]:
    """A renewal batch's result per lease, from the nodes' replies so far (node -> a code per lease; None: that
    node failed): `extend_outcome` of each lease, a node yet to answer counting as no answer."""
    rows = [replies.get(j) for j in range(n)]
    return [extend_outcome([NO_ANSWER if row is None else row[i] for row in rows], n) for i in range(count)]


def batch_settled(replies: Mapping[int, Sequence[int] | None], count: int, n: int) -> bool:
    """A renewal batch is decided once every lease's outcome is known, whatever the nodes yet to answer say: a
    stalled minority never holds the batch (and the releases waiting for it) until the node timeout."""
    if len(replies) == n:
        return True
    rows = [row for row in replies.values() if row is not None]
    q, missing = quorum(n), n - len(replies)
    for i in range(count):
        extended = sum(1 for row in rows if row[i] == 1)
        if q > extended >= q - missing:
            return False  # the nodes yet to answer could still make (or fail to make) this lease's quorum
    return True


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
    floor: int = 0                # refused: the node's floor (every hwm there is at least this)
    slow: bool = False            # FAILED: no answer within the node timeout (not an error)
    error: str = ""               # FAILED: the server's own error (OOM, WRONGTYPE, NOPERM...; `server_error`)
    run: str = ""                 # the server process that answered (INFO run_id)


def decode(raw: Sequence[Any]) -> Answer:
    """A node's script reply: {1, t, 0, 0, run} granted, {0, hwm, pttl_ms, floor, run} refused, {-1, 0, 0, 0, run}
    unready (the floor and the run may be left out)."""
    code = int(raw[0])
    run = raw[4].decode() if len(raw) > 4 and isinstance(raw[4], bytes) else str(raw[4]) if len(raw) > 4 else ""
    if code == 1:
        return Answer(Reply.GRANTED, int(raw[1]), run=run)
    if code == -1:
        return Answer(Reply.UNREADY, run=run)
    pttl = int(raw[2])
    floor = int(raw[3]) if len(raw) > 3 else 0
    if pttl >= 0:
        return Answer(Reply.HELD, int(raw[1]), pttl / 1000.0, floor, run=run)
    return Answer(Reply.STALE, int(raw[1]), floor=floor, run=run)


_FAILED = Answer(Reply.FAILED)
_SLOW = Answer(Reply.FAILED, slow=True)


NOT_READY = ("LOADING", "MASTERDOWN", "NOREADY", "BUSY", "TRYAGAIN", "CLUSTERDOWN")
"""Error codes of a server that is up but not ready for a while: like a node that does not answer."""


def server_error(reply: Any) -> str | None:
    """The error a server answered with, when it refuses the request itself (OOM, WRONGTYPE, NOPERM, an AUTH or
    ACL problem...): a fault to report as such, not a node that is down. None for anything else: no answer, a
    network fault, a replica (READONLY: `not_independent`), a server not ready yet (`NOT_READY`)."""
    if isinstance(reply, (BusyLoadingError, MasterDownError, TryAgainError, ClusterDownError, ReadOnlyError)):
        return None
    if not isinstance(reply, (ResponseError, AuthenticationError)):
        return None
    text = str(reply) or type(reply).__name__
    if text.split(" ", 1)[0] in NOT_READY:
        return None
    # (redis-py strips the code of the errors it has a class for: put it back, the operator searches for it)
    for kind, code in ((OutOfMemoryError, "OOM"), (NoPermissionError, "NOPERM")):
        if isinstance(reply, kind) and not text.startswith(code):
            return f"{code} {text}"
    return text


def node_answer(reply: Any) -> Answer:
    """A node's acquire reply as an Answer: no reply in time (slow), or an error, is a failure; a server's own
    error keeps its text (`server_error`)."""
    if reply is None:
        return _SLOW
    if isinstance(reply, Exception):
        error = server_error(reply)
        return _FAILED if error is None else Answer(Reply.FAILED, error=error)
    return decode(reply)


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


def floor_seen(known: int, answers: Iterable[Answer | None]) -> int:
    """The highest node floor the client knows of: a name never locked anywhere starts above it."""
    return max([known, *(a.floor for a in answers if a is not None)])


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


def holder_ttl(answers: Sequence[Answer | None], n: int,
               ready_in: Sequence[float | None] | None = None) -> float | None:
    """When a quorum could be free again: the quorum-th soonest of each node's time until it could grant.

    A free or silent node could now (0), a holder's key when it expires, a node that is not ready when its
    quarantine ends (`ready_in`, from a look at the gates; None: not known, so not counted). None: no quorum
    can be free by any time known here.
    """
    times = [0.0] * (n - len(answers))
    for i, a in enumerate(answers):
        if a is not None and a.reply is Reply.UNREADY:
            left = None if ready_in is None else ready_in[i]
            if left is not None:
                times.append(max(left, 0.0))
        else:
            times.append(0.0 if a is None or a.pttl is None else a.pttl)
    times.sort()
    q = quorum(n)
    return times[q - 1] if len(times) >= q else None


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
              released: int = 0, timeout: float = 0.0, ready_in: Sequence[float | None] | None = None) -> Step:
    """After round `rounds` (from 1) proposed `t`: grant, refuse, propose again, or give up as unavailable.

    `healed`: the heal this round called for brought some node back; `released`: the fence of the release that
    woke this waiter (see `worth_another_round`); `timeout`: the per-node timeout, for the error; `ready_in`: each
    node's seconds until its quarantine ends, from the heal's look (see `holder_ttl`)."""
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
        return Step(Next.REFUSE, retry_in=holder_ttl(answers, n, ready_in))
    if rounds >= MAX_ROUNDS:
        return Step(Next.REFUSE)
    return Step(Next.PROPOSE, next_proposal(t, answers))



QUARANTINE_POLL = 1.0
"""Seconds: the longest pause between two attempts of a waiter while nodes are out (quarantined or down)."""


def unavailable_pause(failures: int, retry_in: float | None, rng: random.Random) -> float:
    """The pause after `failures` QuorumUnavailable in a row: the first retry comes soon (a jittered back-off of at
    most 10 ms: the attempt may just have marked a new deployment); later ones wait for the quarantine's end
    (`retry_in`, when known) but at most `QUARANTINE_POLL`, with jitter, instead of asking every node again and
    again meanwhile."""
    pause = backoff(failures - 1, rng, base=0.01, cap=0.25)
    if failures > 1 and retry_in is not None:
        pause = max(pause, min(retry_in, QUARANTINE_POLL) * rng.uniform(1.0, 1.1))
    return pause
