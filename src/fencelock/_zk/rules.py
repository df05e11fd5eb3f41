"""ZooKeeper's lock rules, with no I/O: where a lock's nodes live, queue order, sessions for TTLs, states.

    <chroot>/<prefix>/<encoded name>              one persistent node per lock name (the queue)
    <chroot>/<prefix>/<encoded name>/<token>-<seq>  one ephemeral sequential node per acquisition

The holder is the child with the lowest sequence number, and its `czxid` is the fence (docs/design/zookeeper.md).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from urllib.parse import quote, unquote

from .._logic.timing import overhangs

SEQUENCE_DIGITS = 10
"""ZooKeeper appends a sequence number of ten digits to a sequential node's name."""


# -- paths --------------------------------------------------------------------------------------------------

def encode_name(name: str) -> str:
    """One path component for any lock name: percent-encoded, with `.` encoded too (`.` and `..` are not
    allowed as components), so the mapping is one-to-one and `decode_name` undoes it."""
    return quote(name, safe="").replace(".", "%2E")


def decode_name(component: str) -> str:
    return unquote(component)


def root_path(chroot: str, prefix: str) -> str:
    return f"{chroot}/{prefix}"


def lock_path(root: str, name: str) -> str:
    return f"{root}/{encode_name(name)}"


def node_prefix(token: str) -> str:
    """The name an acquisition's node is created with; ZooKeeper appends the sequence number."""
    return f"{token}-"


@dataclass(frozen=True, order=True)
class Child:
    """One node in a lock's queue, ordered by its sequence number."""

    sequence: int
    token: str


def parse_child(child: str) -> Child | None:
    """`<token>-<10 digits>` -> Child; anything else (not ours) -> None, and is ignored."""
    token, sep, digits = child.rpartition("-")
    if not sep or not token or len(digits) != SEQUENCE_DIGITS or not digits.isdigit():
        return None
    return Child(int(digits), token)


def child_name(child: Child) -> str:
    return f"{child.token}-{child.sequence:0{SEQUENCE_DIGITS}d}"


def queue(children: list[str]) -> list[Child]:
    """The lock's queue, holder first: children sorted by sequence number (not by name: tokens differ)."""
    return sorted(c for c in map(parse_child, children) if c is not None)


def find_own(children: list[str], token: str) -> Child | None:
    for child in queue(children):
        if child.token == token:
            return child
    return None


class Position(enum.Enum):
    HOLDER = "holder"
    WAITING = "waiting"
    GONE = "gone"       # our node is not in the queue (the session expired, or someone deleted it)


def position(children: list[str], token: str) -> tuple[Position, Child | None]:
    """Where `token` stands: the holder, or waiting (with the one node it must watch), or gone."""
    line = queue(children)
    for i, child in enumerate(line):
        if child.token == token:
            return (Position.HOLDER, None) if i == 0 else (Position.WAITING, line[i - 1])
    return Position.GONE, None


# -- sessions -----------------------------------------------------------------------------------------------

SESSION_STEPS_PER_DOUBLING = 4
"""Session timeouts come in steps of 2^(1/4) (about 19 %): a TTL gets the first step at or above it, so a few
sessions serve every TTL, and a crashed holder blocks the lock for at most about 1.19 x its TTL."""


def session_timeout_ms(ttl_ms: int, server_min_ms: int | None = None) -> int:
    """The session timeout to ask for, for leases of `ttl_ms`: the first step >= the TTL, in whole ms.

    A server raises any timeout below its `minSessionTimeout` to it; once that is known (`server_min_ms`),
    every TTL at or below it shares the one session of that timeout.
    """
    if ttl_ms <= 0:
        raise ValueError(f"ttl_ms must be positive, got {ttl_ms}")
    if server_min_ms is not None and ttl_ms <= server_min_ms:
        return server_min_ms
    def step(exponent: int) -> int:
        return math.ceil(2 ** (exponent / SESSION_STEPS_PER_DOUBLING))

    exponent = math.ceil(math.log2(ttl_ms) * SESSION_STEPS_PER_DOUBLING)
    while exponent > 0 and step(exponent - 1) >= ttl_ms:  # the smallest step at or above the TTL, in whole ms
        exponent -= 1
    while step(exponent) < ttl_ms:
        exponent += 1
    return step(exponent)


def ttl_fits(ttl_ms: int, negotiated_ms: int) -> bool:
    """A lease may claim its TTL only if the server keeps its session at least that long without hearing from
    it; otherwise a cut-off holder's node could vanish while `remaining()` still shows validity. An extend to a
    TTL its node's session does not fit moves the node to a session that does (docs/decisions/
    2026-12-04-zookeeper-extend.md)."""
    return negotiated_ms >= ttl_ms


def session_too_long(ttl_ms: int, negotiated_ms: int, server_min_ms: int | None) -> bool:
    """Whether a session of `negotiated_ms` is so much longer than the one a new lease of `ttl_ms` would get that a
    holder that dies leaves its node far past its TTL (`overhangs`): then `extend(ttl=)` moves the node down."""
    return overhangs(negotiated_ms, session_timeout_ms(ttl_ms, server_min_ms))


