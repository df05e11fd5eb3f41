"""The lab's HTML report: the verdict matrix and one timeline picture per cell, in one self-contained file.

`write_report(results, out_dir)` writes `out_dir/index.html` and returns its path. The page needs nothing
else: the CSS is inline and each picture is an SVG in a `data:` URI, so the file can be mailed or attached to
a CI run as it is. Every string that comes from the results goes through `html.escape` (in pictures,
matplotlib escapes it and `$...$` is not read as mathtext).

The pictures come from matplotlib, an optional extra (`pip install 'fencelock[lab]'`), imported only when a
report is written. One figure is reused for every cell, so dozens of cells take a few seconds.

How a cell's events become a timeline (`timeline()`; pure, no I/O):

- One lane per worker, in the order the workers first appear. Workers that only appear in fault events (a
  server, "lab") get no lane: their faults are drawn across all lanes.
- A lease runs from a successful `acquire` to that worker's `release` (granted or refused) or `lost`, or to its
  last event (or lease end) if neither came. A successful `acquire` with the fence of the lease the worker
  already holds (or, without fences, any `acquire` while it holds one) extends that lease: its `lease_end` moves,
  if the lease was still valid then (a late "extension" that succeeded, a naive PEXPIRE, extended another key).
- A lease is valid until its `lease_end` or an `expire` event, whichever comes first. The part after that, where
  the holder still believed it held the lock, is drawn hatched.
- An accepted write is *stale* by the lab checker's rule (`history.stale_flags`): its writer held nothing, or
  the resource had already accepted a read or write from a lease granted after the writer's (with sound fences:
  a lower fence after a higher one). Reads are not drawn. The lab counts; the picture shows where.
- Overlaps are the stretches where two workers' leases (as the workers saw them) were open at once.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .history import stale_flags

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["Lease", "Mark", "Timeline", "Write", "timeline", "write_report"]

VERDICTS = ("SAFE", "UNSAFE", "FAULT-MISSED", "SKIPPED", "ERROR")
EXPECTATIONS = ("SAFE", "UNSAFE")
KINDS = ("acquire", "read", "write", "release", "lost", "fault", "expire")
COUNT_KEYS = ("overlaps", "stale_accepted", "stale_rejected", "lost_updates", "writes", "faults")

EXTRA_HINT = "pip install 'fencelock[lab]'"

# ---------------------------------------------------------------------------------------------------------------
# Checking the input (before anything is written)
# ---------------------------------------------------------------------------------------------------------------


def _require(mapping: Any, where: str, keys: Mapping[str, type | tuple[type, ...]]) -> None:
    if not isinstance(mapping, dict):
        raise TypeError(f"results: {where} must be a dict, got {type(mapping).__name__}")
    for key, kind in keys.items():
        if key not in mapping:
            raise ValueError(f"results: {where} has no {key!r}")
        value = mapping[key]
        # bool is an int: a count or a time given as True/False is a mistake.
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise TypeError(f"results: {where}[{key!r}] must be {_kind_name(kind)}, got bool")
        if not isinstance(value, kind):
            raise TypeError(f"results: {where}[{key!r}] must be {_kind_name(kind)}, got {type(value).__name__}")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("None" if k is type(None) else k.__name__ for k in kinds)


def _one_of(value: str, allowed: Sequence[str], where: str) -> None:
    if value not in allowed:
        raise ValueError(f"results: {where} is {value!r}, not one of {', '.join(allowed)}")


def check_results(results: Any) -> None:
    """Raise TypeError/ValueError naming the first field of `results` that does not follow the schema."""
    number = (int, float)
    _require(results, "results", {"version": int, "seed": int, "quick": bool, "started": str,
                                  "duration_s": number, "configs": list, "scenarios": list, "cells": list})
    if results["version"] != 1:
        raise ValueError(f"results: version {results['version']!r} is not supported (this report reads version 1)")
    for i, config in enumerate(results["configs"]):
        _require(config, f"configs[{i}]", {"id": str, "title": str, "available": bool,
                                           "why_unavailable": (str, type(None))})
    for i, scenario in enumerate(results["scenarios"]):
        _require(scenario, f"scenarios[{i}]", {"id": str, "number": int, "title": str, "fault": str, "source": str})
    for i, cell in enumerate(results["cells"]):
        where = f"cells[{i}]"
        _require(cell, where, {"scenario": str, "config": str, "runs": int, "verdict": str, "expected": str,
                               "matches_expectation": bool, "note": str, "counts": dict, "events": list})
        _one_of(cell["verdict"], VERDICTS, f"{where}['verdict']")
        _one_of(cell["expected"], EXPECTATIONS, f"{where}['expected']")
        _require(cell["counts"], f"{where}['counts']", dict.fromkeys(COUNT_KEYS, int))
        for j, event in enumerate(cell["events"]):
            ewhere = f"{where}['events'][{j}]"
            _require(event, ewhere, {"t": number, "worker": str, "kind": str, "fence": (int, type(None)),
                                     "ok": (bool, type(None)), "lease_end": (int, float, type(None)),
                                     "detail": str})
            _one_of(event["kind"], KINDS, f"{ewhere}['kind']")
            for key in ("t", "lease_end"):
                if event[key] is not None and not math.isfinite(event[key]):
                    raise ValueError(f"results: {ewhere}[{key!r}] must be finite, got {event[key]!r}")


# ---------------------------------------------------------------------------------------------------------------
# The timeline of one cell (pure)
# ---------------------------------------------------------------------------------------------------------------


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
    """Turn one cell's events into lanes, leases, classified writes, marks and overlaps (see the module doc)."""
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
    """The writes, each classified by the lab checker's rule (`history.stale_flags`): an accepted write is stale
    when its writer held nothing, or when the resource had already accepted an access (read or write) from a
    lease granted after the writer's. An access belongs to its worker's latest lease granted before it was
    sent."""
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


