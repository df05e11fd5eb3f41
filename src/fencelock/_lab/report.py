"""The lab's HTML report: the verdict matrix and one timeline picture per cell, in one self-contained file.

`write_report(results, out_dir)` writes `out_dir/index.html` and returns its path; `check_results` checks the
schema first. The parts: `timeline` (events to a picture's model), `svg` (pictures), `words`, `page` (HTML).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .page import VERDICTS, page
from .timeline import Lease, Mark, Timeline, Write, busy_window, timeline
from .words import describe

__all__ = ["Lease", "Mark", "Timeline", "Write", "busy_window", "check_results", "describe", "timeline",
           "write_report"]

EXPECTATIONS = ("SAFE", "UNSAFE")
KINDS = ("acquire", "read", "write", "release", "lost", "fault", "expire")
COUNT_KEYS = ("overlaps", "stale_accepted", "stale_rejected", "lost_updates", "writes", "faults")


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



def write_report(results: dict[str, Any], out_dir: Path) -> Path:
    """Write `out_dir/index.html` for the lab's `results` (the schema of issue 7) and return its path.

    Raises TypeError/ValueError naming the field when `results` does not follow the schema (nothing is written),
    and OSError when `out_dir` cannot be written.
    """
    check_results(results)
    if not isinstance(out_dir, (str, os.PathLike)):
        raise TypeError(f"out_dir must be a path, got {type(out_dir).__name__}")
    out_dir = Path(out_dir)
    text = page(results)                                      # fail before anything is created
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / "index.html"
    partial = out_dir / ".index.html.partial"
    partial.write_text(text, encoding="utf-8")
    partial.replace(target)
    return target
