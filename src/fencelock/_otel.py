"""fencelock's events as OpenTelemetry spans and metrics (the `otel` extra: opentelemetry-api only).

Spans `fencelock.acquire`, `fencelock.release` and `fencelock.extend` carry the lock name, backend, fence, wait and
outcome. Metrics: `fencelock.wait` and `fencelock.hold` histograms (seconds) and the counters `fencelock.grants`,
`fencelock.losses`, `fencelock.renewal_failures` and `fencelock.timeouts`, by backend (never by lock name: names
are unbounded). Until an SDK is configured, `configured()` is false and nothing is recorded.
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry import metrics, trace

from ._events import LockEvent
from ._version import __version__

_SPANS = {"acquire": "fencelock.acquire", "release": "fencelock.release", "extend": "fencelock.extend"}
_ENDS_A_CALL = {"grant", "busy", "timeout", "release", "extend", "failed", "lost", "cancelled"}
_COUNTERS = {"grant": "fencelock.grants", "lost": "fencelock.losses", "renewal_failed": "fencelock.renewal_failures",
             "timeout": "fencelock.timeouts"}
_PROXIES = ("ProxyTracerProvider", "_ProxyMeterProvider")


def _public_check() -> bool:
    return (type(trace.get_tracer_provider()).__name__ not in _PROXIES
            or type(metrics.get_meter_provider()).__name__ not in _PROXIES)


def _fast_check() -> bool:
    return _trace_module._TRACER_PROVIDER is not None or _metrics_module._METER_PROVIDER is not None


try:  # the API's own globals, read directly: its get_*_provider() costs microseconds per call (an environ look-up)
    import opentelemetry.trace as _trace_module
    from opentelemetry.metrics import _internal as _metrics_module

    _fast_check()
except (ImportError, AttributeError):  # another API version: the public (slower) check
    configured = _public_check
else:
    configured = _fast_check
    if {"OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER"} & set(os.environ):
        configured = _public_check  # a provider named in the environment is loaded on first use
configured.__doc__ = """True once an SDK (or any real provider) is set for traces or metrics."""


class _Instruments:
    def __init__(self, provider: Any) -> None:
        meter = provider.get_meter("fencelock", __version__)
        self.provider = provider
        self.wait = meter.create_histogram("fencelock.wait", unit="s", description="time an acquire waited")
        self.hold = meter.create_histogram("fencelock.hold", unit="s", description="time a lease was held")
        self.counters = {kind: meter.create_counter(metric, unit="1") for kind, metric in _COUNTERS.items()}


_instruments: _Instruments | None = None


def _meters() -> _Instruments:
    global _instruments
    provider = metrics.get_meter_provider()
    if _instruments is None or _instruments.provider is not provider:
        _instruments = _Instruments(provider)
    return _instruments


def record(event: LockEvent) -> None:
    """One event as a span (for the end of an acquire, release or extend) and as metrics."""
    attributes = {"fencelock.backend": event.backend}
    found = _meters()
    if event.kind in found.counters:
        found.counters[event.kind].add(1, attributes)
    if event.waited is not None and event.kind in ("grant", "busy", "timeout"):
        found.wait.record(event.waited, attributes)
    if event.held is not None:
        found.hold.record(event.held, attributes)
    span_name = _SPANS.get(event.op)
    if span_name is None or event.kind not in _ENDS_A_CALL or event.duration is None:
        return
    end = int(event.at * 1e9)
    span = trace.get_tracer("fencelock", __version__).start_span(
        span_name, start_time=end - int(event.duration * 1e9), kind=trace.SpanKind.CLIENT)
    span.set_attribute("fencelock.lock.name", event.name)
    span.set_attribute("fencelock.backend", event.backend)
    span.set_attribute("fencelock.outcome", event.kind)
    if event.fence is not None:
        span.set_attribute("fencelock.fence", event.fence)
    if event.waited is not None:
        span.set_attribute("fencelock.wait_s", event.waited)
    if event.kind in ("failed", "lost"):
        span.set_status(trace.Status(trace.StatusCode.ERROR, event.error or event.kind))
    span.end(end_time=end)