def _s(t: float) -> str:
    return f"{t:.2f} s"


def _fence(fence: int | None) -> str:
    return "no fence" if fence is None else f"fence {fence}"


def describe(tl: Timeline) -> list[str]:
    """The picture in sentences: its text alternative."""
    lines: list[str] = []
    for lease in tl.leases:
        line = f"{lease.worker} held the lock ({_fence(lease.fence)}) from {_s(lease.start)} to {_s(lease.held_until)}"
        if lease.extensions:
            line += f", extended {lease.extensions} time{'s' * (lease.extensions > 1)}"
        line += {"released": ", then released it", "release refused": ", then its release was refused",
                 "lost": ", then learnt it was lost", "open": ""}[lease.ending]
        if lease.past_end and lease.valid_until is not None:
            line += f"; its lease had ended at {_s(lease.valid_until)}"
        lines.append(line + ".")
    for lo, hi in tl.overlaps:
        lines.append(f"Two workers held leases at once from {_s(lo)} to {_s(hi)}.")
    for mark in tl.faults:
        lines.append(f"Fault {mark.label} at {_s(mark.t)} ({mark.worker}): {mark.detail}.")
    words = {"accepted": "accepted", "stale": "STALE but accepted", "rejected": "rejected",
             "unanswered": "got no answer"}
    for w in tl.writes:
        lines.append(f"Write by {w.worker} ({_fence(w.fence)}) at {_s(w.t)}: {words[w.outcome]}.")
    return lines


# ---------------------------------------------------------------------------------------------------------------
# Pictures (matplotlib, imported lazily)
# ---------------------------------------------------------------------------------------------------------------

# Paul Tol's colour-blind-safe palette; every meaning also has its own shape, hatch or label.
BLUE, GREEN, YELLOW, RED, PURPLE = "#4477AA", "#228833", "#CCBB44", "#EE6677", "#AA3377"
DARK_RED = "#B2182B"
LANE_HEIGHT_IN = 0.40
MAX_LABELLED_LEASES = 40          # past this, fence and fault labels would only cover each other
WIDTH_IN = 5.4


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(f"the lab's HTML report draws its timelines with matplotlib: {EXTRA_HINT}") from exc
    return matplotlib


@contextmanager
def _style() -> Iterator[None]:
    mpl = _matplotlib()
    with mpl.rc_context({
        "svg.fonttype": "none",          # text stays text: small files, selectable, drawn by the browser
        "svg.hashsalt": "fencelock",     # the same results give the same file
        "text.parse_math": False,        # a '$' in a worker name or a detail is just a '$'
        "font.family": "DejaVu Sans",            # ships with matplotlib; Debian: fonts-dejavu-core
        "font.size": 8.5,
        "axes.edgecolor": "#555555",
        "axes.linewidth": 0.8,
        "hatch.linewidth": 1.0,
        "xtick.color": "#333333",
        "ytick.color": "#222222",
    }):
        yield


def _new_figure() -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(WIDTH_IN, 2.0), dpi=100)


