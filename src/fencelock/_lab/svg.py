"""The report's pictures as hand-written SVG: one timeline per cell (with a zoom panel on a burst) and the legend.

`timeline_svg(tl)` returns the SVG document and the zoomed window (or None); `legend_svg()` the legend. Output is
deterministic, and every string from the results is escaped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

from .timeline import Lease, Mark, Timeline, busy_window
from .words import fence_text, short

__all__ = ["legend_svg", "timeline_svg"]

# Paul Tol's colour-blind-safe palette; every meaning also has its own shape, hatch or label.
BLUE, GREEN, YELLOW, RED, PURPLE = "#4477AA", "#228833", "#CCBB44", "#EE6677", "#AA3377"
DARK_RED = "#B2182B"
PAST_FILL = "#FBE3E6"
FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif"
WIDTH = 640.0
LANE = 40.0                       # px per worker lane
BAR = 0.46 * LANE                 # a lease bar's height
LEFT, RIGHT, TOP, BOTTOM = 92.0, 14.0, 26.0, 40.0
MAX_LABELLED_LEASES = 40          # past this, fence and fault labels would only cover each other

DEFS = (f'<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{PAST_FILL}"/>'
        f'<line x1="0" y1="0" x2="0" y2="6" stroke="{DARK_RED}" stroke-width="1.6"/></pattern></defs>')


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _n(v: float) -> str:
    text = f"{v:.1f}"
    return "0" if text == "-0.0" else text[:-2] if text.endswith(".0") else text


def _text(x: float, y: float, body: str, size: float = 11.0, anchor: str = "start", fill: str = "#222222",
          bold: bool = False, baseline: str = "auto") -> str:
    weight = ' font-weight="bold"' if bold else ""
    base = "" if baseline == "auto" else f' dominant-baseline="{baseline}"'
    return (f'<text x="{_n(x)}" y="{_n(y)}" font-size="{size}" text-anchor="{anchor}" fill="{fill}"{weight}{base}>'
            f"{_e(body)}</text>")


def _ticks(lo: float, hi: float, n: int = 7) -> tuple[list[float], int]:
    """Round tick values in [lo, hi], at most about `n`, and the decimals their labels need."""
    span = max(hi - lo, 1e-9)
    magnitude = 10 ** math.floor(math.log10(span / n))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        step = m * magnitude
        if span / step <= n:
            break
    decimals = max(0, -math.floor(math.log10(step) + 1e-9) + (1 if m == 2.5 else 0))
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + 1e-9:
        ticks.append(k * step)
        k += 1
    return ticks, decimals


def _star(x: float, y: float, r: float) -> str:
    points = []
    for i in range(10):
        radius = r if i % 2 == 0 else r * 0.42
        angle = math.pi / 2 + i * math.pi / 5
        points.append(f"{_n(x + radius * math.cos(angle))},{_n(y - radius * math.sin(angle))}")
    return " ".join(points)


def _cross(x: float, y: float, r: float) -> str:
    return f"M{_n(x - r)} {_n(y - r)}L{_n(x + r)} {_n(y + r)}M{_n(x - r)} {_n(y + r)}L{_n(x + r)} {_n(y - r)}"


def _marker(kind: str, x: float, y: float) -> str:
    return f'<g class="{kind}">{_shape(kind, x, y)}</g>'


def _shape(kind: str, x: float, y: float) -> str:
    if kind == "accepted":
        return f'<circle cx="{_n(x)}" cy="{_n(y)}" r="4.6" fill="{GREEN}" stroke="#ffffff" stroke-width="1"/>'
    if kind == "unanswered":
        return f'<circle cx="{_n(x)}" cy="{_n(y)}" r="4.2" fill="#ffffff" stroke="#333333" stroke-width="1.2"/>'
    if kind == "rejected":
        return (f'<path d="{_cross(x, y, 4.2)}" stroke="#ffffff" stroke-width="4.4"/>'
                f'<path d="{_cross(x, y, 4.2)}" stroke="#333333" stroke-width="2.4"/>')
    if kind == "stale":
        return f'<polygon points="{_star(x, y, 8.5)}" fill="{RED}" stroke="#5A0A12" stroke-width="0.9"/>'
    if kind == "refused":
        return (f'<polygon points="{_n(x - 3.5)},{_n(y - 4)} {_n(x + 4)},{_n(y)} {_n(x - 3.5)},{_n(y + 4)}" '
                'fill="#ffffff" stroke="#555555" stroke-width="1.1"/>')
    if kind == "released":
        return f'<line x1="{_n(x)}" y1="{_n(y - 8)}" x2="{_n(x)}" y2="{_n(y + 8)}" stroke="#111111" stroke-width="2"/>'
    raise ValueError(f"kind: no marker for {kind!r}")


class _Panel:
    """One panel: time `xlim` across `WIDTH - LEFT - RIGHT` px, one lane per worker, top edge at `top`."""

    def __init__(self, tl: Timeline, xlim: tuple[float, float], top: float, clip: str) -> None:
        self.tl, self.lo, self.hi, self.top, self.clip = tl, xlim[0], xlim[1], top, clip
        self.lanes = max(len(tl.lanes), 1)
        self.height = LANE * self.lanes
        self.width = WIDTH - LEFT - RIGHT
        self.lane = {w: i for i, w in enumerate(tl.lanes)}

    def x(self, t: float) -> float:
        return LEFT + (t - self.lo) / (self.hi - self.lo) * self.width

    def y(self, worker: str) -> float:
        return self.top + (self.lane[worker] + 0.5) * LANE

    def px(self, seconds: float) -> float:
        return seconds / (self.hi - self.lo) * self.width


def timeline_svg(tl: Timeline) -> tuple[bytes, tuple[float, float] | None]:
    """One cell's picture: lanes, lease bars, overlaps, faults, writes, fence labels; under it, a zoom on the
    busy stretch if there is one (returned)."""
    zoom = busy_window(tl)
    lanes = max(len(tl.lanes), 1)
    panel = LANE * lanes
    height = TOP + panel + BOTTOM + ((TOP + panel + BOTTOM) if zoom else 0.0)
    t_max = max(tl.t_max, 0.1)
    whole = (-t_max * 0.03, t_max * 1.1)                    # room on the right for an end's label
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_n(WIDTH)}" height="{_n(height)}" '
           f'viewBox="0 0 {_n(WIDTH)} {_n(height)}" font-family="{FONT}">', DEFS,
           f'<rect width="{_n(WIDTH)}" height="{_n(height)}" fill="#ffffff"/>']
    main = _Panel(tl, whole, TOP, "main")
    out += _panel(main, "seconds since the cell started", zoom)
    if zoom is not None:
        x0, x1 = main.x(zoom[0]), main.x(zoom[1])
        out.append(f'<rect x="{_n(x0)}" y="{_n(TOP)}" width="{_n(max(x1 - x0, 1.0))}" height="{_n(panel)}" '
                   'fill="none" stroke="#777777" stroke-width="1" stroke-dasharray="3 3"/>')
        below = _Panel(tl, zoom, TOP + panel + BOTTOM + TOP, "zoom")
        out += _panel(below, f"zoom on {zoom[0]:.3f} - {zoom[1]:.3f} s (the dotted box above)")
    out.append("</svg>")
    return "".join(out).encode("utf-8"), zoom


def _panel(p: _Panel, xlabel: str, zoomed: tuple[float, float] | None = None) -> list[str]:
    """One panel's elements; labels of what falls inside `zoomed` are left to the zoom panel, where they fit."""
    tl, span = p.tl, p.hi - p.lo
    bottom = p.top + p.height
    out = [f'<clipPath id="clip-{p.clip}"><rect x="{_n(LEFT)}" y="{_n(p.top - 2)}" width="{_n(p.width)}" '
           f'height="{_n(p.height + 4)}"/></clipPath>']
    ticks, decimals = _ticks(p.lo, p.hi)
    for t in ticks:
        x = p.x(t)
        out.append(f'<line x1="{_n(x)}" y1="{_n(p.top)}" x2="{_n(x)}" y2="{_n(bottom)}" stroke="#E4E4E4" '
                   'stroke-width="0.8"/>')
        out.append(f'<line x1="{_n(x)}" y1="{_n(bottom)}" x2="{_n(x)}" y2="{_n(bottom + 4)}" stroke="#555555"/>')
        label = f"{t:.{decimals}f}"
        out.append(_text(x, bottom + 16, "0" if float(label) == 0 else label, 11, "middle", "#333333"))
    out.append(f'<line x1="{_n(LEFT)}" y1="{_n(bottom)}" x2="{_n(LEFT + p.width)}" y2="{_n(bottom)}" '
               'stroke="#555555"/>')
    out.append(f'<line x1="{_n(LEFT)}" y1="{_n(p.top)}" x2="{_n(LEFT)}" y2="{_n(bottom)}" stroke="#555555"/>')
    out.append(_text(LEFT + p.width / 2, bottom + 33, xlabel, 11.5, "middle", "#333333"))
    for worker in tl.lanes:
        out.append(_text(LEFT - 6, p.y(worker), short(worker, 14), 12.5, "end", "#222222", baseline="central"))

    def visible(t: float) -> bool:
        return p.lo <= t <= p.hi and not (zoomed is not None and zoomed[0] <= t <= zoomed[1])

    clipped = [f'<g clip-path="url(#clip-{p.clip})">']
    last_label = -math.inf
    labels: list[str] = []
    for lo, hi in tl.overlaps:
        clipped.append(f'<rect x="{_n(p.x(lo))}" y="{_n(p.top)}" width="{_n(max(p.px(hi - lo), 0.5))}" '
                       f'height="{_n(p.height)}" fill="{YELLOW}" fill-opacity="0.28" class="overlap"/>')
        mid = (max(lo, p.lo) + min(hi, p.hi)) / 2
        if visible(mid) and mid - last_label > span * 0.1:
            last_label = mid
            labels.append(_text(p.x(mid), bottom - 3, "overlap", 9.5, "middle", "#6B5E00"))
    for mark in tl.faults:
        x = p.x(mark.t)
        clipped.append(f'<line x1="{_n(x)}" y1="{_n(p.top)}" x2="{_n(x)}" y2="{_n(bottom)}" stroke="{PURPLE}" '
                       'stroke-width="1.3" stroke-dasharray="5 2.5" class="fault"/>')
    labelled = sum(1 for x in tl.leases if x.start < p.hi and x.held_until > p.lo) <= MAX_LABELLED_LEASES
    for lease in tl.leases:
        clipped += _lease(p, lease)
        if labelled and not (lease.held_until < p.lo or lease.start > p.hi):
            labels += _lease_labels(p, lease, visible)
    markers: dict[str, list[tuple[float, float]]] = {k: [] for k in ("released", "refused", "accepted", "rejected",
                                                                      "unanswered", "stale")}
    for lease in tl.leases:
        if lease.ending == "released":
            markers["released"].append((p.x(lease.held_until), p.y(lease.worker)))
    for m in tl.marks:
        if m.kind == "refused" and m.worker in p.lane:
            markers["refused"].append((p.x(m.t), p.y(m.worker)))
    for w in tl.writes:
        markers[w.outcome].append((p.x(w.t), p.y(w.worker)))
    for kind, points in markers.items():                        # stale last: on top of everything
        clipped += [_marker(kind, x, y) for x, y in points if LEFT - 9 <= x <= LEFT + p.width + 9]
    clipped.append("</g>")
    out += clipped
    out += labels
    out += _fault_labels(p, tl.faults, visible)
    stale_at: dict[str, float] = {}                               # lane -> time of its last STALE label
    for w in tl.writes:
        if w.outcome == "stale" and visible(w.t) and w.t - stale_at.get(w.worker, -math.inf) > span * 0.08:
            stale_at[w.worker] = w.t                              # one label for stars close together
            out.append(_text(p.x(w.t), p.y(w.worker) - 10, "STALE", 10, "middle", DARK_RED, bold=True))
    return out


