"""What a server's answer means for a lease: the small state machine every backend shares."""

from __future__ import annotations

import enum
from typing import NamedTuple


class Attempt(NamedTuple):
    """One acquire attempt, as a backend reports it."""

    granted: bool
    fence: int                  # the fence when granted, else 0
    holder_ttl: float | None    # when refused: seconds until the holder's key expires by itself (None: unknown)
    valid_from: float | None = None
    """When granted, where the backend knows it: the instant (on the client's clock) the request that last started
    the lease's TTL on the server went out: etcd's lease grant or refresh, Redlock's granted round. Later than the
    attempt's start when the request first waited in the client (its turn, a wake-up, earlier rounds); None: the
    validity counts from the attempt's start."""


class Released(enum.Enum):
    """The server's answer to a compare-and-delete."""

    RELEASED = "released"       # the key held our token and is gone
    EXPIRED = "expired"         # the key is gone, and nobody was granted the lock after us
    TAKEN = "taken"             # another holder has the lock, or had it after us
    UNSURE = "unsure"           # the key is gone or another's, and a sending of this release whose reply was lost
    #                             may have deleted it (the release went again after its connection closed under
    #                             it): a waiter may have taken the lock since


class State(enum.Enum):
    HELD = "held"
    RELEASED = "released"
    LOST = "lost"


def after_release(answer: Released, uncertain_at: float | None, valid_until: float) -> State:
    """The lease's state after the server answered a release.

    `uncertain_at` is when an earlier sending of this release left but its reply never came (a network error or a
    cancellation), else None. Then any answer but RELEASED (the key gone, or another token there) is most likely
    that earlier sending's doing: it deleted our key and a waiter took the lock. If it left while the lease was
    still valid, the key was ours when it could land, so the lease is released (had it never landed, the key
    stayed ours until its validity ended, and whoever took it after claimed nothing before). Otherwise it was lost.
    (decisions 2026-12-02-release-sent-again, 2026-12-05-release-retried-with-a-waiter)
    """
    if answer is Released.RELEASED:
        return State.RELEASED
    if uncertain_at is not None and uncertain_at < valid_until:
        return State.RELEASED
    return State.LOST


def gone(sent_before: bool, others_queued: bool) -> Released:
    """What a release that found our key gone (deleted, expired or taken) means, where waiters queue (etcd,
    ZooKeeper): anyone queued then holds the lock, or will at once, so "someone newer" cannot tell our own
    earlier release from a loss. `sent_before`: a release of this lease went out before and its answer never came
    (a lost reply, a cancellation): then it may have been ours, and the lease judges it (UNSURE, decision
    2026-12-02-release-sent-again); else TAKEN if anyone queues, EXPIRED if nobody does."""
    if sent_before:
        return Released.UNSURE
    return Released.TAKEN if others_queued else Released.EXPIRED
