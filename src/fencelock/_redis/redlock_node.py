"""`NodeModel`: one Redlock node (the acceptor) as plain Python.

It is the specification the Lua scripts implement (`_scripts/redlock_acquire.lua`, `redlock_gate.lua`,
`redlock_mark.lua`), and the model the Hypothesis state machine in `tests/logic/test_redlock_model.py` runs
against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .redlock_acquire import Answer, Reply
from .redlock_heal import Gate, GateView


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
