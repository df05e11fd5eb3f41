"""Redlock's rounds of one client under a burst: how many run at once, and who goes next, without I/O.

A round (an acquire's, a release's, an extend's) starts only when it has a turn: at most `ROUNDS_AT_ONCE` of one
client's rounds run at once, and the others wait for theirs *before* their clock starts, in the order of
`fencelock._logic.admission` (the queue etcd's requests use too). A lease's validity counts from the start of the
round that granted it, so time spent waiting here is not taken from it. Why: docs/decisions/2026-12-05-redlock-burst.md.
"""

from __future__ import annotations

ROUNDS_AT_ONCE = 32
"""A client's acquire rounds under way at once: half of a node's capped connections (`MAX_OPEN`, 64), so that each
round finds a connection to every node at once, and releases, extends and give-backs (which go first
there) still find one free; a watchdog's renewals go through the client's pool, not these."""

TURN_LIMIT = 30.0
"""Seconds a round may wait for its turn (measured: about 2,000 acquires a second through one asyncio client on
three local nodes, so tens of thousands at once pass). Past it the request fails with a `BackendError` that says
the client is overloaded and that nothing was sent: a burst the client cannot carry fails in bounded time, never
queues for ever."""


def turn_error(what: str, waited: float, waiting: int, limit: int = ROUNDS_AT_ONCE) -> str:
    """The message of a request (`what`: "acquire", "release", "extend") whose round got no turn within `waited`
    seconds, `waiting` rounds still queued."""
    return (f"this Redlock client is overloaded: the {what}'s round waited {waited:.1f} s for a turn ({limit} "
            f"rounds run at once, {waiting} more were waiting); nothing was sent. Fewer concurrent acquires "
            f"through one client, or more clients, carry the load")
