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
    `run` is the server process (INFO run_id), which changes at every start; `inc_run` is the process the data
    set belongs to (the incarnation's `run`, its writer); `durable` says whether the server runs AOF with fsync
    always; `inc_durable` whether the writer did, as recorded in the incarnation (None: not asked yet);
    `replid2` the run of the master this process replicated before it was promoted (None: never a replica).
    """

    ready: bool = True
    hwm: dict[str, int] = field(default_factory=dict)
    locks: dict[str, tuple[str, float]] = field(default_factory=dict)  # name -> (token, expires_at)
    floor: int = 0
    nonce: str | None = None     # the incarnation (None: this data set was never looked at)
    born: float = 0.0
    born_us: int = 0             # ... the node's clock in µs at that first look
    until: float = 0.0
    fresh: bool = False
    legacy: bool = False         # a key an older fencelock left (fencelock:redlock:seen)
    claim: str | None = None     # the new deployment this data set was claimed for (see `deployment_id`)
    run: int = 0                 # the server process now running (not data: a restart changes it)
    inc_run: int | None = 0      # the process the data set belongs to (None: no incarnation)
    durable: bool = False        # the server keeps every acknowledged write across a restart (not data)
    inc_durable: bool | None = None  # ... and so did the data set's writer, as recorded (None: not asked yet)
    replid2: int | None = None   # promoted replica: the run of the master it replicated (not data)
    ttls: dict[float, float] = field(default_factory=dict)  # lease TTL -> when the last one granted here expires

    DATA = ("ready", "hwm", "locks", "floor", "nonce", "born", "born_us", "until", "fresh", "legacy", "claim",
            "inc_run", "inc_durable", "ttls")
    """The fields a snapshot holds: everything but the process (`run`, `replid2`) and its configuration
    (`durable`)."""

    @property
    def counts(self) -> bool:
        """It has its marker and belongs to the process running now: its answers count."""
        return self.ready and self.inc_run == self.run

    def acquire(self, name: str, token: str, t: int, ttl: float, now: float) -> Answer:
        if not self.counts:
            return Answer(Reply.UNREADY)
        held = self.locks.get(name)
        if held is not None and held[1] <= now:
            del self.locks[name]
            held = None
        hwm = max(self.hwm.get(name, 0), self.floor)
        if held is not None and held[0] != token:
            return Answer(Reply.HELD, hwm, held[1] - now, self.floor)
        # Free, or held by this same acquisition (an earlier round, or a retry): grant t above the hwm, and the
        # same t again only to the token that holds it.
        if t < hwm or (t == hwm and held is None):
            return Answer(Reply.STALE, hwm, floor=self.floor)
        self.locks[name] = (token, now + ttl)
        self.hwm[name] = t
        self.ttls = {d: at for d, at in self.ttls.items() if at > now}
        self.ttls[ttl] = max(self.ttls.get(ttl, 0.0), now + ttl)
        return Answer(Reply.GRANTED, t)

    def live_ttl(self, now: float) -> float:
        """The longest TTL of a lease granted here that may still be valid (what a repair's quarantine must
        outlast), 0 if none."""
        return max((ttl for ttl, at in self.ttls.items() if at > now), default=0.0)

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
        """Everything is gone, the marker and the incarnation too (a restart without persistence, with
        `restart()`; FLUSHALL without)."""
        self.ready = False
        self.hwm.clear()
        self.locks.clear()
        self.floor = 0
        self.nonce = None
        self.born = self.until = 0.0
        self.born_us = 0
        self.fresh = self.legacy = False
        self.claim = None
        self.inc_run = None
        self.inc_durable = None
        self.ttls = {}

    def restart(self) -> None:
        """The server process restarts (its data as its persistence kept it: see `lose_data` and `restore`)."""
        self.run += 1
        self.replid2 = None

    def promote(self) -> None:
        """A replica of this server's process, with the data set as replication left it (`restore` a snapshot
        first), is promoted in its place: another process, whose second replication id is the old one's."""
        old = self.run
        self.run += 1
        self.replid2 = old

    def snapshot(self) -> dict[str, object]:
        """The data set as a snapshot (an RDB file) holds it now."""
        return {key: dict(value) if isinstance(value, dict) else value
                for key, value in ((key, getattr(self, key)) for key in self.DATA)}

    def restore(self, snapshot: dict[str, object]) -> None:
        """The data set as it was in `snapshot`: what a restart from it loads (with `restart()`)."""
        for key, value in snapshot.items():
            setattr(self, key, dict(value) if isinstance(value, dict) else value)

    def gate(self, now: float, delay: float, window: float, nonce: str, peek: bool = False,
             durable: bool | None = False, us: int = 0) -> GateView:
        """`redlock_gate.lua`: the first look at a data set starts its fresh window and its quarantine; a data set
        of an earlier process is taken over if the server is `durable` (as this process said), else treated as one
        that lost data (`durable` None: not asked yet, so RESTARTED, nothing written). `us`: the node's clock in
        µs now; a fresh view's floor is the first look's, + 1 ms (`deployment_floor`).

        The take-over needs a durable writer too (`inc_durable`), and a process that is not a replica of the
        writer promoted in its place (`replid2`): replication is asynchronous. A look that writes asks the
        process's durability (RESTARTED, `durable` None) whenever the data set's writer's is not recorded."""
        if (self.ready or self.nonce is not None) and self.inc_run != self.run:
            if durable is None:
                return GateView(Gate.RESTARTED, self.nonce or "")
            if durable and self.inc_durable and self.replid2 != self.inc_run:
                if not peek:
                    self.inc_run, self.inc_durable = self.run, True
            else:
                if peek:
                    return GateView(Gate.QUARANTINED, "", None)
                self.ready, self.floor, self.claim = False, 0, None
                self.nonce, self.born, self.until, self.fresh, self.inc_run = nonce, now, now + delay, False, self.run
                self.born_us, self.inc_durable = us, bool(durable)
                return GateView(Gate.QUARANTINED, nonce, delay)
        elif not peek and self.inc_durable is None:
            if durable is None:
                return GateView(Gate.RESTARTED, self.nonce or "")
            if self.nonce is not None:
                self.inc_durable = bool(durable)
        if self.ready:
            return GateView(Gate.READY, self.nonce or "", 0.0, self.floor)
        if self.nonce is not None:
            seen, born, until, fresh = self.nonce, self.born, self.until, self.fresh
            if born + delay > until and not peek:
                until = self.until = born + delay
            if now < born:  # the node's clock was set back: the whole quarantine again from now, no longer
                until, born = now + (until - born), now
                if not peek:
                    self.born, self.until = born, until
        else:
            fresh = not self.legacy
            if peek:
                return GateView(Gate.FRESH if fresh else Gate.QUARANTINED, "", None)
            seen, born, until = nonce, now, now + delay
            self.nonce, self.born, self.until, self.fresh, self.inc_run = nonce, born, until, fresh, self.run
            self.born_us, self.inc_durable = us, bool(durable)
        if fresh and now < born + window:
            return GateView(Gate.FRESH, seen, max(until - now, 0.0), self.born_us + 1000)
        if now < until:
            return GateView(Gate.QUARANTINED, seen, until - now)
        return GateView(Gate.REPAIRABLE, seen)

    def mark(self, nonce: str, mode: str, floor: int, clock: bool, values: Mapping[str, int], now: float,
             clock_us: int, deployment: str = "") -> int:
        """`redlock_mark.lua`: 1 done, 0 already marked, -1 another (or not a new, or another process's) data
        set, -2 quarantined."""
        current = self.inc_run == self.run
        if mode == "claim":
            if self.nonce != nonce or not current:
                return -1
            if self.claim is not None:
                return 1 if self.claim == deployment else -1
            if self.ready or not self.fresh:
                return -1
            self.claim = deployment
            return 1
        if mode != "plain" and not current:
            return -1
        if self.ready and current:
            return 0
        if mode != "plain" and self.nonce != nonce:
            return -1
        if mode == "fresh":
            if self.claim != deployment:
                return -1
            self.floor, self.ready = floor, True
            return 1
        if mode == "repair" and now < self.until:
            return -2
        for key, value in values.items():
            if value > self.hwm.get(key, 0):
                self.hwm[key] = value
        if mode == "raise":
            return 1
        self.floor = max(floor, clock_us) if clock else floor
        if not current:  # (plain: another process's data set, now this one's; its durability not known)
            self.inc_run, self.inc_durable = self.run, None
        self.ready = True
        return 1

    def fences(self) -> tuple[int, dict[str, int]] | None:
        """What a repair reads from a ready node: its floor and hwm (None: it does not count)."""
        return (self.floor, dict(self.hwm)) if self.counts else None
