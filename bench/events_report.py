"""The observability section: what one `fencelock._events.emit()` costs, with nobody listening and with one
subscriber, and the share of a lock cycle it takes against its target."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .events import EMITS_PER_CYCLE, EventsResult
from .report import Check, _table
from .workload import Uncontended

EVENTS_SHARE_TARGET = 0.01
"""Observability with nobody listening (and the otel extra without an SDK) costs under 1 % of a lock cycle."""


def events_table(result: EventsResult) -> str:
    rows = [["nobody listens" + (" (opentelemetry-api present, no SDK)" if result.otel_api and
                                 not result.otel_configured else ""), f"{result.idle_ns:.0f} ns"],
            ["one subscriber (an event is built and delivered)", f"{result.subscribed_ns:.0f} ns"]]
    return ("Observability: the cost of one fencelock._events.emit() call\n\n"
            + _table(["listening", "per emit"], rows, "lr"))


def events_checks(result: EventsResult, unc: Mapping[str, Mapping[str, Uncontended]],
                  places: Sequence[str]) -> list[Check]:
    cycle = unc.get(places[0], {}).get("fencelock") if places else None
    cost_us = result.idle_ns * EMITS_PER_CYCLE / 1000.0
    if cycle is None:
        return [Check(f"events: {EMITS_PER_CYCLE} emits per cycle with nobody listening", f"{cost_us:.2f} us",
                      "- (run with the fencelock row for the share of a cycle)", None)]
    share = cost_us / cycle.median_us
    return [Check(f"events: {EMITS_PER_CYCLE} emits with nobody listening / fencelock's cycle "
                  f"({cycle.median_us:.0f} us)", f"{share * 100:.3f} %", f"< {EVENTS_SHARE_TARGET * 100:g} %",
                  share < EVENTS_SHARE_TARGET)]
