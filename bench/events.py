"""What observability costs a lock call: `fencelock._events.emit` timed with nobody listening (the default, also
with opentelemetry-api installed and no SDK configured) and with one subscriber, against a lock cycle."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from fencelock import _events

EMITS_PER_CYCLE = 4
"""Events one uncontended acquire + release emits: acquire, grant, release (and one spare for a wait)."""


@dataclass(frozen=True)
class EventsResult:
    otel_api: bool           # opentelemetry-api importable (the `otel` extra installed)
    otel_configured: bool    # an SDK is configured (then events are recorded)
    idle_ns: float           # one emit() with nobody listening
    subscribed_ns: float     # one emit() with one subscriber that does nothing


def _time_emits(n: int) -> float:
    emit = _events.emit
    began = time.perf_counter_ns()
    for _ in range(n):
        emit("grant", "bench:events", "redis", "acquire", fence=1, waited=0.0, duration=0.0)
    return (time.perf_counter_ns() - began) / n


def events_section(rounds: int = 5, n: int = 100_000) -> EventsResult:
    idle = statistics.median(_time_emits(n) for _ in range(rounds))
    unsubscribe = _events.subscribe(lambda event: None)
    try:
        subscribed = statistics.median(_time_emits(n) for _ in range(rounds))
    finally:
        unsubscribe()
    return EventsResult(_events._otel is not None, _events._otel_enabled(), idle, subscribed)