def _svg(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return buf.getvalue()


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


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


def draw_timeline(fig: Figure, tl: Timeline) -> tuple[float, float] | None:
    """Draw one cell on `fig` (cleared first): lanes, lease bars, overlaps, faults, writes, fence labels; and,
    under it, a zoom on the busy stretch if there is one (returned)."""
    lanes = max(len(tl.lanes), 1)
    top_in, bottom_in, left_in, right_in, gap_in = 0.28, 0.40, 0.80, 0.12, 0.62
    zoom = busy_window(tl)
    panel_in = LANE_HEIGHT_IN * lanes
    height_in = top_in + bottom_in + panel_in + ((gap_in + panel_in) if zoom else 0.0)
    fig.clear()
    fig.set_size_inches(WIDTH_IN, height_in)
    width = 1 - (left_in + right_in) / WIDTH_IN
    t_max = max(tl.t_max, 0.1)
    pad = t_max * 0.03
    whole = (-pad, t_max * 1.1)                              # room on the right for an end's label
    main_bottom = bottom_in + ((gap_in + panel_in) if zoom else 0.0)
    ax: Axes = fig.add_axes((left_in / WIDTH_IN, main_bottom / height_in, width, panel_in / height_in))
    _draw_panel(ax, tl, whole, "seconds since the cell started", zoom)
    if zoom is not None:
        ax.axvspan(*zoom, facecolor="none", edgecolor="#777777", linewidth=0.9, linestyle=(0, (2, 2)), zorder=1)
        zx: Axes = fig.add_axes((left_in / WIDTH_IN, bottom_in / height_in, width, panel_in / height_in))
        _draw_panel(zx, tl, zoom, f"zoom on {zoom[0]:.3f} - {zoom[1]:.3f} s (the dotted box above)")
    return zoom


def _draw_panel(ax: Axes, tl: Timeline, xlim: tuple[float, float], xlabel: str,
                zoomed: tuple[float, float] | None = None) -> None:
    """One panel; the labels of what falls inside `zoomed` are left to the zoom panel, where they have room."""
    from matplotlib.ticker import MaxNLocator

    lanes = max(len(tl.lanes), 1)
    lo_x, hi_x = xlim
    span = hi_x - lo_x
    ax.set_xlim(lo_x, hi_x)
    ax.set_ylim(lanes - 0.45, -0.55)                         # lane 0 on top
    ax.set_yticks(range(len(tl.lanes)), [_short(w, 14) for w in tl.lanes])
    ax.tick_params(axis="y", length=0, pad=4)
    ax.tick_params(axis="x", labelsize=7.5)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=7))
    ax.set_xlabel(xlabel, fontsize=7.5, labelpad=2)
    ax.grid(axis="x", color="#E4E4E4", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    lane = {w: i for i, w in enumerate(tl.lanes)}

    def visible(t: float) -> bool:
        return lo_x <= t <= hi_x and not (zoomed is not None and zoomed[0] <= t <= zoomed[1])

    last_label = -math.inf
    for lo, hi in tl.overlaps:
        ax.axvspan(lo, hi, facecolor=YELLOW, alpha=0.28, edgecolor="none", zorder=0)
        mid = (max(lo, lo_x) + min(hi, hi_x)) / 2
        if visible(mid) and mid - last_label > span * 0.1:
            last_label = mid
            ax.text(mid, lanes - 0.5, "overlap", ha="center", va="bottom", fontsize=6.5, color="#6B5E00")

    # One artist per kind of thing, not one per lease or write: a cell of thousands of events stays fast.
    labels = sum(1 for x in tl.leases if x.start < hi_x and x.held_until > lo_x) <= MAX_LABELLED_LEASES
    solid: list[tuple[float, float, float]] = []                  # (lane, start, width)
    past: list[tuple[float, float, float]] = []
    released: list[tuple[float, float]] = []
    for lease in tl.leases:
        y = lane[lease.worker]
        valid = lease.valid_until
        solid_end = lease.held_until if valid is None else min(lease.held_until, valid)
        solid.append((y, lease.start, max(solid_end - lease.start, span * 0.004)))
        if lease.past_end and valid is not None:
            past.append((y, valid, lease.held_until - valid))
        if lease.ending == "released":
            released.append((lease.held_until, y))
        if not labels or lease.held_until < lo_x or lease.start > hi_x:
            continue
        start = max(lease.start, lo_x)
        room = min(solid_end, hi_x) - start > span * 0.13
        covered = any(w.worker == lease.worker and start <= w.t <= start + span * 0.13 for w in tl.writes)
        if room and not covered:                                 # room inside the bar: white on blue
            ax.annotate(_fence(lease.fence), (start, y), xytext=(3, 0), textcoords="offset points",
                        fontsize=6.8, va="center", ha="left", color="white", fontweight="bold", zorder=5)
        elif visible(start):
            ax.annotate(_fence(lease.fence), (start, y), xytext=(0, 7), textcoords="offset points",
                        fontsize=6.8, va="bottom", ha="left", color="#1A2E47", zorder=5)
        if lease.ending in ("release refused", "lost") and visible(lease.held_until):
            # Offset in points, so the word clears a marker drawn at the very end of the bar (the x axis
            # leaves room for it on the right).
            ax.annotate("refused" if lease.ending == "release refused" else "lost", (lease.held_until, y),
                        xytext=(7, 0), textcoords="offset points", fontsize=6.3, va="center", ha="left",
                        color=DARK_RED, zorder=5)
    if solid:
        ys, lefts, widths = zip(*solid, strict=True)
        ax.barh(ys, widths, left=lefts, height=0.46, color=BLUE, edgecolor="#22456B", linewidth=0.6, zorder=2)
    if past:
        ys, lefts, widths = zip(*past, strict=True)
        ax.barh(ys, widths, left=lefts, height=0.46, facecolor="#FBE3E6", hatch="////", edgecolor=DARK_RED,
                linewidth=0.8, zorder=2)
    _points(ax, released, marker="|", markersize=11, markeredgewidth=1.6, color="#111111", zorder=4)

    # Faults close together share one label ("F2-F3"), so labels never cover each other.
    groups: list[list[Mark]] = []
    for mark in tl.faults:
        ax.axvline(mark.t, color=PURPLE, linestyle=(0, (4, 2)), linewidth=1.1, zorder=3)
        if visible(mark.t):
            if groups and mark.t - groups[-1][0].t < span * 0.05:
                groups[-1].append(mark)
            else:
                groups.append([mark])
    if len(groups) <= MAX_LABELLED_LEASES:
        for group in groups:
            text = group[0].label if len(group) == 1 else f"{group[0].label}-{group[-1].label}"
            ax.text(group[0].t, -0.55, text, ha="left" if len(group) > 1 else "center", va="bottom", fontsize=7,
                    color="white", fontweight="bold", zorder=6,
                    bbox={"boxstyle": "round,pad=0.18", "facecolor": PURPLE, "edgecolor": "none"})
    refused = [(m.t, lane[m.worker]) for m in tl.marks if m.kind == "refused" and m.worker in lane]
    _points(ax, refused, marker=">", markersize=5, markerfacecolor="white", markeredgecolor="#555555", zorder=4)

    styles: dict[str, dict[str, Any]] = {
        "accepted": {"marker": "o", "markersize": 6.5, "markerfacecolor": GREEN, "markeredgecolor": "white"},
        "rejected": {"marker": "X", "markersize": 8.5, "markerfacecolor": "#333333", "markeredgecolor": "white"},
        "unanswered": {"marker": "o", "markersize": 6.5, "markerfacecolor": "white", "markeredgecolor": "#333333"},
        "stale": {"marker": "*", "markersize": 14, "markerfacecolor": RED, "markeredgecolor": "#5A0A12"},
    }
    for outcome, style in styles.items():                          # stale last: on top of everything
        _points(ax, [(w.t, lane[w.worker]) for w in tl.writes if w.outcome == outcome], zorder=7,
                markeredgewidth=0.9, **style)
    labelled: dict[str, float] = {}                               # lane -> time of its last STALE label
    for w in tl.writes:
        if w.outcome == "stale" and visible(w.t) and w.t - labelled.get(w.worker, -math.inf) > span * 0.08:
            labelled[w.worker] = w.t                              # one label for stars close together
            ax.annotate("STALE", (w.t, lane[w.worker]), xytext=(0, 7), textcoords="offset points", ha="center",
                        va="bottom", fontsize=6.5, fontweight="bold", color=DARK_RED, zorder=7)


def _points(ax: Axes, points: Sequence[tuple[float, float]], **style: Any) -> None:
    if points:
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, linestyle="none", **style)


