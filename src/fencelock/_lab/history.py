"""The recorded history of one lab cell, and the checker that judges it (pure: no I/O, no clock).

The checker's rules are in docs/design/lab-report.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["acquire", "read", "write", "release", "lost", "fault", "expire"]
Verdict = Literal["SAFE", "UNSAFE", "FAULT-MISSED", "SKIPPED", "ERROR"]
Evidence = Literal["overlap", "fault"]

KINDS: tuple[str, ...] = ("acquire", "read", "write", "release", "lost", "fault", "expire")


@dataclass
class Event:
    """One recorded event. `t` is absolute (monotonic seconds) while recording, relative to the cell's start in
    the results. Writes also carry `sent` (when the worker sent it), `read` (the counter value it had read) and
    `before` (the resource's value when the write was decided); reads carry `before` (the value they read)."""

    t: float
    worker: str
    kind: Kind
    fence: int | None = None
    ok: bool | None = None
    lease_end: float | None = None
    detail: str = ""
    sent: float | None = None
    read: int | None = None
    before: int | None = None

    def to_json(self, origin: float) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("t", "lease_end", "sent"):
            if out[key] is not None:
                out[key] = round(out[key] - origin, 6)
        for key in ("sent", "read", "before"):
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any], origin: float = 0.0) -> Event:
        def at(key: str) -> float | None:
            value = raw.get(key)
            return None if value is None else float(value) + origin

        def num(key: str) -> int | None:
            value = raw.get(key)
            return None if value is None else int(value)

        kind = str(raw["kind"])
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        t = at("t")
        assert t is not None
        ok = raw.get("ok")
        return cls(t, str(raw["worker"]), kind, fence=num("fence"),  # type: ignore[arg-type]
                   ok=None if ok is None else bool(ok), lease_end=at("lease_end"), detail=str(raw.get("detail") or ""),
                   sent=at("sent"), read=num("read"), before=num("before"))


@dataclass
class Holding:
    worker: str
    start: float
    fence: int | None
    lease_end: float | None
    end: float = math.inf
    lost_at: float | None = None
    writes: list[Event] = field(default_factory=list)


@dataclass
class Counts:
    overlaps: int = 0
    stale_accepted: int = 0
    stale_rejected: int = 0
    lost_updates: int = 0
    writes: int = 0
    faults: int = 0
    fence_regressions: int = 0

    def add(self, other: Counts) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass
class Judgement:
    counts: Counts
    verdict: Verdict
    reasons: list[str]
    took_effect: bool


def holdings_of(events: Sequence[Event]) -> list[Holding]:
    """Every grant in `events`, with the end of its holder's belief and the writes it sent."""
    ordered = sorted(events, key=lambda e: e.t)
    held: list[Holding] = []
    current: dict[str, Holding] = {}
    released: dict[int, float] = {}
    for e in ordered:
        if e.kind == "acquire" and e.ok is not False:
            h = Holding(e.worker, e.t, e.fence, e.lease_end)
            held.append(h)
            current[e.worker] = h
        elif e.kind in ("release", "lost", "expire") and e.worker in current:
            h = current[e.worker]
            if e.kind in ("lost", "expire") and h.lost_at is None:
                h.lost_at = e.t
            if e.kind == "release":
                released[id(h)] = e.t
                del current[e.worker]
    for e in ordered:
        if e.kind == "write":
            h2 = _holding_for(held, e)
            if h2 is not None:
                h2.writes.append(e)
    for h in held:
        ends = [w.sent if w.sent is not None else w.t for w in h.writes]
        if id(h) in released:
            ends.append(released[id(h)])
        elif h.lost_at is not None:
            ends.append(h.lost_at)
        else:
            ends.append(h.lease_end if h.lease_end is not None else h.start)
        h.end = max(ends)
    return held


def _holding_for(held: Sequence[Holding], write: Event) -> Holding | None:
    """The holding a write came from: its worker's latest grant before the write was sent."""
    sent = write.sent if write.sent is not None else write.t
    best: Holding | None = None
    for h in held:
        if h.worker == write.worker and h.start <= sent and (best is None or h.start > best.start):
            best = h
    return best


def overlaps(held: Sequence[Holding]) -> list[tuple[Holding, Holding]]:
    pairs = []
    for i, a in enumerate(held):
        for b in held[i + 1:]:
            if a.worker != b.worker and a.start < b.end and b.start < a.end:
                pairs.append((a, b))
    return pairs


