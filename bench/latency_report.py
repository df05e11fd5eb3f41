"""Latency mode (`--latency MS`): what the delay proxies did, where a cycle's time goes, and the targets restated
against the physical limits (in round trips)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .contenders import REGISTRY
from .delay import DelayStats
from .placement import Placement
from .report import Check, _num, _pct, _ratio, _table
from .workload import Contended, Uncontended

LATENCY_TARGETS_AT_MS = 0.5
"""The one-way delay the latency targets are stated for."""
LATENCY_REDLOCK_CYCLE = 1.15     # Redlock 5-node uncontended cycle <= 1.15 x the single-node cycle
LATENCY_REDLOCK_VS_ANCHOR = 2.0  # ... and >= 2 x faster than the best Redlock anchor
LATENCY_SINGLE_PER_S = 1.3       # single node, contended: >= 1.3 x python-redis-lock's throughput
LATENCY_SINGLE_HANDOFF = 1.15    # ... hand-off <= 1.15 x one round trip
LATENCY_REDLOCK_PER_S = 2.0      # Redlock contended: >= 2 x the best anchor's throughput
LATENCY_REDLOCK_HANDOFF = 1.3    # ... hand-off <= 1.3 x 1.5 round trips


def latency_table(latency_ms: float, rtt_ms: float | None, stats: Sequence[DelayStats]) -> str:
    """What the delay proxies did: the delay asked, the round trip a client saw, how late they forwarded, CPU."""
    chunks = sum(s.chunks for s in stats)
    late50 = max((s.late_p50_ms for s in stats), default=0.0)
    late99 = max((s.late_p99_ms for s in stats), default=0.0)
    cpu = sum(s.cpu_s for s in stats)
    rows = [[f"{latency_ms:g} ms", _num(rtt_ms, 3) if rtt_ms is not None else "-", str(len(stats)), str(chunks),
             f"{latency_ms + late50:.3f} ms", f"{late99:.3f} ms", f"{cpu:.1f} s"]]
    table = _table(["delay asked (one way)", "PING round trip", "proxies", "chunks forwarded",
                    "one-way delay p50", "late p99 (worst proxy)", "proxy CPU (all)"], rows, "rrrrrrr")
    return (f"Latency mode: every client<->server connection passes a delay proxy of its own (bench/delay.py)\n\n"
            f"{table}\n\nlate = how long after its due time a chunk was forwarded (the proxy's own jitter)")


def latency_breakdown_table(unc: Mapping[str, Mapping[str, Uncontended]], places: Sequence[Placement],
                            rtt_ms: float) -> str:
    """Where an uncontended cycle's time goes with nodes as separate hosts: the limit (2 round trips: acquire and
    release), the time beyond it, and the CPU per cycle of the client, the servers and the delay proxies."""
    found = unc.get(places[0].name, {}) if places else {}
    limit_us = 2 * rtt_ms * 1000
    rows = []
    for key, r in found.items():
        beyond = r.median_us - limit_us
        client = r.client_cpu_median_us
        rows.append([REGISTRY[key].label, f"{r.median_us:.0f}", f"{limit_us:.0f}", f"{beyond:.0f}",
                     _num(client, 0), _pct(client / beyond) if beyond > 0 and not math.isnan(client) else "-",
                     _num(r.server_cpu_median_us, 0), _num(r.proxy_cpu_median_us, 0)])
    table = _table(["contender", "cycle us", "limit (2 RTT) us", "beyond the limit us", "client CPU us",
                    "client CPU / beyond", "servers CPU us", "proxies CPU us"], rows, "lrrrrrrr")
    return ("Latency mode: where an uncontended cycle's time goes (medians per cycle; CPU counted per process, "
            "every thread)\n\n" + table + "\n\nThe limit is two PING round trips through the proxies. Time beyond "
            "it is spent in the client (its CPU), waiting for a CPU (2 cores serve the client, the servers and the "
            "proxies), or on the servers beyond a PING; servers' and proxies' CPU overlap the network wait.")


def latency_checks(unc: Mapping[str, Mapping[str, Uncontended]], places: Sequence[str],
                   con: Mapping[str, Contended], rtt_ms: float | None) -> list[Check]:
    """The targets restated for nodes on separate hosts, against the physical limits (in round trips)."""
    out: list[Check] = []
    if rtt_ms is None:
        return out
    rtt = rtt_ms
    found = unc.get(places[0], {}) if places else {}
    single, rl5 = found.get("fencelock"), found.get("fencelock-rl5")
    if single is not None:
        out.append(Check("latency, uncontended: fencelock cycle / limit (2 RTT: acquire + release)",
                         f"{single.median_us / 1000:.3f} / {2 * rtt:.3f} ms", "- (physical limit)", None))
    if rl5 is not None:
        out.append(Check("latency, uncontended: fencelock-rl5 cycle / limit (2 RTT to the quorum's slowest)",
                         f"{rl5.median_us / 1000:.3f} / {2 * rtt:.3f} ms", "- (physical limit)", None))
        if single is not None:
            ratio = rl5.median_us / single.median_us
            out.append(Check("latency, uncontended: fencelock-rl5 / fencelock (time per cycle)", _ratio(ratio, 3),
                             f"<= {LATENCY_REDLOCK_CYCLE:.2f}x", ratio <= LATENCY_REDLOCK_CYCLE))
        anchors = [key for key in ("pottery-rl5", "redlock-ng-rl5") if key in found]
        if anchors:
            best = min(anchors, key=lambda key: found[key].median_us)
            ratio = found[best].median_us / rl5.median_us
            out.append(Check(f"latency, uncontended: best anchor ({best}) / fencelock-rl5 (times faster)",
                             _ratio(ratio, 3), f">= {LATENCY_REDLOCK_VS_ANCHOR:.2f}x",
                             ratio >= LATENCY_REDLOCK_VS_ANCHOR))
    cf, prl = con.get("fencelock"), con.get("python-redis-lock")
    if cf is not None:
        if prl is not None and prl.per_s:
            ratio = cf.per_s / prl.per_s
            out.append(Check("latency, contended: fencelock / python-redis-lock acquisitions/s", _ratio(ratio, 3),
                             f">= {LATENCY_SINGLE_PER_S:.2f}x", ratio >= LATENCY_SINGLE_PER_S))
        ratio = cf.gap_p50_ms / rtt
        out.append(Check(f"latency, contended: fencelock hand-off p50 / 1 RTT ({rtt:.3f} ms)", _ratio(ratio, 3),
                         f"<= {LATENCY_SINGLE_HANDOFF:.2f}x", ratio <= LATENCY_SINGLE_HANDOFF))
    cr = con.get("fencelock-rl5")
    if cr is not None:
        anchors = [key for key in ("pottery-rl5", "redlock-ng-rl5") if key in con]
        if anchors:
            best = max(anchors, key=lambda key: con[key].per_s)
            ratio = cr.per_s / con[best].per_s if con[best].per_s else math.nan
            out.append(Check(f"latency, contended: fencelock-rl5 / best anchor ({best}) acquisitions/s",
                             _ratio(ratio, 3), f">= {LATENCY_REDLOCK_PER_S:.2f}x", ratio >= LATENCY_REDLOCK_PER_S))
        ratio = cr.gap_p50_ms / (1.5 * rtt)
        out.append(Check(f"latency, contended: fencelock-rl5 hand-off p50 / 1.5 RTT ({1.5 * rtt:.3f} ms)",
                         _ratio(ratio, 3), f"<= {LATENCY_REDLOCK_HANDOFF:.2f}x", ratio <= LATENCY_REDLOCK_HANDOFF))
    return out