def draw_legend(fig: Figure) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig.clear()
    fig.set_size_inches(WIDTH_IN * 1.6, 0.55)
    handles = [
        Patch(facecolor=BLUE, edgecolor="#22456B", label="lease, valid"),
        Patch(facecolor="#FBE3E6", edgecolor=DARK_RED, hatch="////", label="held past its lease end"),
        Line2D([], [], marker="|", color="#111111", markersize=11, markeredgewidth=1.6, linestyle="none",
               label="released"),
        Line2D([], [], marker="o", markerfacecolor=GREEN, markeredgecolor="white", markersize=7, linestyle="none",
               label="write accepted"),
        Line2D([], [], marker="X", markerfacecolor="#333333", markeredgecolor="white", markersize=8,
               linestyle="none", label="write rejected"),
        Line2D([], [], marker="*", markerfacecolor=RED, markeredgecolor="#5A0A12", markersize=13, linestyle="none",
               label="STALE write accepted"),
        Line2D([], [], marker="o", markerfacecolor="white", markeredgecolor="#333333", markersize=7,
               linestyle="none", label="write, no answer"),
        Line2D([], [], marker=">", markerfacecolor="white", markeredgecolor="#555555", markersize=6,
               linestyle="none", label="acquire refused"),
        Line2D([], [], color=PURPLE, linestyle=(0, (4, 2)), linewidth=1.1, label="fault (F1, F2, …)"),
        Patch(facecolor=YELLOW, alpha=0.28, label="two holders at once"),
    ]
    fig.legend(handles=handles, loc="center", ncol=5, frameon=False, fontsize=8, handlelength=1.6,
               columnspacing=1.4)


# ---------------------------------------------------------------------------------------------------------------
# HTML
# ---------------------------------------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-") or "x"


# Each verdict has its own symbol and word, not only its colour (the en dash marks SKIPPED).
SYMBOL = {"SAFE": "✓", "UNSAFE": "✗", "FAULT-MISSED": "?", "SKIPPED": "\u2013", "ERROR": "!"}
CLASS = {"SAFE": "safe", "UNSAFE": "unsafe", "FAULT-MISSED": "missed", "SKIPPED": "skipped", "ERROR": "error"}
MEANING = {
    "SAFE": "no stale write was accepted in any run",
    "UNSAFE": "a stale write was accepted",
    "FAULT-MISSED": "the fault could not be shown to have happened: no verdict",
    "SKIPPED": "not run (the configuration is not available here)",
    "ERROR": "the cell failed to run: no verdict",
}

HOW_TO_ADD = [
    ("etcd", "Install etcd 3.4 or later so that <code>etcd</code> is on <code>PATH</code> (Debian: "
             "<code>apt-get install etcd-server etcd-client</code>), then run the lab again."),
    ("zk", "Install ZooKeeper 3.8 and Java 17 (Debian: <code>apt-get install zookeeper</code>), then run the lab "
           "again."),
    ("zoo", "Install ZooKeeper 3.8 and Java 17 (Debian: <code>apt-get install zookeeper</code>), then run the lab "
            "again."),
    ("red", "Install <code>redis-server</code> (Debian: <code>apt-get install redis-server</code>) or the embedded "
            "server (<code>pip install 'fencelock[embedded]'</code>), then run the lab again."),
]


def _how_to_add(config: Mapping[str, Any]) -> str:
    """Trusted markup (constants), or the results' own `how_to_add` text, escaped."""
    given = config.get("how_to_add")
    if isinstance(given, str) and given:
        return _e(given)
    lowered = f"{config['id']} {config['title']}".lower()
    for key, text in HOW_TO_ADD:
        if key in lowered:
            return text
    return "Install its server so that the lab finds it, then run the lab again."


def _rerun(results: Mapping[str, Any]) -> str:
    given = results.get("command")
    if isinstance(given, str) and given:
        return given
    runs = max((c["runs"] for c in results["cells"]), default=1)
    repeat = f" --repeat {runs}" if runs > 1 else ""
    return f"fencelock lab{' --quick' if results['quick'] else ''} --seed {results['seed']}{repeat} --out DIR"


def _source(source: str) -> str:
    if re.fullmatch(r"https?://\S+", source):
        return f'<a href="{_e(source)}">{_e(source)}</a>'
    return _e(source)


def _label(scenario: Mapping[str, Any]) -> str:
    """A scenario's number, with its variant letter when its id has one ("5a")."""
    number, sid = str(scenario["number"]), str(scenario["id"])
    return sid if re.fullmatch(re.escape(number) + r"[a-z]{1,2}", sid) else number


def _sentence(text: str) -> str:
    """`text` ending in a full stop, unless it already ends in punctuation."""
    text = text.rstrip()
    return text if not text or text[-1] in ".?!" else text + "."


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _counts_line(counts: Mapping[str, int]) -> str:
    return f"{_stale_line(counts)} · {_other_counts(counts)}"


def _stale_line(counts: Mapping[str, int]) -> str:
    return _plural(counts["stale_accepted"], "stale write") + " accepted"


def _other_counts(counts: Mapping[str, int]) -> str:
    return " · ".join((f"{counts['stale_rejected']} rejected", _plural(counts["overlaps"], "overlap"),
                       _plural(counts["lost_updates"], "lost update")))