def judge(events: Iterable[Event], evidence: Evidence = "overlap") -> Judgement:
    """Count what happened in one run and decide its verdict (see the module docstring for the rules)."""
    events = list(events)
    held = holdings_of(events)
    counts = Counts(faults=sum(1 for e in events if e.kind == "fault"))
    reasons: list[str] = []
    pairs = overlaps(held)
    counts.overlaps = len(pairs)
    for a, b in pairs[:1]:
        reasons.append(f"{a.worker} (fence {a.fence}) and {b.worker} (fence {b.fence}) both held the lock")
    accesses = sorted((e for e in events if e.kind in ("read", "write")), key=lambda e: e.t)
    counts.writes = sum(1 for e in accesses if e.kind == "write")
    highest: int | None = None
    accepted = [e for e in accesses if e.ok]
    owners = [_holding_for(held, e) for e in accepted]
    flags = stale_flags([(None if h is None else h.start, e.kind == "write") for e, h in zip(accepted, owners,
                                                                                          strict=True)])
    newest: Holding | None = None  # the latest-granted holding the resource had served so far
    for w, h, stale in zip(accepted, owners, flags, strict=True):
        if stale:
            counts.stale_accepted += 1
            if counts.stale_accepted == 1:
                reasons.append(_stale_reason(w, h, newest))
        if h is not None and (newest is None or h.start > newest.start):
            newest = h
        if w.kind != "write":
            continue
        if w.read is not None and w.before is not None and w.read != w.before:
            counts.lost_updates += 1
            if counts.lost_updates == 1:
                reasons.append(f"{w.worker} wrote {w.read + 1} from a read of {w.read}, over {w.before}: "
                               f"{w.before - w.read} update(s) lost")
        if w.fence is not None:
            if highest is not None and w.fence < highest:
                counts.fence_regressions += 1
            highest = w.fence if highest is None else max(highest, w.fence)
    counts.stale_rejected = sum(1 for e in accesses if e.kind == "write" and not e.ok)
    if counts.stale_rejected:
        reasons.append(f"the guard rejected {counts.stale_rejected} stale write(s)")
    took_effect = bool(counts.overlaps or counts.stale_accepted or counts.stale_rejected or counts.lost_updates)
    if evidence == "fault":
        took_effect = took_effect or any(e.kind == "fault" and e.ok for e in events)
    verdict: Verdict
    if counts.stale_accepted or counts.lost_updates:
        verdict = "UNSAFE"
    elif not took_effect:
        verdict = "FAULT-MISSED"
        reasons.append("the fault did not take effect: no overlap, no refused write, no observed effect")
    else:
        verdict = "SAFE"
    return Judgement(counts, verdict, reasons, took_effect)


def stale_flags(accesses: Sequence[tuple[float | None, bool]]) -> list[bool]:
    """The staleness rule, in one place (the report draws with it too). `accesses` are the accesses the resource
    accepted, in the order it decided them, each as (the grant time of the holding it came from, or None if its
    worker held nothing; whether it is a write). A write is stale when it came from no holding, or when an access
    from a holding granted later was accepted before it."""
    newest = -math.inf
    flags: list[bool] = []
    for start, is_write in accesses:
        flags.append(is_write and (start is None or start < newest))
        if start is not None:
            newest = max(newest, start)
    return flags


def _stale_reason(w: Event, own: Holding | None, newest: Holding | None) -> str:
    if own is None or newest is None:
        return f"{w.worker} wrote without ever holding the lock, and the write was accepted"
    return (f"{w.worker}'s write with fence {w.fence} was accepted after the resource had served a newer holder, "
            f"{newest.worker} (fence {newest.fence})")


def combine(verdicts: Sequence[Verdict]) -> Verdict:
    """One verdict for a cell run several times: any UNSAFE wins, then any ERROR; SAFE needs every run to show the fault
    (a run that missed it counts for nothing, but all missing is FAULT-MISSED)."""
    v: Verdict
    for v in ("UNSAFE", "ERROR"):
        if v in verdicts:
            return v
    if "SAFE" in verdicts:
        return "SAFE"
    if "FAULT-MISSED" in verdicts:
        return "FAULT-MISSED"
    return "SKIPPED"