def _lease(p: _Panel, lease: Lease) -> list[str]:
    y, valid = p.y(lease.worker), lease.valid_until
    solid_end = lease.held_until if valid is None else min(lease.held_until, valid)
    x0 = p.x(lease.start)
    out = [f'<rect x="{_n(x0)}" y="{_n(y - BAR / 2)}" width="{_n(max(p.x(solid_end) - x0, p.width * 0.004))}" '
           f'height="{_n(BAR)}" fill="{BLUE}" stroke="#22456B" stroke-width="0.8" class="lease"/>']
    if lease.past_end and valid is not None:
        out.append(f'<rect x="{_n(p.x(valid))}" y="{_n(y - BAR / 2)}" width="{_n(p.px(lease.held_until - valid))}" '
                   f'height="{_n(BAR)}" fill="url(#hatch)" stroke="{DARK_RED}" stroke-width="1" class="past-end"/>')
    return out


def _lease_labels(p: _Panel, lease: Lease, visible: Callable[[float], bool]) -> list[str]:
    span = p.hi - p.lo
    y, valid = p.y(lease.worker), lease.valid_until
    solid_end = lease.held_until if valid is None else min(lease.held_until, valid)
    start = max(lease.start, p.lo)
    room = min(solid_end, p.hi) - start > span * 0.13
    covered = any(w.worker == lease.worker and start <= w.t <= start + span * 0.13 for w in p.tl.writes)
    out = []
    if room and not covered:                                      # room inside the bar: white on blue
        out.append(_text(p.x(start) + 4, y, fence_text(lease.fence), 10, "start", "#ffffff", True, "central"))
    elif visible(start):
        out.append(_text(p.x(start), y - BAR / 2 - 3, fence_text(lease.fence), 10, "start", "#1A2E47"))
    if lease.ending in ("release refused", "lost") and visible(lease.held_until):
        word = "refused" if lease.ending == "release refused" else "lost"   # clears a marker at the bar's end
        out.append(_text(p.x(lease.held_until) + 9, y, word, 9.5, "start", DARK_RED, baseline="central"))
    return out