def _expectation(cell: Mapping[str, Any]) -> str:
    verdict, expected = cell["verdict"], cell["expected"]
    if verdict in ("SAFE", "UNSAFE"):
        if cell["matches_expectation"]:
            return f'<span class="exp match">= as predicted ({_e(expected)})</span>'
        return f'<span class="exp differs">≠ predicted {_e(expected)}</span>'
    return f'<span class="exp none">predicted: {_e(expected)}</span>'


CSS = """
:root { --ink:#1d2433; --muted:#5a6275; --line:#d9dde6; --bg:#ffffff; --panel:#f6f7fa;
  --safe:#e3f2e6; --safe-ink:#145a24; --unsafe:#fde3e5; --unsafe-ink:#8c1020; --missed:#fff1cc; --missed-ink:#6b4e00;
  --skipped:#eceef2; --skipped-ink:#4a5160; --error:#efe3f5; --error-ink:#5c1f78; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 "DejaVu Sans", "Liberation Sans", Arial, sans-serif; color: var(--ink);
  background: var(--bg); }
header, main, footer { max-width: 1360px; margin: 0 auto; padding: 0 20px; }
header { padding-top: 18px; padding-bottom: 6px; border-bottom: 1px solid var(--line); }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 26px 0 8px; }
h3 { font-size: 16px; margin: 22px 0 4px; }
p { margin: 6px 0; }
.lede { color: var(--muted); margin: 0 0 10px; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 8px 0 10px; }
dl.meta dt { color: var(--muted); }
dl.meta dd { margin: 0; }
nav { font-size: 13.5px; margin: 4px 0 8px; }
nav a { margin: 0 2px; }
code { font-family: "DejaVu Sans Mono", "Liberation Mono", monospace; font-size: 13px; background: var(--panel);
  padding: 1px 5px; border-radius: 3px; }
table.matrix { border-collapse: separate; border-spacing: 3px; width: 100%; table-layout: fixed; }
table.matrix caption { text-align: left; color: var(--muted); padding-bottom: 4px; }
table.matrix th { font-weight: 600; text-align: left; vertical-align: bottom; padding: 4px 6px; font-size: 13px; }
table.matrix thead th { border-bottom: 2px solid var(--line); }
col.scenario-col { width: 22%; }
table.matrix th[scope=row] { vertical-align: top; font-weight: normal; border-top: 1px solid var(--line); }
table.matrix th[scope=row] .t { font-weight: 600; }
.num { display: inline-block; min-width: 1.6em; font-weight: 700; }
small, .small { font-size: 12px; color: var(--muted); display: block; }
td.cell { vertical-align: top; padding: 5px 7px; border-radius: 5px; font-size: 12.5px; border: 2px solid transparent; }
td.cell a { color: inherit; text-decoration: none; display: block; }
td.cell a:hover .verdict, td.cell a:focus .verdict { text-decoration: underline; }
.verdict { font-weight: 700; font-size: 14px; letter-spacing: .02em; }
.counts, .exp, .runs, .note { display: block; }
.exp.differs { font-weight: 700; }
.note { color: var(--ink); overflow-wrap: anywhere; }
td.safe { background: var(--safe); color: var(--safe-ink); }
td.unsafe { background: var(--unsafe); color: var(--unsafe-ink); }
td.missed { background: var(--missed); color: var(--missed-ink); }
td.skipped { background: var(--skipped); color: var(--skipped-ink); }
td.error { background: var(--error); color: var(--error-ink); }
td.cell.differs { border: 2px dashed var(--ink); }
.legend { display: flex; flex-wrap: wrap; gap: 6px 16px; margin: 8px 0; font-size: 13px; padding: 0; list-style: none; }
.legend li { display: flex; align-items: center; gap: 6px; }
.chip { display: inline-block; padding: 0 7px; border-radius: 4px; font-weight: 700; }
.chip.safe { background: var(--safe); color: var(--safe-ink); }
.chip.unsafe { background: var(--unsafe); color: var(--unsafe-ink); }
.chip.missed { background: var(--missed); color: var(--missed-ink); }
.chip.skipped { background: var(--skipped); color: var(--skipped-ink); }
.chip.error { background: var(--error); color: var(--error-ink); }
.summary { font-size: 15px; }
ul.plain { margin: 4px 0; padding-left: 20px; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(640px, 1fr)); gap: 14px 18px; }
figure { margin: 0; padding: 10px 12px; background: var(--panel); border: 1px solid var(--line); border-radius: 6px; }
figure.differs { border: 2px dashed var(--ink); }
figure h4 { margin: 0 0 4px; font-size: 14px; display: flex; justify-content: space-between; gap: 8px; }
figure img { display: block; width: 100%; height: auto; background: #fff; border-radius: 3px; }
figcaption { font-size: 12.5px; color: var(--muted); margin-top: 4px; }
figcaption .note { color: var(--ink); }
details { margin-top: 4px; font-size: 12.5px; }
summary { cursor: pointer; color: var(--ink); }
table.events { border-collapse: collapse; margin-top: 4px; width: 100%; }
table.events th, table.events td { text-align: left; padding: 1px 6px; border-bottom: 1px solid var(--line); }
img.legend-picture { max-width: 960px; width: 100%; height: auto; display: block; }
footer { color: var(--muted); font-size: 12.5px; padding-top: 14px; padding-bottom: 28px; }
a { color: #1f4f8a; }
"""

