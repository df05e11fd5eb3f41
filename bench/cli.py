"""`python -m bench`: start the servers, run every workload for every contender and the watchdog section, print
the report."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict

from . import events_report, latency_report, report, targets, watchdog_report
from .burst import BurstRun, burst_checks, burst_section, burst_table
from .contenders import ONE_REDIS, REGISTRY, Contender, Need, Target
from .durability import DurabilityResult, durability_section, durability_table
from .events import EventsResult, events_section
from .front_ends import FrontEnd, front_ends_section, front_ends_table
from .placement import placements
from .services import Services, Unavailable
from .watchdog import WatchdogSection, watchdog_section
from .watchdog import chosen as watchdog_runs
from .workload import Contended, ContendedParams, ContendedRun, Uncontended, contended_run, summarise, uncontended


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="smaller counts (under 30 s): a smoke run, noisier")
    p.add_argument("--json", metavar="PATH", help="also write every result to PATH")
    p.add_argument("--only", metavar="NAMES",
                   help=f"comma-separated contenders, groups or sections to run (default: all). Groups: "
                        f"{', '.join(GROUPS)} (e.g. '--only redlock,fencelock' for the Redlock rows and the "
                        f"single-node fencelock their target compares with). Sections: {', '.join(SECTIONS)} "
                        "(watchdog: 10,000 renewed leases in a process of their own: CPU, round trips, losses, exit; "
                        "durability: the cycle per durability mode, on servers of its own; burst: thousands of "
                        "concurrent calls through one client on every backend). "
                        f"Contenders: {', '.join(REGISTRY)}")
    p.add_argument("--rounds", type=int, help="uncontended rounds per placement (default 10; quick 4)")
    p.add_argument("--cycles", type=int, help="uncontended cycles per round (default 1000; quick 400)")
    p.add_argument("--duration", type=float, help="contended seconds per run (default 5; quick 2)")
    p.add_argument("--runs", type=int,
                   help="contended runs per contender, in order A B C, then C B A, ... (default 4; quick 1); "
                        "the Redlock rows make at most 2 (the 3-node anchors 1)")
    p.add_argument("--workers", type=int, default=8, help="contended worker processes (default 8)")
    p.add_argument("--skip-contended", action="store_true",
                   help="run the uncontended workload only (a section that --only names still runs)")
    p.add_argument("--watchdog-window", type=float, metavar="SECONDS",
                   help="watchdog section: seconds measured after the acquisition phase (default 10; quick 4, "
                        "and --quick leaves the ttl=30 run out)")
    p.add_argument("--watchdog-leases", type=int, metavar="N", help="watchdog section: leases held (default 10000)")
    p.add_argument("--burst", type=int, nargs=3, metavar=("TASKS", "WAITERS", "THREADS"),
                   help="burst section: concurrent asyncio tasks on distinct names, tasks waiting on one name, "
                        "threads on distinct names, each through one client (default 2000 1000 200; quick "
                        "500 200 50)")
    p.add_argument("--latency", type=float, default=0.0, metavar="MS",
                   help="put a delay proxy of MS milliseconds each way in front of every server, so that each node "
                        "behaves as a host of its own on a LAN (the latency targets are stated for 0.5)")
    p.add_argument("--strict", action="store_true", help="exit with status 1 if a target FAILs")
    return p


def _progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


GROUPS = ("single", "redlock", "etcd", "zookeeper")
"""What `--only` accepts besides contender keys: every row of one group (`Contender.group`)."""

SECTIONS = ("watchdog", "events", "durability", "burst", "front_ends")
"""What `--only` also accepts: a section that is not a row of the contender tables (run only when named, or when
`--only` is not given)."""


def _chosen(only: str | None) -> tuple[list[Contender], set[str]]:
    """The contenders and the sections to run."""
    if not only:
        return list(REGISTRY.values()), set(SECTIONS)
    keys = [k.strip() for k in only.split(",") if k.strip()]
    unknown = [k for k in keys if k not in REGISTRY and k not in GROUPS and k not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown contender(s) {', '.join(unknown)}; known: groups {', '.join(GROUPS)}, "
                         f"sections {', '.join(SECTIONS)}, contenders {', '.join(REGISTRY)}")
    return [c for k, c in REGISTRY.items() if k in keys or c.group in keys], {k for k in keys if k in SECTIONS}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quick: bool = args.quick
    rounds: int = args.rounds or (4 if quick else 10)
    cycles: int = args.cycles or (400 if quick else 1000)
    runs: int = args.runs or (1 if quick else 4)
    warmup = max(100, cycles // 4)
    places = placements()
    params = ContendedParams(workers=args.workers, duration=args.duration or (2.0 if quick else 5.0))
    watchdog_params = watchdog_runs(quick=quick, window=args.watchdog_window, leases=args.watchdog_leases)
    began = time.monotonic()

    skipped: dict[str, str] = {}
    contenders, sections = _chosen(args.only)
    if args.skip_contended and not args.only:
        sections = set()
    if args.latency < 0:
        raise SystemExit("--latency must be at least 0")
    with Services(latency_ms=args.latency) as services:
        rows: list[tuple[Contender, Target]] = []
        for contender in contenders:
            try:
                rows.append((contender, services.target(contender.need)))
            except Unavailable as exc:
                skipped[contender.key] = str(exc)
                _progress(f"skipping {contender.label}: {exc}")
        watchdog_target: Target | None = None
        if "watchdog" in sections:
            try:
                watchdog_target = services.target(ONE_REDIS)
            except Unavailable as exc:
                skipped["watchdog"] = str(exc)
                _progress(f"skipping the watchdog section: {exc}")
        urls = {url for _, t in rows for url in t.urls} | set(watchdog_target.urls if watchdog_target else ())
        _progress(f"server(s) up: {', '.join(sorted(urls))}")
        rtt_ms = services.round_trip_ms() if args.latency > 0 else None

        unc: dict[str, dict[str, Uncontended]] = {}
        if any(c.uncontended for c, _ in rows):
            unc = uncontended(
                [(c, t) for c, t in rows if c.uncontended], places=places, server_pids=services.server_pids(),
                rounds=rounds, cycles=cycles, warmup=warmup, proxy_pids=services.proxy_pids(),
                progress=_progress)
        con: dict[str, Contended] = {}
        if not args.skip_contended and any(c.contended for c, _ in rows):
            order = [(c, t) for c, t in rows if c.contended]
            done: dict[str, list[ContendedRun]] = {c.key: [] for c, _ in order}
            for index in range(runs):
                # A B C, then C B A: a drift of the machine during the run hits every row alike. A row with a
                # cap on its runs (the slow Redlock rows) takes part in the first ones only.
                now = [(c, t) for c, t in order if c.runs is None or index < c.runs]
                for c, t in now if index % 2 == 0 else reversed(now):
                    done[c.key].append(contended_run(c, t, params, progress=_progress, run=index))
            con = {key: summarise(key, params, found) for key, found in done.items()}
        watchdog: WatchdogSection | None = None
        if watchdog_target is not None:
            # Last: its processes end holding their leases (they expire by TTL on the single-node server, and
            # leave their fence keys), so nothing they leave behind weighs on another row.
            watchdog = watchdog_section(watchdog_target.url, watchdog_params,
                                        server_pid=services.pid(watchdog_target.url), quick=quick,
                                        progress=_progress)
        events: EventsResult | None = events_section() if "events" in sections else None
        durable: DurabilityResult | None = (durability_section(quick, _progress) if "durability" in sections
                                            else None)
        fronts: list[FrontEnd] | None = (front_ends_section(quick, _progress) if "front_ends" in sections
                                         else None)
        burst: list[BurstRun] | None = None
        if "burst" in sections:
            tasks, waiters, threads = args.burst or ((500, 200, 50) if quick else (2000, 1000, 200))
            found: list[tuple[str, str | list[str]]] = []
            for label, need in (("redis", ONE_REDIS), ("redlock x3", Need("redlock", 3)), ("etcd", Need("etcd")),
                                ("zookeeper", Need("zookeeper"))):
                try:
                    where = services.target(need)
                except Unavailable as exc:
                    skipped[f"burst {label}"] = str(exc)
                    continue
                found.append((label, list(where.urls) if len(where.urls) > 1 else where.url))
            burst = burst_section(found, tasks=tasks, waiters=waiters, threads=threads, progress=_progress)
        machine = report.machine(services.describe())
        delays = services.proxy_stats() if args.latency > 0 else []
    wall = time.monotonic() - began

    items = targets.checks(unc, [p.name for p in places], con)
    if args.latency > 0:
        items += latency_report.latency_checks(unc, [p.name for p in places], con, rtt_ms)
    if watchdog is not None:
        items += watchdog_report.watchdog_checks(watchdog)
    if burst is not None:
        items += burst_checks(burst)
    if events is not None:
        items += events_report.events_checks(events, unc, [p.name for p in places])
    print()
    print("fencelock benchmark" + (" (--quick: smaller counts, noisier)" if quick else ""))
    print()
    for key, value in machine.items():
        print(f"  {key + ':':<19} {value}")
    print()
    if args.latency > 0:
        print(latency_report.latency_table(args.latency, rtt_ms, delays))
        print()
    if unc:
        print(report.uncontended_table(unc, places, rounds))
        print()
        if args.latency > 0 and rtt_ms is not None:
            print(latency_report.latency_breakdown_table(unc, places, rtt_ms))
            print()
    if con:
        print(report.contended_table(con))
        print()
    if watchdog is not None:
        print(watchdog_report.watchdog_table(watchdog))
        print()
    if events is not None:
        print(events_report.events_table(events))
        print()
    if burst is not None:
        print(burst_table(burst))
        print()
    if fronts is not None:
        print(front_ends_table(fronts))
        print()
    if durable is not None:
        print(durability_table(durable))
        print()
    print(report.checks_table(items))
    for key, why in skipped.items():
        print(f"\nskipped {key}: {why}")
    errors = [(key, e) for key, result in con.items() for e in result.errors]
    if watchdog is not None:
        errors += [("watchdog", e) for e in watchdog.errors]
    for key, error in errors:
        print(f"\nerror in {key}: {error}")
    print(f"\nwall time {wall:.1f} s; the 'anchors.md' columns are another run (redis-py 5.3), for reference only")

    if args.json:
        config = {"quick": quick, "latency_ms": args.latency,
                  "uncontended": {"rounds": rounds, "cycles": cycles, "warmup": warmup,
                                  "placements": {p.name: p.description for p in places}},
                  "contended": {"runs": runs, "workers": params.workers, "duration": params.duration,
                                "hold": params.hold, "pause": params.pause, "wait": params.wait},
                  "watchdog": [asdict(p) for p in watchdog_params] if watchdog is not None else None}
        report.write_json(args.json, machine_info=machine, config=config, unc=unc, con=con, items=items,
                          skipped=skipped, wall_s=wall, watchdog=watchdog)
        print(f"results written to {args.json}")
    failed = any(c.ok is False for c in items) or bool(errors)
    return 1 if (args.strict and failed) else 0
