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