# Marks every picture as loaded or broken once the page has loaded (for people and for the browser test).
SCRIPT = (
    "window.addEventListener('load',function(){var ok=0,bad=0;"
    "document.querySelectorAll('img').forEach(function(i){var g=i.complete?i.naturalWidth>0:false;"
    "i.setAttribute('data-loaded',g?'yes':'no');g?ok++:bad++;});"
    "document.body.setAttribute('data-pictures-loaded',ok);document.body.setAttribute('data-pictures-broken',bad);"
    "if(bad){var p=document.getElementById('broken');p.hidden=false;p.textContent=bad+' picture(s) failed to load.';}"
    "});"
)


def _csp() -> str:
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    # Nothing but this page's own style, pictures and one script: even a string that escaped escaping could not run.
    return (f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'; "
            "base-uri 'none'; form-action 'none'")


def _data_uri(svg: bytes) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")


def _events_table(events: Sequence[Mapping[str, Any]], limit: int = 300) -> str:
    rows = []
    for ev in sorted(events, key=lambda e: float(e["t"]))[:limit]:
        lease_end = "" if ev["lease_end"] is None else f"{float(ev['lease_end']):.3f}"
        fence = "" if ev["fence"] is None else ev["fence"]
        ok = {True: "yes", False: "no", None: ""}[ev["ok"]]
        rows.append(f"<tr><td>{float(ev['t']):.3f}</td><td>{_e(ev['worker'])}</td><td>{_e(ev['kind'])}</td>"
                    f"<td>{_e(fence)}</td><td>{ok}</td><td>{_e(lease_end)}</td><td>{_e(ev['detail'])}</td></tr>")
    more = "" if len(events) <= limit else f"<p>… and {len(events) - limit} more events (see results.json).</p>"
    return ("<table class=\"events\"><thead><tr><th scope=\"col\">t (s)</th><th scope=\"col\">worker</th>"
            "<th scope=\"col\">event</th><th scope=\"col\">fence</th><th scope=\"col\">ok</th>"
            "<th scope=\"col\">lease end (s)</th><th scope=\"col\">detail</th></tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>" + more)


def _verdict_html(cell: Mapping[str, Any]) -> str:
    v = cell["verdict"]
    return f'<span class="verdict">{SYMBOL[v]} {_e(v)}</span>'


def _alt(scenario: Mapping[str, Any], config: Mapping[str, Any], cell: Mapping[str, Any], tl: Timeline) -> str:
    o = tl.outcomes()
    parts = [f"Timeline of scenario {_label(scenario)}, {scenario['title']}, on {config['title']}: "
             f"{cell['verdict']}.",
             f"{_plural(len(tl.lanes), 'worker')}, {_plural(len(tl.leases), 'lease')}, "
             f"{_plural(len(tl.faults), 'fault')}.",
             f"Writes: {o['accepted']} accepted, {o['stale']} stale accepted, {o['rejected']} rejected"
             + (f", {o['unanswered']} without an answer" if o["unanswered"] else "") + "."]
    if tl.overlaps:
        parts.append(f"Two workers held leases at once for {sum(hi - lo for lo, hi in tl.overlaps):.2f} s.")
    return " ".join(parts)


def write_report(results: dict[str, Any], out_dir: Path) -> Path:
    """Write `out_dir/index.html` for the lab's `results` (the schema of issue 7) and return its path.

    Raises TypeError/ValueError naming the field when `results` does not follow the schema (nothing is written),
    and ImportError naming the `fencelock[lab]` extra when matplotlib is not installed.
    """
    check_results(results)
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir must be a path, got {type(out_dir).__name__}")
    out_dir = Path(out_dir)
    _matplotlib()                                                  # fail before anything is created
    out_dir.mkdir(parents=True, exist_ok=True)
    page = _page(results)
    target = out_dir / "index.html"
    partial = out_dir / ".index.html.partial"
    partial.write_text(page, encoding="utf-8")
    partial.replace(target)
    return target


def _page(results: Mapping[str, Any]) -> str:
    configs = {c["id"]: c for c in results["configs"]}
    scenarios = sorted(results["scenarios"], key=lambda s: (s["number"], s["id"]))
    cells: dict[tuple[str, str], Mapping[str, Any]] = {(c["scenario"], c["config"]): c for c in results["cells"]}
    # Cells that name a configuration or scenario the lists lack still appear, under their bare id.
    for c in results["cells"]:
        configs.setdefault(c["config"], {"id": c["config"], "title": c["config"], "available": True,
                                         "why_unavailable": None})
        if all(s["id"] != c["scenario"] for s in scenarios):
            scenarios.append({"id": c["scenario"], "number": len(scenarios) + 1, "title": c["scenario"],
                              "fault": "", "source": ""})
    anchors: dict[tuple[str, str], str] = {}
    used: set[str] = set()
    for key in cells:
        anchor = base = f"cell-{_slug(key[0])}--{_slug(key[1])}"
        n = 2
        while anchor in used:
            anchor, n = f"{base}-{n}", n + 1
        used.add(anchor)
        anchors[key] = anchor

    out: list[str] = []
    out.append(_head(results))
    out.append(_header(results))
    out.append("<main>")
    out.append(_matrix(results, scenarios, configs, cells, anchors))
    out.append(_unavailable(configs))
    with _style():
        fig = _new_figure()
        draw_legend(fig)
        legend = _data_uri(_svg(fig))
        out.append('<section id="timelines"><h2>Timelines</h2>'
                   "<p>One picture per cell: one lane per worker, time running right. “refused” at the end of a "
                   "bar: its release was refused; “lost”: the worker learnt it had lost the lease. When a long "
                   "pause ends in a burst, a second panel zooms on the burst. Each picture has a text "
                   "description and the full list of events beneath it.</p>"
                   f'<img class="legend-picture" src="{legend}" alt="Legend: a solid blue bar is a valid lease; '
                   "a hatched red bar is a lease held past its end; a black tick is a release; a green circle is "
                   "an accepted write; a dark X is a rejected write; a red star labelled STALE is a stale write "
                   "that was accepted; a hollow circle is a write with no answer; a hollow triangle is a refused "
                   "acquire; a dashed purple line labelled F1, F2 is a fault; a yellow band marks two holders at "
                   'once."/>')
        for scenario in scenarios:
            out.append(_scenario_timelines(scenario, configs, cells, anchors, fig))
        out.append("</section>")
    out.append("</main>")
    out.append(f"<footer><p>fencelock lab report · results version {_e(results['version'])} · "
               "pictures drawn with matplotlib · every verdict comes from the lab's checker; the pictures only "
               "show its evidence.</p></footer>")
    out.append(f"<script>{SCRIPT}</script></body></html>\n")
    return "\n".join(out)


