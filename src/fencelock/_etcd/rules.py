"""The etcd lock's rules, with no I/O: key names, the TTL mapping, and what an answer means.

One lock name is a queue of keys under one directory, as in etcd's `concurrency.Mutex`:

    <prefix>/<encoded name>/<lease id, 16 hex digits>     value = the acquisition's token, attached to its lease
    <prefix>/<encoded name>                               the fence of the last lease released (no lease: it stays)

The holder is the key with the lowest create revision, which is its fence. `<encoded name>` is the name with `%`
and `/` percent-encoded: one path segment. Why this layout: docs/design/etcd.md.
"""

from __future__ import annotations

import base64
import enum
import math
import re
from typing import Any, NamedTuple
from urllib.parse import unquote

from .._logic.outcomes import Released, gone
from .._logic.timing import overhangs

MAX_TXN_OPS = 128
"""etcd's default `--max-txn-ops`: the most operations one transaction may carry."""

BLOCK_CAP = 2.0
"""Seconds one watch may last before the waiter refreshes its lease and looks again. It bounds how late a waiter
notices a stopped server. (A cancelled asyncio waiter's watch ends with the cancellation: `unless_given_up`.)"""

SCAN_PAGE = 500
"""Keys per range request when listing locks (never one unbounded range)."""


# ---------------------------------------------------------------------------------------------------- keys

_ENCODE = str.maketrans({"%": "%25", "/": "%2F"})


def name_dir(prefix: str, name: str) -> bytes:
    """Where the keys of `name` live: `<prefix>/<encoded name>/`."""
    return f"{prefix}/{name.translate(_ENCODE)}/".encode()


def fence_key(prefix: str, name: str) -> bytes:
    """The key a release (in its own transaction) sets to the fence it released, so that an operator sees the last
    fence of a free lock. It lies outside the name's directory, so it never counts as a holder or a waiter."""
    return f"{prefix}/{name.translate(_ENCODE)}".encode()


def lock_key(prefix: str, name: str, lease_id: int) -> bytes:
    return name_dir(prefix, name) + f"{lease_id:016x}".encode()


def range_end(start: bytes) -> bytes:
    """The end of the range of every key that starts with `start` (etcd's prefix rule: last byte + 1)."""
    trimmed = start.rstrip(b"\xff")
    if not trimmed:
        return b"\x00"  # every key from `start` on
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


def name_of(prefix: str, key: bytes) -> str | None:
    """The lock name a key belongs to (None: not one of ours)."""
    head = f"{prefix}/".encode()
    if not key.startswith(head):
        return None
    encoded, sep, lease = key[len(head):].rpartition(b"/")
    if not sep or not encoded or not re.fullmatch(rb"[0-9a-f]{16}", lease):
        return None
    return unquote(encoded.decode("utf-8", "replace"))


# ---------------------------------------------------------------------------------------------------- TTL


def lease_seconds(ttl_ms: int) -> int:
    """The lease TTL to ask for: whole seconds, rounded up, so the server never ends it before our validity.

    The server may grant more (its minimum is 3/2 of the election timeout, rounded up: 2 s by default). The
    lease's validity (`remaining()`) still counts the TTL the caller asked for, from before the request: never
    more than the server grants. The key may outlive it by the rounding (under 1 s) or up to the minimum.
    """
    return max(1, math.ceil(ttl_ms / 1000))


def keepalive_suffices(granted_s: int, ttl_ms: int) -> bool:
    """Whether refreshing the current lease gives at least `ttl_ms` (a keep-alive restarts the lease's own TTL);
    if not, extending moves the key to a new, longer lease."""
    return granted_s >= lease_seconds(ttl_ms)


def lease_too_long(asked_s: int, ttl_ms: int) -> bool:
    """Whether a lease asked for `asked_s` would keep the key of a lease extended to `ttl_ms` so much longer that a
    holder that stops leaves it far past its TTL (`overhangs`): then `extend(ttl=)` moves the key to a new, shorter
    lease. (A lease the server raised to its minimum is what any new lease gets: `asked_s` is what we asked.)"""
    return overhangs(asked_s, lease_seconds(ttl_ms))


# ---------------------------------------------------------------------------------------------------- answers


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def number(value: Any) -> int:
    """The JSON gateway sends 64-bit numbers as strings and leaves out zeros."""
    return int(value) if value else 0


class Kv(NamedTuple):
    key: bytes
    create_revision: int
    lease: int
    value: bytes
    version: int = 0  # puts since the key was created (1 after its first)


def kvs(range_response: dict[str, Any]) -> list[Kv]:
    return [Kv(unb64(kv.get("key")), number(kv.get("create_revision")), number(kv.get("lease")),
               unb64(kv.get("value")), number(kv.get("version"))) for kv in range_response.get("kvs", ())]


GRANT_TRIES = 3
"""Grants one lease may take when the server answers "lease already exists" (see `granted`)."""