def handshake_limit(timeout: float, hosts: int) -> float:
    """Seconds one member may take to accept a connection and answer its handshake before the next member is
    tried: an equal share of the URL's `timeout`, so that a first connection reaches a member that answers within
    its share, in time, even when every member tried before it hung."""
    return timeout / max(1, hosts)


RETRY_FIRST = 0.05
RETRY_MOST = 1.0
"""Seconds between the tries of an acquire after a transient fault: 50 ms, doubling, at most 1 s."""


def retry_after(failures: int, transient: bool) -> float | None:
    """After `failures` failed acquire attempts in a row: try a transient fault (`may_return`) again after a short
    back-off; None: not worth a retry. The caller's `wait` deadline bounds the tries too
    (`fencelock._logic.acquiring`)."""
    if not transient:
        return None
    return min(RETRY_MOST, RETRY_FIRST * 2.0 ** min(failures - 1, 8))


def may_return(connected: bool, down_since: float | None, now: float, timeout_ms: int) -> bool:
    """Whether a session whose request failed for want of a connection may serve again soon: it is connected
    again, or has been without a connection (since `down_since`) for less than its timeout. The server keeps a
    session that long, so a member that froze or restarted, a dropped connection, or an expiry kazoo replaces at
    once with a new session, is ridden out; a fault that lasts longer (a majority down, a partition) is an
    outage, reported as a `BackendError`."""
    if connected:
        return True
    return down_since is not None and now - down_since < timeout_ms / 1000.0


def reconnect_wait(timeout: float, down_since: float | None, now: float, timeout_ms: int, *,
                   silent: bool = False) -> float:
    """Seconds an acquire attempt whose session has no connection waits for it before it reports the fault: as
    long as one request may take (the URL's `timeout`: a momentary drop is ridden out within one attempt, even
    with `wait=0`), and never past the session's own timeout since the connection dropped (`may_return`): a fault
    that lasts longer is an outage. Not at all if fencelock itself dropped the connection because its member was
    `silent` (a request got no answer within `timeout`): that fault already cost one timeout. The acquire's
    `wait` bounds its further attempts (`retry_after`)."""
    if silent:
        return 0.0
    if down_since is None:
        return timeout
    return max(0.0, min(timeout, down_since + timeout_ms / 1000.0 - now))


def reconnect_every(timeout: float) -> float:
    """The longest pause, seconds, between kazoo's tries to connect a session again: half the URL's `timeout` (at
    most 1 s), so that a session whose server came back is connected again within about one request's time."""
    return min(1.0, timeout / 2)


class Session(enum.Enum):
    CONNECTED = "connected"
    SUSPENDED = "suspended"   # the connection dropped; the session (and its nodes) may or may not live
    LOST = "lost"             # the session expired or was closed: every node it created is gone


def renewal_answer(state: Session, node_exists: bool | None) -> bool | None:
    """What a renewal reports to the watchdog: True still ours, False lost, None unknown (try again).

    SUSPENDED is unknown, not lost: the server keeps the session for its whole timeout (>= the TTL) after it
    last heard from us, so the lease's validity, counted from before our last confirmed request, is still
    true; the watchdog reports the loss when that validity runs out, unless the session comes back first.
    LOST is lost at once.
    """
    if state is Session.LOST:
        return False
    if node_exists is None:
        return None
    return node_exists


# -- what the nodes carry, for operators ------------------------------------------------------------------------

def encode_number(value: int) -> bytes:
    """A lease node carries its TTL in ms; a lock's node carries the fence of its last holder to go."""
    return str(value).encode()


def decode_number(data: bytes | None) -> int | None:
    """The number a node carries, or None (empty, or not written by fencelock)."""
    try:
        return int(data or b"")
    except ValueError:
        return None


def encode_lease(ttl_ms: int, fence: int | None = None) -> bytes:
    """What a lease node carries: its TTL in ms, and, once the node was re-created by a move (its czxid is no
    longer the fence it was granted), that fence after a space."""
    return encode_number(ttl_ms) if fence is None else f"{ttl_ms} {fence}".encode()


def decode_lease(data: bytes | None) -> tuple[int | None, int | None]:
    """A lease node's (TTL in ms, fence it carries): each None when absent or not written by fencelock."""
    ttl, _, fence = (data or b"").partition(b" ")
    return decode_number(ttl), decode_number(fence) if fence else None


def lease_remaining(ttl_ms: int | None, mtime_ms: int, now_ms: float) -> float | None:
    """Seconds until a holder's TTL runs out, from its node's last write (granted or extended: `mtime`, the
    server's wall clock) and the reader's wall clock. None if the node carries no TTL."""
    if ttl_ms is None:
        return None
    return max(0.0, (mtime_ms + ttl_ms - now_ms) / 1000.0)
