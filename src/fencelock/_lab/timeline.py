"""One cell's events as a timeline: lanes, leases, writes classified by the lab checker's rule, faults, overlaps.

Pure (no I/O); the rules by which events become leases and writes are in docs/design/lab-report.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .history import stale_flags

__all__ = ["Lease", "Mark", "Timeline", "Write", "busy_window", "timeline"]


@dataclass
class Lease:
    """One lease as its worker saw it: held from `start` to `end`, valid until `valid_until`."""

    worker: str
    fence: int | None
    start: float
    lease_end: float | None           # the last lease end the worker was given (moves on extension)
    expired_at: float | None = None   # an `expire` event for this lease
    end: float | None = None          # release, loss, or (open) the worker's last sign of life
    ending: str = "open"              # "released", "release refused", "lost" or "open"
    extensions: int = 0

    @property
    def valid_until(self) -> float | None:
        ends = [t for t in (self.lease_end, self.expired_at) if t is not None]
        return min(ends) if ends else None

    @property
    def held_until(self) -> float:
        return self.start if self.end is None else self.end

    @property
    def past_end(self) -> bool:
        """The holder still believed it held the lock after the lease had ended."""
        valid = self.valid_until
        return valid is not None and self.held_until > valid

    def valid_at(self, t: float) -> bool:
        valid = self.valid_until
        return self.start <= t and (valid is None or t < valid)


@dataclass(frozen=True)
class Write:
    t: float
    worker: str
    fence: int | None
    outcome: str                      # "accepted", "stale", "rejected" or "unanswered"
    detail: str


@dataclass(frozen=True)
class Mark:
    """Anything else on a lane or across the picture: a fault, a refused acquire, a loss, an expiry."""

    t: float
    worker: str
    kind: str                         # "fault", "refused", "lost", "expire", "stray release"
    detail: str
    label: str = ""                   # faults: F1, F2, ...


@dataclass
class Timeline:
    lanes: list[str] = field(default_factory=list)
    leases: list[Lease] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    overlaps: list[tuple[float, float]] = field(default_factory=list)
    t_max: float = 0.0

    @property
    def faults(self) -> list[Mark]:
        return [m for m in self.marks if m.kind == "fault"]

    def outcomes(self) -> dict[str, int]:
        counted = dict.fromkeys(("accepted", "stale", "rejected", "unanswered"), 0)
        for w in self.writes:
            counted[w.outcome] += 1
        return counted


def timeline(events: Iterable[Mapping[str, Any]]) -> Timeline:
    """One cell's events as lanes, leases, classified writes, marks and overlaps (docs/design/lab-report.md)."""
    ordered = sorted(events, key=lambda e: float(e["t"]))       # stable: equal times keep their recorded order
    tl = Timeline()
    holding: dict[str, Lease] = {}
    accesses: list[tuple[float, float, str, int | None, bool | None, str, bool]] = []  # ..., is it a write
    faults = 0
    for e in ordered:
        t, worker, kind = float(e["t"]), str(e["worker"]), str(e["kind"])
        fence, ok, detail = e.get("fence"), e.get("ok"), str(e.get("detail", ""))
        lease_end = None if e.get("lease_end") is None else float(e["lease_end"])
        tl.t_max = max(tl.t_max, t)
        if kind != "fault" and worker not in tl.lanes:
            tl.lanes.append(worker)
        current = holding.get(worker)
        if current is not None:
            current.end = max(current.held_until, t)             # the worker's latest sign of life
        if kind == "fault":
            faults += 1
            tl.marks.append(Mark(t, worker, "fault", detail, f"F{faults}"))
        elif kind == "acquire" and ok is not False:
            if current is not None and (fence == current.fence):
                current.extensions += 1
                # An extension counts only while the lease is valid: a "successful" one after the lease had
                # ended (a naive PEXPIRE) extended somebody else's key, not this lease.
                if lease_end is not None and current.valid_at(t):
                    current.lease_end = lease_end
                continue
            if current is not None:
                current.end, current.ending = t, "open"
            lease = Lease(worker, fence, t, lease_end, end=t)
            tl.leases.append(lease)
            holding[worker] = lease
        elif kind == "acquire":
            tl.marks.append(Mark(t, worker, "refused", detail))
        elif kind in ("release", "lost"):
            if current is None:
                tl.marks.append(Mark(t, worker, "lost" if kind == "lost" else "stray release", detail))
                continue
            current.end = t
            current.ending = "lost" if kind == "lost" else ("released" if ok is not False else "release refused")
            if kind == "lost" and current.expired_at is None:
                current.expired_at = t
            del holding[worker]
        elif kind == "expire":
            if current is not None and current.expired_at is None:
                current.expired_at = t
            tl.marks.append(Mark(t, worker, "expire", detail))
        elif kind in ("read", "write"):  # reads are not drawn, but they decide which writes are stale
            sent = float(e["sent"]) if isinstance(e.get("sent"), (int, float)) else t
            accesses.append((t, min(sent, t), worker, fence, ok, detail, kind == "write"))
    for lease in holding.values():                               # never released: open until its last sign
        lease.end = max(lease.held_until, lease.lease_end or lease.start)
        tl.t_max = max(tl.t_max, lease.end)
    tl.writes = _classify(accesses, tl.leases)
    tl.overlaps = _overlaps(tl.leases)
    return tl


def _classify(accesses: Sequence[tuple[float, float, str, int | None, bool | None, str, bool]],
              leases: Sequence[Lease]) -> list[Write]:
    """The writes, each classified by `history.stale_flags`; an access belongs to its worker's latest lease
    granted before it was sent."""
    accepted: list[tuple[float | None, bool]] = []
    for _, sent, worker, _, ok, _, is_write in accesses:
        if ok:
            own = [x for x in leases if x.worker == worker and x.start <= sent]
            accepted.append((max(x.start for x in own) if own else None, is_write))
    stale = iter(stale_flags(accepted))
    out: list[Write] = []
    for t, _, worker, fence, ok, detail, is_write in accesses:
        flag = next(stale) if ok else False
        if not is_write:
            continue
        outcome = "unanswered" if ok is None else "rejected" if not ok else "stale" if flag else "accepted"
        out.append(Write(t, worker, fence, outcome, detail))
    return out


def _overlaps(leases: Sequence[Lease]) -> list[tuple[float, float]]:
    """The merged stretches where leases of two different workers were held at once."""
    spans: list[tuple[float, float]] = []
    for i, a in enumerate(leases):
        for b in leases[i + 1:]:
            if a.worker != b.worker:
                lo, hi = max(a.start, b.start), min(a.held_until, b.held_until)
                if hi > lo:
                    spans.append((lo, hi))
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def busy_window(tl: Timeline) -> tuple[float, float] | None:
    """The stretch worth a zoomed second panel: the largest run of events closer together than 2 % of the
    timeline, when it holds at least 4 events and spans under a fifth of it (a pause, then a burst)."""
    span = max(tl.t_max, 1e-9)
    times = sorted({w.t for w in tl.writes} | {m.t for m in tl.marks}
                   | {x.start for x in tl.leases} | {x.held_until for x in tl.leases})
    best: tuple[int, float, float] | None = None
    i = 0
    while i < len(times):
        j = i
        while j + 1 < len(times) and times[j + 1] - times[j] < span * 0.02:
            j += 1
        if best is None or j - i + 1 > best[0]:
            best = (j - i + 1, times[i], times[j])
        i = j + 1
    if best is None or best[0] < 4 or best[2] - best[1] > span * 0.2:
        return None
    width = max(best[2] - best[1], span * 0.01)
    return best[1] - width * 0.15, best[2] + width * 0.15
