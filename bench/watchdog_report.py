"""The watchdog section's table and checks: 10,000 renewed leases in a process of their own (CPU, round trips,
losses, exit)."""

from __future__ import annotations

import math

import fencelock

from . import stats
from .report import Check, _ms, _num, _pct, _table
from .watchdog import WatchdogResult, WatchdogSection

WATCHDOG_CPU_TARGET = 0.05
"""The watchdog with 10,000 leases renewed every second: the client process's CPU, as a share of one core, must
stay below this."""

WATCHDOG_CALLS_TARGET = 1.0
"""... and it must make at most this many renewal script calls per 100 leases renewed."""

WATCHDOG_EXIT_LIMIT = 1.0
"""Seconds: a process that ends holding renewed leases must be gone within this (the leases must not keep it
alive; a non-daemon watchdog thread would hold it until killed)."""


def _watchdog_column(r: WatchdogResult) -> list[str]:
    if r.error is not None:
        return ["error (see below)"] + [""] * 19
    p = r.params
    sizes = sorted(b.leases for b in r.batches)
    rtts_ms = [b.rtt_s * 1e3 for b in r.batches]
    rest = r.cpu_s - (r.timer_cpu_s or 0.0) - (r.batch_cpu_s or 0.0)
    per_renewal = r.cpu_s / r.renewals * 1e6 if r.renewals else math.nan
    return [
        f"{p.renew_every:g} s",
        f"{r.acquire_s:.1f} s ({p.leases / r.acquire_s:,.0f}/s)" if r.acquire_s > 0 else "-",
        f"{r.window_s:.1f} s",
        f"{r.renewals:,} ({r.expected_renewals:,.0f})",
        _pct(r.cpu_share),
        _pct(r.share(r.timer_cpu_s)),
        _pct(r.share(r.batch_cpu_s)),
        _pct(r.share(rest)) if r.timer_cpu_s is not None and r.batch_cpu_s is not None else "-",
        _num(per_renewal, 1),
        _pct(r.share(r.server_cpu_s)),
        f"{r.script_calls:,}",
        _num(r.calls_per_100, 3),
        f"{r.round_trips:,}" if r.batches_seen else "-",
        _num(r.trips_per_100, 3),
        f"{stats.median(sizes):,.0f} ({sizes[0]:,}-{sizes[-1]:,})" if sizes else "-",
        f"{_num(stats.percentile(rtts_ms, 50), 1)} / {_num(max(rtts_ms, default=math.nan), 1)} ms",
        f"{min((b.margin_s for b in r.batches), default=math.nan):.2f} s" if r.batches else "-",
        _flush_batch(r),
        f"{r.lost} ({r.lost_events}; {r.lost_at_end})",
        _ms(r.exit_s) if r.exit_s is not None else "did not exit (killed)",
    ]


def _flush_batch(r: WatchdogResult) -> str:
    b = r.flush_batch
    if b is None:
        return "not measured" if r.params.flush else "-"
    return f"{b.leases:,} leases, {b.calls} calls, {b.rtt_s * 1e3:.0f} ms"


def watchdog_table(section: WatchdogSection) -> str:
    """One column per run (TTL), one row per figure."""
    if not section.runs:
        return "Renewal watchdog: nothing measured"
    labels = [
        "renewed every (ttl/3)",
        "acquisition phase (one after another)",
        "window (measured over it only)",
        "leases renewed in the window (expected)",
        "client process CPU, share of one core",
        "  watchdog timer thread",
        "  batch threads (send, apply answers)",
        "  the rest (GC, main thread, interpreter)",
        "  client CPU per lease renewed, us",
        "server CPU, share of one core",
        "renewal script calls (one per <= 100 leases)",
        "  per 100 leases renewed",
        "round trips: batches, one pipeline each",
        "  per 100 leases renewed",
        "leases per batch: median (min-max)",
        "batch round trip: p50 / max",
        "least validity left when a renewal was sent",
        "next batch after SCRIPT FLUSH",
        "leases lost (on_lost calls; lease.lost at end)",
        "exit after main ends, holding every lease",
    ]
    columns = [_watchdog_column(r) for r in section.runs]
    rows = [[label, *(column[i] for column in columns)] for i, label in enumerate(labels)]
    header = ["", *(f"ttl {r.params.ttl:g} s" for r in section.runs)]
    leases = max(r.params.leases for r in section.runs)
    lines = [f"Renewal watchdog: {leases:,} leases on distinct names, acquire(wait=0, renew=True), one client, one "
             "Redis; each TTL in a process of its own (spawn), measured over the window after the acquisition phase",
             "", _table(header, rows, "l" + "r" * len(section.runs)), ""]
    lines.append("round trips: on a single Redis every script call of one batch travels in one pipeline; batch "
                 "round trip = wall time of one extend_many call")
    lines.append("SCRIPT FLUSH (after the window; what a restart or failover does): every call of the next batch "
                 "meets NOSCRIPT and is sent again, one after another")
    lines.append("exit: from the end of the process's main function (no release, no close) until the process was "
                 "gone; a process holding nothing: " + _ms(section.exit_baseline_s))
    lines += section.left_out
    return "\n".join(lines)


def watchdog_checks(section: WatchdogSection) -> list[Check]:
    out: list[Check] = []
    for r in section.runs:
        # The CPU target is judged with the library's default TTL (30 s: renewals every 10 s), which is what
        # keeping 10,000 leases alive costs by default; shorter TTLs renew more often and are shown for information.
        judged_cpu = r.params.ttl == fencelock.DEFAULT_TTL
        what = f"watchdog, {r.params.leases:,} leases, ttl {r.params.ttl:g} s"
        if r.error is not None:
            out.append(Check(f"{what}: error (see below)", "-", "-", False))
            continue
        cpu_target = f"< {WATCHDOG_CPU_TARGET * 100:g} %"
        out.append(Check(f"{what}: client process CPU, share of one core", _pct(r.cpu_share),
                         cpu_target if judged_cpu else "-",
                         (r.cpu_share < WATCHDOG_CPU_TARGET) if judged_cpu else None))
        # The issue counts round trips: on one Redis every script call of a tick travels in one pipeline.
        out.append(Check(f"{what}: renewal round trips (pipelines) per 100 leases renewed", _num(r.trips_per_100, 3),
                         f"<= {WATCHDOG_CALLS_TARGET:g}", r.trips_per_100 <= WATCHDOG_CALLS_TARGET))
        out.append(Check(f"{what}: renewal script calls per 100 leases renewed", _num(r.calls_per_100, 3),
                         "- (<= 100 leases each)", None))
    measured = [r for r in section.runs if r.error is None]
    if measured:
        lost = sum(r.lost for r in measured)
        out.append(Check(f"watchdog: leases lost, every run ({len(measured)})", str(lost), "0", lost == 0))
        exits = [r.exit_s for r in measured]
        slowest = None if None in exits else max(e for e in exits if e is not None)
        out.append(Check("watchdog: exit after main ends, holding the leases (slowest run)",
                         _ms(slowest) if slowest is not None else "did not exit",
                         f"< {WATCHDOG_EXIT_LIMIT:g} s", slowest is not None and slowest < WATCHDOG_EXIT_LIMIT))
    return out
