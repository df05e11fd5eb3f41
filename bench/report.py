"""What gets printed and written: the machine, the tables, a check and its verdict (`Check`, the table of checks)
and the JSON file. The ratios judged against their targets are in `targets.py`."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

import fencelock

from .contenders import REGISTRY, Contender
from .placement import Placement
from .watchdog import WatchdogSection
from .workload import Contended, Uncontended

# ----------------------------------------------------------------------------------------------------- machine

def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def machine(server: Mapping[str, str]) -> dict[str, str]:
    import redis


    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cores": f"{os.cpu_count()} ({usable} usable), {_cpu_model()}",
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        "fencelock": fencelock.__version__,
        "redis-py": redis.__version__,
        "python-redis-lock": _version("python-redis-lock"),
        "pottery": _version("pottery"),
        "redlock-ng": _version("redlock-ng"),
        "kazoo": _version("kazoo"),
        **server,
    }


# ------------------------------------------------------------------------------------------------------ tables

def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    """A plain-text table; `align` has one 'l' or 'r' per column."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) if a == "l" else cell.rjust(w)
                         for cell, w, a in zip(cells, widths, align, strict=True)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def _ratio(value: float | None, digits: int = 2) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}x"


def floor_of(contender: Contender) -> str | None:
    """The key of the floor a row is measured against: the synchronous floor with the same need (one node: SET NX
    PX + EVALSHA by hand; Redlock over n nodes: the same to every node at once, by hand)."""
    for key, other in REGISTRY.items():
        if other.role == "floor" and other.need == contender.need and other.make is not None:
            return key
    return None


def uncontended_table(results: Mapping[str, Mapping[str, Uncontended]], places: Sequence[Placement],
                      rounds: int) -> str:
    """One row per contender; the first placement is the headline (min, max, reference), the others follow."""
    if not places or not results.get(places[0].name):
        return "Uncontended: nothing measured"
    head, *others = places

    def floor_us(place: Placement, contender: Contender) -> float:
        key = floor_of(contender)
        floor = results[place.name].get(key) if key is not None else None
        return floor.median_us if floor else math.nan

    rows = []
    for key, result in results[head.name].items():
        contender = REGISTRY[key]
        ref = contender.reference.uncontended_us
        floor_key = floor_of(contender)
        ref_floor = REGISTRY[floor_key].reference.uncontended_us if floor_key is not None else None
        ref_text = "-" if ref is None else f"{ref:.0f}" + (f" ({ref / ref_floor:.2f}x)" if ref_floor else "")
        row = [
            contender.label + (" (info)" if contender.role == "info" else ""),
            str(result.cycles),
            _num(result.median_us, 1),
            _num(min(result.rounds_us, default=math.nan), 1),
            _num(max(result.rounds_us, default=math.nan), 1),
            _ratio(result.median_us / floor_us(head, contender)),
        ]
        for place in others:
            other = results[place.name][key]
            row += [_num(other.median_us, 1), _ratio(other.median_us / floor_us(place, contender))]
        rows.append([*row, ref_text])
    header = ["contender", "cycles", f"{head.name} us", "min", "max", "vs floor"]
    for place in others:
        header += [f"{place.name} us", "vs floor"]
    header.append("anchors.md us (vs floor)")
    lines = [f"Uncontended acquire + release, microseconds per cycle (median of {rounds} interleaved rounds of "
             "'cycles' cycles each, after warm-up)", ""]
    lines.append(_table(header, rows, "lr" + "r" * (len(header) - 2)))
    lines.append("")
    lines += [f"{place.name}: {place.description}" + (" (targets are judged here)" if place is head else "")
              for place in places]
    if others:
        lines.append("min/max: fastest and slowest round of the first placement")
    lines.append("vs floor: against the floor with the same nodes (one node: the single-node floor; Redlock: the "
                 "Redlock floor by hand with as many nodes)")
    return "\n".join(lines)