def _head(results: Mapping[str, Any]) -> str:
    mode = "quick" if results["quick"] else "full"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>"
            f'<meta http-equiv="Content-Security-Policy" content="{_e(_csp())}"/>'
            '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
            f"<title>fencelock lab report: seed {_e(results['seed'])}, {mode} run</title>"
            f"<style>{CSS}</style></head><body>")


def _header(results: Mapping[str, Any]) -> str:
    scenarios = sorted(results["scenarios"], key=lambda s: (s["number"], s["id"]))
    nav = ('<nav aria-label="Contents"><a href="#verdicts">Verdicts</a> · <a href="#unavailable">Not run</a> · '
           '<a href="#timelines">Timelines</a>: '
           + " ".join(f'<a href="#scenario-{_slug(s["id"])}" title="{_e(s["title"])}">{_e(_label(s))}</a>'
                      for s in scenarios) + "</nav>")
    mode = ("quick (<code>--quick</code>: fewer, shorter runs)" if results["quick"]
            else "full")
    return ("<header><h1>fencelock lab report</h1>"
            "<p class=\"lede\">The classic distributed-lock failures, injected for real on real servers, and which "
            "lock configurations kept the resource safe.</p>"
            "<dl class=\"meta\">"
            f"<dt>Seed</dt><dd>{_e(results['seed'])}</dd>"
            f"<dt>Mode</dt><dd>{mode}</dd>"
            f"<dt>Started</dt><dd>{_e(results['started'])}</dd>"
            f"<dt>Duration</dt><dd>{float(results['duration_s']):.1f} s</dd>"
            f"<dt>Run it again</dt><dd><code>{_e(_rerun(results))}</code></dd>"
            "</dl><p id=\"broken\" class=\"note\" hidden=\"hidden\"></p>"
            f"{nav}</header>")


