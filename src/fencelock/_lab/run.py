"""Run the lab: every scenario on every configuration, judged from the recorded history; table, JSON, report."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from .catalog import SCENARIOS
from .configs import CONFIGS, Config
from .history import Counts, Judgement, Verdict, combine, judge
from .report import write_report
from .scenarios import Cell, Lab, Scenario, Skip, fenced_only
from .table import table

__all__ = ["build_report", "main", "parse", "rerun_command", "run", "run_cell", "table", "write_results"]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

USAGE = "fencelock lab [--quick] [--repeat N] [--seed N] [--out DIR] [--json] [--scenarios 1,5a] [--configs redis]"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fencelock lab", description=(
        "Run the classic lock failures against real servers, real worker processes and real faults, check the "
        "recorded history, and show which configurations keep the resource safe."))
    p.add_argument("--quick", action="store_true", help="short TTLs, one run per cell (under 2 minutes)")
    p.add_argument("--repeat", type=int, default=None, metavar="N",
                   help="runs per cell (default: 1 with --quick, 4 otherwise)")
    p.add_argument("--seed", type=int, default=None, help="seed for the timing jitter and names (default: random)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="where results.json and the report go (default: a new folder under ./out/lab/)")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout (progress on stderr)")
    p.add_argument("--scenarios", default=None, metavar="IDS", help="only these scenarios, e.g. 1,3,5a")
    p.add_argument("--configs", default=None, metavar="IDS", help="only these configurations, e.g. redis,redlock")
    args = p.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 4
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args


def _pick(items: list[Any], ids: str | None, what: str) -> list[Any]:
    if ids is None:
        return items
    wanted = [x.strip() for x in ids.split(",") if x.strip()]
    known = {item.id: item for item in items}
    unknown = [x for x in wanted if x not in known]
    if unknown:
        raise SystemExit(f"fencelock lab: unknown {what} {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[x] for x in wanted]


def rerun_command(args: argparse.Namespace, seed: int, executable: str | None = None) -> str:
    """The shell command that repeats this run, from any directory, with the Python that ran it."""
    shown = os.path.abspath(executable or sys.executable)            # not resolved: a venv's python stays itself
    words = [shown, "-m", "fencelock._lab", *(["--quick"] if args.quick else []), "--seed", str(seed)]
    if args.repeat != (1 if args.quick else 4):
        words += ["--repeat", str(args.repeat)]
    for flag, ids in (("--scenarios", args.scenarios), ("--configs", args.configs)):
        if ids is not None:
            words += [flag, ",".join(x.strip() for x in ids.split(",") if x.strip())]
    return shlex.join(words)


def run_cell(lab: Lab, config: Config, scenario: Scenario, runs: int, seed: int) -> dict[str, Any]:
    applies = config.kind in scenario.kinds
    # The literature's prediction; where the fault does not exist for this kind of service there is none, and
    # the field (which must say SAFE or UNSAFE) says what a fence alone predicts, with "applies": false.
    expected = scenario.expect(config) if applies else fenced_only(config)
    # Where fencelock does better than the literature predicts, it is held to SAFE, and the cell says why.
    beyond = scenario.beyond(config) if applies else None
    wanted = "SAFE" if beyond else expected
    cell_out: dict[str, Any] = {"scenario": scenario.id, "config": config.id, "runs": 0, "verdict": "SKIPPED",
                                "expected": expected, "matches_expectation": True, "note": "",
                                "counts": Counts().to_json(), "events": [], "verdicts": [], "applies": applies}
    if beyond:
        cell_out["beyond"] = beyond
    # Where the literature's prediction holds because a stated assumption of fencelock's does not, the cell says so.
    boundary = scenario.boundary(config) if applies else None
    if boundary:
        cell_out["boundary"] = boundary
    available, why = config.availability()
    if not available:
        cell_out.update(note=f"{config.id} is not available here: {why}", unavailable=True)
        return cell_out
    skip = scenario.skip_reason(config)
    if skip is not None:
        if IN_CI and skip.startswith("libfaketime"):  # a tool the machine lacks is an error in CI
            cell_out.update(verdict="ERROR", matches_expectation=False, note=f"CI must run this cell: {skip}")
        else:
            cell_out["note"] = skip
        return cell_out
    verdicts: list[Verdict] = []
    total = Counts()
    notes: list[str] = []
    for i in range(runs):
        rng = random.Random(f"{seed}:{scenario.id}:{config.id}:{i}")
        cell = Cell(lab, config, scenario, rng)
        judgement: Judgement | None = None
        try:
            scenario.run(cell)
            judgement = judge(cell.events(), scenario.evidence)
        except Skip as exc:
            cell_out["note"] = str(exc)
            cell.close()
            return cell_out
        except Exception as exc:
            verdicts.append("ERROR")
            notes.append(f"run {i + 1}: {type(exc).__name__}: {exc}")
        finally:
            events = cell.events()
            # t = 0 is the first recorded event, a moment after the cell's servers were ready
            origin = min([e.t for e in events], default=cell.started) - 0.05
            if i == 0:
                cell_out["events"] = [e.to_json(origin) for e in events]
            try:
                cell.close()
            except Exception as exc:
                notes.append(f"run {i + 1}: cleanup failed: {type(exc).__name__}: {exc}")
        if judgement is not None:
            verdicts.append(judgement.verdict)
            total.add(judgement.counts)
            if judgement.reasons and (i == 0 or judgement.verdict != verdicts[0]):
                notes.append("; ".join(judgement.reasons))
    verdict = combine(verdicts)
    tally = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts)) if runs > 1 else ""
    note = "; ".join(dict.fromkeys(notes))
    if tally:
        note = f"{tally}. {note}" if note else tally
    cell_out.update(runs=runs, verdict=verdict, counts=total.to_json(), note=note, verdicts=verdicts,
                    matches_expectation=verdict == wanted)
    return cell_out


def _describe(cell: dict[str, Any]) -> str:
    c = cell["counts"]
    if cell["verdict"] == "SKIPPED":
        return "SKIPPED (configuration not available here)" if cell.get("unavailable") else \
            f"SKIPPED ({cell['note']})"
    text = (f"{cell['verdict']}: {c['stale_accepted']} stale accepted, {c['stale_rejected']} rejected, "
            f"{c['lost_updates']} lost updates, {c['overlaps']} overlaps")
    if not cell["matches_expectation"]:
        text += f"  [expected {cell['expected']}]"
    return text


def run(args: argparse.Namespace, progress: TextIO) -> dict[str, Any]:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    configs = _pick(CONFIGS, args.configs, "configuration")
    scenarios = _pick(SCENARIOS, args.scenarios, "scenario")
    started_wall = datetime.datetime.now(datetime.timezone.utc)
    started = time.monotonic()
    results: dict[str, Any] = {
        "version": 1, "seed": seed, "quick": bool(args.quick), "started": started_wall.isoformat(),
        "duration_s": 0.0, "repeat": args.repeat, "command": rerun_command(args, seed),
        "configs": [], "scenarios": [], "cells": [],
    }
    for c in configs:
        ok, why = c.availability()
        results["configs"].append({"id": c.id, "title": c.title, "available": ok, "why_unavailable": why,
                                   "fenced": c.fenced, "kind": c.kind})
        if not ok:
            results["configs"][-1]["how_to_add"] = "Install what it names, then run the lab again."
    for s in scenarios:
        results["scenarios"].append({"id": s.id, "number": s.number, "title": s.title, "fault": s.fault,
                                     "source": s.source, "evidence": s.evidence})
    lab = Lab(quick=args.quick, seed=seed)
    total = len(configs) * len(scenarios)
    print(f"fencelock lab: {len(scenarios)} scenarios x {len(configs)} configurations, "
          f"{args.repeat} run(s) each, seed {seed}", file=progress, flush=True)
    try:
        lab.pool.fill()
        n = 0
        for s in scenarios:
            for c in configs:
                n += 1
                t0 = time.monotonic()
                cell = run_cell(lab, c, s, args.repeat, seed)
                cell["duration_s"] = round(time.monotonic() - t0, 3)
                results["cells"].append(cell)
                print(f"[{n:>2}/{total}] {s.id:<3} {c.id:<16} {_describe(cell)}  ({cell['duration_s']:.1f} s)",
                      file=progress, flush=True)
    finally:
        lab.close()
    results["duration_s"] = round(time.monotonic() - started, 3)
    return results


def write_results(results: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    return path


def build_report(results: dict[str, Any], out: Path) -> tuple[Path | None, str]:
    """Write the HTML report; returns (its path, "") or (None, why it could not be written)."""
    try:
        return write_report(results, out), ""
    except (OSError, TypeError, ValueError) as exc:
        return None, f"could not write the report in {out}: {type(exc).__name__}: {exc}"


def main(argv: list[str]) -> int:
    try:
        args = parse(argv)
    except SystemExit as exc:  # --help, or a usage error argparse has already explained
        return exc.code if isinstance(exc.code, int) else 2
    out = args.out
    if out is None:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path("out") / "lab" / stamp
        k = 1
        while out.exists():
            k += 1
            out = Path("out") / "lab" / f"{stamp}-{k}"
    progress = sys.stderr if args.json else sys.stdout
    unwritable = _unwritable(out)
    if unwritable is not None:                                     # say so before minutes of running
        print(f"fencelock lab: cannot write the results and report to {out}: {unwritable}", file=sys.stderr)
        return 2
    try:
        results = run(args, progress)
    except SystemExit as exc:  # an unknown scenario or configuration id
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            return 2
        raise
    try:
        path: Path | None = write_results(results, out)
    except OSError as exc:
        path = None
        failed = f"fencelock lab: could not write {out / 'results.json'}: {exc}"
    report, message = build_report(results, out) if path is not None else (None, "")
    if args.json:
        sys.stdout.write(json.dumps(results) + "\n")
    else:
        print()
        print(table(results))
        print()
    if path is None:
        print(failed, file=sys.stderr)
        return 1
    print(f"results: {path.resolve()} ({results['duration_s']:.0f} s)", file=progress)
    if report is None:
        print(f"fencelock lab: {message}", file=sys.stderr)
        return 1
    print(f"report: {report.resolve()}", file=progress)
    bad = [c for c in results["cells"] if c["verdict"] == "ERROR"]
    return 1 if bad else 0


def _unwritable(out: Path) -> str | None:
    """Why `out` cannot take the results and the report (None: it can); creates it if it is missing."""
    if out.exists() and not out.is_dir():
        return "it is not a directory"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    if not out.is_dir():
        return "it is not a directory"
    if not os.access(out, os.W_OK | os.X_OK):
        return "it is not writable"
    return None
