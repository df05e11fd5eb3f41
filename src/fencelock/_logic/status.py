"""What an operator sees of one lock: the answer of `Locks.status()`, `Locks.list()` and `Locks.force_release()`.

Every backend fills the same record, so the `fencelock` command shows every lock service the same way.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LockStatus:
    """One lock as the server sees it now, read behind every holder's back. No token is ever part of it."""

    name: str
    held: bool
    fence: int | None = None        # the holder's fence; when free, the last fence granted (None: never locked)
    remaining: float | None = None  # seconds until the holder's lease expires by itself on the server
    queued: int | None = None       # waiters queued (fair mode, etcd, ZooKeeper); None where the service has no queue

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "held": self.held, "fence": self.fence, "remaining": self.remaining,
                "queued": self.queued}


@dataclass(frozen=True)
class NodeView:
    """One server's answer to `status.lua` / `force_release.lua`, decoded (no token: only its digest)."""

    pttl: int        # ms left on the holder's key; -2 free; -1 a key without a TTL; -3 (Redlock) not ready
    fence: int       # the counter (Redlock: the node's hwm); -1 never locked here
    queued: int
    holder: str      # SHA-1 of the holder's token, '' when free

    @classmethod
    def decode(cls, reply: object) -> NodeView:
        if not isinstance(reply, (list, tuple)) or len(reply) < 4:
            raise ValueError(f"unexpected status reply {reply!r}")
        holder = reply[3]
        return cls(int(reply[0]), int(reply[1]), int(reply[2]),
                   holder.decode() if isinstance(holder, bytes) else str(holder))

    @property
    def held(self) -> bool:
        return self.pttl not in (-2, UNREADY)

    @property
    def unready(self) -> bool:
        """A Redlock node that does not count (it lost its data, or restarted): neither free nor held."""
        return self.pttl == UNREADY


UNREADY = -3
"""`NodeView.pttl` of a Redlock node that does not count (see `NodeView.unready`)."""


def single_status(name: str, view: NodeView, *, has_queue: bool = True) -> LockStatus:
    """The lock on one server (single Redis, a Cluster shard). While it is held, the counter is the holder's
    fence: the holder's grant was the counter's last increment."""
    return LockStatus(name=name, held=view.held, fence=None if view.fence < 0 else view.fence,
                      remaining=view.pttl / 1000.0 if view.pttl >= 0 else None,
                      queued=view.queued if has_queue else None)


def majority_status(name: str, views: list[NodeView | None], n: int) -> LockStatus | None:
    """The lock as a majority of Redlock's `n` nodes see it (`views`: None for a node that did not answer).

    Held when a quorum holds one grant (the same token). Its fence is that grant's proposal, which each of
    those nodes stored as its hwm when it granted (a repair may only have raised one: the lowest is the grant's).
    Its remaining time is how long a quorum still holds it: the quorum-th longest of their TTLs. Free only when no
    holder, seen or not, could have a quorum even with every silent node on its side (a quorum that answered
    free is one such case): the highest hwm any node has, an upper bound on the last fence granted. None
    otherwise: a node that did not answer could complete a holder's quorum. A node that is not ready (it lost
    its data, or restarted) counts as one that did not answer: its "free" may be a holder's lost key.
    """
    q = n // 2 + 1
    answered = [view for view in views if view is not None and not view.unready]
    by_holder: dict[str, list[NodeView]] = {}
    for view in answered:
        if view.held:
            by_holder.setdefault(view.holder, []).append(view)
    for holding in by_holder.values():
        if len(holding) >= q:
            ttls = sorted((view.pttl for view in holding), reverse=True)
            quorum_ttl = ttls[q - 1]
            return LockStatus(name=name, held=True, fence=min(view.fence for view in holding),
                              remaining=quorum_ttl / 1000.0 if quorum_ttl >= 0 else None, queued=None)
    silent = len(views) - len(answered)
    if silent + max((len(holding) for holding in by_holder.values()), default=0) >= q:
        return None
    fences = [view.fence for view in answered if view.fence >= 0]
    return LockStatus(name=name, held=False, fence=max(fences) if fences else None, remaining=None, queued=None)


def split_views(shown: list[str], views: list[NodeView | None]) -> str:
    """What each node answered, for the error when no majority agrees: "a: free; b: held (holder 1); c: no
    answer" (holders numbered in the order met, never shown: the digest stays private)."""
    holders: dict[str, int] = {}
    parts = []
    for where, view in zip(shown, views, strict=True):
        if view is None:
            parts.append(f"{where}: no answer")
        elif view.unready:
            parts.append(f"{where}: not ready (it lost its data or restarted: cannot tell)")
        elif not view.held:
            parts.append(f"{where}: free")
        else:
            number = holders.setdefault(view.holder, len(holders) + 1)
            parts.append(f"{where}: held (holder {number})")
    return "; ".join(parts)