def _matrix(results: Mapping[str, Any], scenarios: Sequence[Mapping[str, Any]], configs: Mapping[str, Any],
            cells: Mapping[tuple[str, str], Mapping[str, Any]], anchors: Mapping[tuple[str, str], str]) -> str:
    tally = dict.fromkeys(VERDICTS, 0)
    differs = []
    for key, each in cells.items():
        tally[each["verdict"]] += 1
        if each["verdict"] in ("SAFE", "UNSAFE") and not each["matches_expectation"]:
            differs.append(key)
    judged = tally["SAFE"] + tally["UNSAFE"]
    out = ['<section id="verdicts"><h2>Verdicts</h2>']
    out.append(f'<p class="summary">{_plural(len(cells), "cell")}: '
               + ", ".join(f"{n} {_e(v)}" for v, n in tally.items() if n)
               + f". Of the {judged} with a verdict, {judged - len(differs)} agree with the literature"
               + (f" and <strong>{len(differs)} differ</strong> (dashed outline)." if differs else ".") + "</p>")
    out.append('<ul class="legend" aria-label="What the verdicts mean">'
               + "".join(f'<li><span class="chip {CLASS[v]}">{SYMBOL[v]} {_e(v)}</span> {_e(MEANING[v])}</li>'
                         for v in VERDICTS) + "</ul>")
    out.append('<table class="matrix"><caption>Scenario &#215; configuration. Counts are totals over the runs; '
               "“predicted” is what the source in the first column predicts. Each cell links to its timeline."
               "</caption><colgroup><col class=\"scenario-col\"/>"
               + "<col/>" * len(configs) + "</colgroup><thead><tr><th scope=\"col\">Scenario (fault; source)</th>")
    for config in configs.values():
        out.append(f'<th scope="col">{_e(config["title"])}</th>')
    out.append("</tr></thead><tbody>")
    for s in scenarios:
        out.append(f'<tr><th scope="row"><span class="num">{_e(_label(s))}</span><span class="t">'
                   f'{_e(s["title"])}</span><small>{_e(s["fault"])}</small>'
                   f'<small>Source: {_source(s["source"])}</small></th>')
        for cid in configs:
            cell = cells.get((s["id"], cid))
            if cell is None:
                out.append('<td class="cell skipped"><span class="verdict">&#8211; not in these results</span></td>')
                continue
            v = cell["verdict"]
            klass = f"cell {CLASS[v]}" + (" differs" if (s["id"], cid) in differs else "")
            if v == "SKIPPED" and not configs[cid]["available"]:
                out.append(f'<td class="{klass}"><a href="#unavailable">{_verdict_html(cell)}</a>'
                           f'<span class="note">not available here: <a href="#unavailable">how to add it</a>'
                           f"</span>{_expectation(cell)}</td>")
                continue
            if v == "SKIPPED":                                     # e.g. a scenario that does not apply
                out.append(f'<td class="{klass}"><a href="#{anchors[(s["id"], cid)]}">{_verdict_html(cell)}</a>'
                           f'<span class="note">{_e(_short(cell["note"] or "skipped", 160))}</span>'
                           f"{_expectation(cell)}</td>")
                continue
            body = [f'<a href="#{anchors[(s["id"], cid)]}">{_verdict_html(cell)}</a>']
            if v in ("SAFE", "UNSAFE"):
                c = cell["counts"]
                stale = f"<strong>{_e(_stale_line(c))}</strong>" if c["stale_accepted"] else _e(_stale_line(c))
                body.append(f'<span class="counts">{stale}<br/>{_e(_other_counts(c))}</span>')
            body.append(_expectation(cell))
            if v != "SKIPPED":
                body.append(f'<span class="runs small">{_plural(cell["runs"], "run")}, '
                            f'{_plural(cell["counts"]["faults"], "fault")} injected</span>')
            if cell["note"] and (v in ("ERROR", "FAULT-MISSED") or (s["id"], cid) in differs):
                body.append(f'<span class="note">{_e(_short(cell["note"], 160))}</span>')
            out.append(f'<td class="{klass}">{"".join(body)}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    if differs:
        out.append('<h3 id="differences">Where this run differs from the literature</h3><ul class="plain">')
        names = {s["id"]: s for s in scenarios}
        for key in differs:
            each, s = cells[key], names[key[0]]
            out.append(f'<li><a href="#{anchors[key]}">Scenario {_e(_label(s))} on {_e(configs[key[1]]["title"])}'
                       f'</a>: {_e(each["verdict"])}, where {_e(s["source"])} predicts {_e(each["expected"])}.'
                       + (f" {_e(each['note'])}" if each["note"] else "") + "</li>")
        out.append("</ul>")
    out.append("</section>")
    return "".join(out)


def _unavailable(configs: Mapping[str, Mapping[str, Any]]) -> str:
    missing = [c for c in configs.values() if not c["available"]]
    if not missing:
        return ('<section id="unavailable"><h2>Configurations not run</h2><p>None: every configuration ran.</p>'
                "</section>")
    items = "".join(f'<li><strong>{_e(c["title"])}</strong> (<code>{_e(c["id"])}</code>): '
                    f'{_e(c["why_unavailable"] or "not available")}. {_how_to_add(c)}</li>' for c in missing)
    return (f'<section id="unavailable"><h2>Configurations not run</h2><p>Their cells are SKIPPED. To add them:</p>'
            f'<ul class="plain">{items}</ul></section>')


def _scenario_timelines(scenario: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]],
                        cells: Mapping[tuple[str, str], Mapping[str, Any]], anchors: Mapping[tuple[str, str], str],
                        fig: Figure) -> str:
    out = [f'<section class="scenario" id="scenario-{_slug(scenario["id"])}">'
           f'<h3>{_e(_label(scenario))}. {_e(scenario["title"])}</h3>'
           f'<p><strong>Fault:</strong> {_e(_sentence(scenario["fault"]))} <strong>Source:</strong> '
           f'{_source(scenario["source"])}{"" if _sentence(scenario["source"]) == scenario["source"] else "."}</p>'
           '<div class="grid">']
    not_here = []
    for cid, config in configs.items():
        cell = cells.get((scenario["id"], cid))
        if cell is None:
            continue
        if cell["verdict"] == "SKIPPED" and not config["available"]:
            not_here.append(config["title"])                      # said once, under "Configurations not run"
            continue
        anchor = anchors[(scenario["id"], cid)]
        differs = cell["verdict"] in ("SAFE", "UNSAFE") and not cell["matches_expectation"]
        head = (f'<h4><span>{_e(config["title"])}</span><span class="chip {CLASS[cell["verdict"]]}">'
                f'{SYMBOL[cell["verdict"]]} {_e(cell["verdict"])}</span></h4>')
        note = f'<span class="note">{_e(cell["note"])}</span> ' if cell["note"] else ""
        if cell["verdict"] == "SKIPPED":
            out.append(f'<figure id="{anchor}" class="skipped">{head}<figcaption>{note}Not run, so there is no '
                       "timeline.</figcaption></figure>")
            continue
        tl = timeline(cell["events"])
        zoom = draw_timeline(fig, tl)
        picture = _data_uri(_svg(fig))
        zoomed = "" if zoom is None else f" The lower panel zooms on {zoom[0]:.3f} to {zoom[1]:.3f} s."
        lines = describe(tl) or ["No events were recorded."]
        counts = _counts_line(cell["counts"]) if cell["verdict"] in ("SAFE", "UNSAFE") else ""
        fault_list = "; ".join(f"{m.label} at {_s(m.t)}: {m.detail}" for m in tl.faults)
        out.append(
            f'<figure id="{anchor}" class="timeline{" differs" if differs else ""}">{head}'
            f'<img src="{picture}" alt="{_e(_alt(scenario, config, cell, tl) + zoomed)}" '
            f'aria-describedby="{anchor}-text" loading="eager"/>'
            f'<figcaption>{note}{_e(counts)}{". " if counts else ""}{_expectation(cell)}'
            + (f'<span class="small">Faults: {_e(fault_list)}</span>' if fault_list else "")
            + f'<details><summary>Described in words, and every event ({len(cell["events"])})</summary>'
            f'<ul class="plain" id="{anchor}-text">' + "".join(f"<li>{_e(line)}</li>" for line in lines)
            + "</ul>" + _events_table(cell["events"]) + "</details></figcaption></figure>")
    out.append("</div>")
    if not_here:
        out.append(f'<p class="small">Not run here: {_e(", ".join(not_here))} (see '
                   '<a href="#unavailable">Configurations not run</a>).</p>')
    out.append("</section>")
    return "".join(out)
