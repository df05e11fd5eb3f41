"""Whether a Redis server may evict a held lock, from the `eviction` script's answer. No I/O.

Every key fencelock writes has a TTL, so every `maxmemory-policy` but `noeviction` (the `volatile-*` ones as much
as `allkeys-*`) may delete a held lock under memory pressure; the next caller is then granted it while its holder
still counts on it. A server without `maxmemory` never evicts. See docs/design/redis.md, "Eviction".
"""

from __future__ import annotations

from typing import Any

SAFE_POLICY = "noeviction"


def eviction_risk(reply: Any) -> str | None:
    """Why the server that gave this `{maxmemory, policy}` answer may evict a held lock; None if it never will
    (or the answer is not one)."""
    try:
        limit, policy = int(reply[0]), reply[1]
    except (TypeError, ValueError, IndexError):
        return None
    policy = policy.decode() if isinstance(policy, bytes) else str(policy)
    if limit <= 0 or policy == SAFE_POLICY:
        return None
    return (f"it may evict held locks under memory pressure (maxmemory {limit} bytes, maxmemory-policy {policy}), "
            f"and an evicted lock is granted again while its holder still counts on it: set maxmemory-policy "
            f"{SAFE_POLICY}, or keep the locks on a server of their own")