def _fault_labels(p: _Panel, faults: Sequence[Mark], visible: Callable[[float], bool]) -> list[str]:
    """F1, F2 above the panel; faults close together share one label ("F2-F3"), so labels never overlap."""
    groups: list[list[Mark]] = []
    for mark in faults:
        if visible(mark.t):
            if groups and mark.t - groups[-1][0].t < (p.hi - p.lo) * 0.05:
                groups[-1].append(mark)
            else:
                groups.append([mark])
    if len(groups) > MAX_LABELLED_LEASES:
        return []
    out = []
    for group in groups:
        text = group[0].label if len(group) == 1 else f"{group[0].label}-{group[-1].label}"
        width = 7.5 * len(text) + 7
        x = p.x(group[0].t)
        left = x - width / 2 if len(group) == 1 else x
        out.append(f'<rect x="{_n(left)}" y="{_n(p.top - 17)}" width="{_n(width)}" height="15" rx="3" '
                   f'fill="{PURPLE}"/>')
        out.append(_text(left + width / 2, p.top - 5.5, text, 10.5, "middle", "#ffffff", bold=True))
    return out


LEGEND = [("bar", "lease, valid"), ("past", "held past its lease end"), ("released", "released"),
          ("accepted", "write accepted"), ("rejected", "write rejected"), ("stale", "STALE write accepted"),
          ("unanswered", "write, no answer"), ("refused", "acquire refused"), ("fault", "fault (F1, F2, …)"),
          ("overlap", "two holders at once")]