def contended_table(results: Mapping[str, Contended]) -> str:
    if not results:
        return ""
    params = next(iter(results.values())).params
    rows = []
    for key, result in results.items():
        contender = REGISTRY[key]
        ref = contender.reference
        ref_text = "-" if ref.per_s is None else (
            f"{ref.per_s:.0f}/s, p99 {_num(ref.wait_p99_ms)} ms, max {_num(ref.longest_ms)} ms")
        workers = f"{min(result.per_worker)}-{max(result.per_worker)}" if result.per_worker else "-"
        spread = (f"{min(result.runs_per_s):.0f}-{max(result.runs_per_s):.0f}" if len(result.runs_per_s) > 1
                  else "-")
        rows.append([
            contender.label,
            str(result.runs),
            _num(result.per_s),
            spread,
            _num(result.wait_p50_ms, 1),
            _num(result.wait_p99_ms, 1),
            _num(result.longest_ms, 1),
            _num(result.gap_p50_ms, 2),
            _num(result.busy_fraction * 100),
            workers,
            str(result.timeouts),
            str(result.overlaps),
            ref_text,
        ])
    title = (f"Contended hand-off: {params.workers} processes, one name, hold {params.hold * 1e3:g} ms, "
             f"pause {params.pause * 1e3:g} ms, blocking acquire (wait <= {params.wait:g} s); "
             f"'runs' runs of {params.duration:g} s per contender, pooled")
    legend = ("acq/s per run = slowest-fastest run (the machine's run-to-run noise); wait = time in acquire (ms);\n"
              "gap = idle time between one holder's exit and the next holder's entry (ms); busy = share of the "
              "time some worker\nwas inside the critical section; per worker = fewest-most acquisitions of one "
              "worker in one run")
    table = _table(["contender", "runs", "acq/s", "per run", "wait p50", "wait p99", "longest", "gap p50", "busy %",
                    "per worker", "timeouts", "overlaps", "anchors.md"], rows, "lrrrrrrrrrrrl")
    return f"{title}\n\n{table}\n\n{legend}"


def _pct(share: float) -> str:
    return "-" if math.isnan(share) else f"{share * 100:.1f} %"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None or math.isnan(seconds) else f"{seconds * 1e3:.0f} ms"


# ------------------------------------------------------------------------------------------------------ checks

@dataclass(frozen=True)
class Check:
    what: str
    value: str
    target: str
    ok: bool | None  # None: information, no target

    @property
    def verdict(self) -> str:
        return "info" if self.ok is None else ("PASS" if self.ok else "FAIL")


def checks_table(items: Sequence[Check]) -> str:
    rows = [[c.what, c.value, c.target, c.verdict] for c in items]
    return "Ratios and targets\n\n" + _table(["", "value", "target", ""], rows, "lrll")


# -------------------------------------------------------------------------------------------------------- JSON

def _clean(value: Any) -> Any:
    """NaN -> null, recursively (JSON has no NaN)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: str, *, machine_info: Mapping[str, str], config: Mapping[str, Any],
               unc: Mapping[str, Mapping[str, Uncontended]], con: Mapping[str, Contended], items: Sequence[Check],
               skipped: Mapping[str, str], wall_s: float, watchdog: WatchdogSection | None = None) -> None:
    def contender(key: str) -> dict[str, Any]:
        c: Contender = REGISTRY[key]
        return {"label": c.label, "role": c.role, "need": str(c.need), "note": c.note,
                "cycles_scale": c.cycles_scale, "max_runs": c.runs, "anchors_md": asdict(c.reference)}

    doc = {
        "machine": dict(machine_info),
        "config": dict(config),
        "contenders": {key: contender(key) for key in REGISTRY if key in con or any(key in u for u in unc.values())},
        "uncontended": {place: {key: r.as_json() for key, r in found.items()} for place, found in unc.items()},
        "contended": {key: r.as_json() for key, r in con.items()},
        "watchdog": watchdog.as_json() if watchdog is not None else None,
        "checks": [{**asdict(c), "verdict": c.verdict} for c in items],
        "skipped": dict(skipped),
        "wall_s": wall_s,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_clean(doc), f, indent=2, sort_keys=False)
        f.write("\n")