def granted(answer: dict[str, Any], asked: int) -> tuple[int, int] | None:
    """A lease grant's answer: the lease ID the server chose and the TTL it granted (never less than `asked`:
    the server may raise a TTL to its minimum, and a missing TTL means the one asked for); None if the answer
    names no lease.

    A grant always asks the server to choose the ID (ID 0). An ID the client picked could be a live lease of
    another client, and "lease already exists" cannot tell that lease from a retry of our own grant: a key put
    on it would live and die with the other client's lease. So an answer is the only way to learn a lease, and a
    grant whose answer was lost is never looked for again: it leaves an orphan lease that carries no key, that
    nothing counts or waits on, and that ends by its TTL. The server's own IDs never collide with a live lease,
    except with one another client granted with an ID it picked: then the answer is "lease already exists",
    which is not ours either, and the backend asks again (a new ID each time), at most `GRANT_TRIES` times.
    """
    lease = number(answer.get("ID"))
    if lease <= 0:
        return None
    return lease, max(asked, number(answer.get("TTL")))


class Verdict(enum.Enum):
    GRANTED = "granted"     # our key exists and is the oldest of the name: we hold the lock
    WAITING = "waiting"     # our key exists behind an older one
    GONE = "gone"           # our key is gone (its lease expired, or an operator removed it): our place is lost


def verdict(mine: Kv | None, token: bytes, owner: Kv | None) -> Verdict:
    """What a look at our own key and the name's oldest key means."""
    if mine is None or mine.value != token:
        return Verdict.GONE
    if owner is not None and owner.create_revision == mine.create_revision:
        return Verdict.GRANTED
    return Verdict.WAITING


class Settle(enum.Enum):
    """What a read of our key says of a move to another lease whose answer never came (`settle`)."""

    GONE = "gone"          # our key is gone, or not ours: both leases end, the acquisition is lost
    MOVED = "moved"        # on the new lease: adopt it, end the old one
    STAYED = "stayed"      # on the old lease, past the move's version: the move can never land; end the new lease
    UNDECIDED = "undecided"  # on the old lease at the move's version: it may yet land (put the key again first)


SETTLE_READS = 3
"""Reads of our key that settle a move: a second follows a put again that lost to the move, so a third means the
key changed under us again (then it is left unsettled, and the next extend reads again)."""


def settle(kv: Kv | None, token: bytes, fence: int, old: int, new: int, version: int) -> Settle:
    """A read of our key (`kv`) after a move from lease `old` to `new`, sent when the key was at `version`, whose
    answer never came. Every move compares the key's version (`txn.move`), so of the move and a put again on the
    old lease at that version, only the first to arrive applies: only a key on the old lease *past* that version
    says the move will never land. Revoking the new lease earlier would take our key with it if it then did."""
    if kv is None or kv.value != token or kv.create_revision != fence or kv.lease not in (old, new):
        return Settle.GONE
    if kv.lease == new:
        return Settle.MOVED
    return Settle.STAYED if kv.version > version else Settle.UNDECIDED


def released(deleted: bool, newer_keys: int, sent_before: bool = False) -> Released:
    """A compare-and-delete's answer: our key deleted; else gone, and maybe someone queued (or held) after us
    (`fencelock._logic.outcomes.gone`: after an earlier sending of this release whose answer never came, maybe by
    that one)."""
    if deleted:
        return Released.RELEASED
    return gone(sent_before, newer_keys > 0)


LEASE_REVOKE_FIXED = {(3, 4): 31, (3, 5): 13}
"""The first patch release of each etcd line that carries etcd-io/etcd#16822 (3.4: #17465, 3.5: #17425): an old
leader no longer revokes leases it expired by its own stale view (etcd-io/etcd#15247, #12528). 3.6.0 and later
carry it. Why it matters to a lock: docs/design/etcd.md, "Server versions"."""


def version_risk(version: str | None) -> str | None:
    """Why an etcd server of `version` (`GET /version`'s `etcdserver`) may end held locks early; None if it
    carries the fix, or its version cannot be read."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version or "")
    if match is None:
        return None
    major, minor, patch = (int(part) for part in match.groups())
    fixed = LEASE_REVOKE_FIXED.get((major, minor))
    if (major, minor) > (3, 5) or (fixed is not None and patch >= fixed):
        return None
    return (f"etcd {version} may revoke live leases when a leader that paused (a slow disk, a stalled VM) resumes "
            "(etcd-io/etcd#15247): a held lock can then be granted to another holder before its TTL ends. "
            "Upgrade to etcd 3.4.31, 3.5.13 or later; until then, pass the fence to a guard (StaleFence)")


def retry_after(failures: int, transient: bool, endpoints: int) -> float | None:
    """After `failures` failed acquire requests in a row: retry (at once, then after a short pause), as long as
    another member may answer; never more than once per endpoint, so a cluster that is down is reported soon.
    Only transient faults (the network, or a cluster between leaders) are retried."""
    if not transient or failures > max(1, endpoints):
        return None
    return 0.0 if failures == 1 else min(1.0, 0.25 * failures)