def legend_svg() -> bytes:
    """The legend: every shape the timelines use, with its meaning, in two rows of five."""
    width, row, column = 860.0, 24.0, 172.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_n(width)}" height="{_n(row * 2 + 8)}" '
           f'viewBox="0 0 {_n(width)} {_n(row * 2 + 8)}" font-family="{FONT}">', DEFS,
           f'<rect width="{_n(width)}" height="{_n(row * 2 + 8)}" fill="#ffffff"/>']
    for i, (kind, label) in enumerate(LEGEND):
        x, y = 10 + (i % 5) * column, 4 + row * (i // 5) + row / 2
        if kind in ("bar", "past", "overlap"):
            fill = {"bar": f'fill="{BLUE}" stroke="#22456B"', "past": f'fill="url(#hatch)" stroke="{DARK_RED}"',
                    "overlap": f'fill="{YELLOW}" fill-opacity="0.28"'}[kind]
            out.append(f'<rect x="{_n(x)}" y="{_n(y - 6)}" width="20" height="12" {fill}/>')
        elif kind == "fault":
            out.append(f'<line x1="{_n(x)}" y1="{_n(y)}" x2="{_n(x + 20)}" y2="{_n(y)}" stroke="{PURPLE}" '
                       'stroke-width="1.3" stroke-dasharray="5 2.5"/>')
        else:
            out.append(_marker(kind, x + 10, y))
        out.append(_text(x + 27, y, label, 11, "start", "#222222", baseline="central"))
    out.append("</svg>")
    return "".join(out).encode("utf-8")
