"""Events reach subscribers, the `fencelock.<backend>` loggers and OpenTelemetry from one place, at the levels the
README's table gives; nothing is built when nobody listens; a failing subscriber never breaks a lock call."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fencelock
from fencelock import _events, _otel
from fencelock._events import LEVELS, LockEvent, backend_kind, emit

_SPANS = InMemorySpanExporter()
_METRICS = InMemoryMetricReader()


@pytest.fixture(scope="session")
def otel_sdk() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """OpenTelemetry's SDK with in-memory exporters, set once for the session (its providers cannot be replaced)."""
    if not _otel.configured():
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_SPANS))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[_METRICS]))
    return _SPANS, _METRICS


@pytest.fixture
def events() -> Iterator[list[LockEvent]]:
    seen: list[LockEvent] = []
    unsubscribe = fencelock.subscribe(seen.append)
    yield seen
    unsubscribe()


def test_a_subscriber_gets_every_event_until_it_unsubscribes() -> None:
    seen: list[LockEvent] = []
    unsubscribe = fencelock.subscribe(seen.append)
    emit("grant", "orders:1", "redis", "acquire", fence=7, waited=0.25, duration=0.001)
    unsubscribe()
    emit("release", "orders:1", "redis", "release", fence=7, held=1.0, duration=0.001)
    assert [(e.kind, e.name, e.backend, e.fence, e.waited) for e in seen] == [("grant", "orders:1", "redis", 7, 0.25)]


def test_subscribe_refuses_what_cannot_be_called() -> None:
    with pytest.raises(TypeError, match="callback must be callable"):
        fencelock.subscribe("print")  # type: ignore[arg-type]


def test_a_failing_subscriber_is_logged_and_the_others_still_hear(events: list[LockEvent],
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    def broken(event: LockEvent) -> None:
        raise RuntimeError("boom")

    unsubscribe = fencelock.subscribe(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="fencelock"):
            emit("lost", "jobs:9", "etcd", "renew", fence=3, error="its validity ran out")
    finally:
        unsubscribe()
    assert [e.kind for e in events] == ["lost"]
    assert any("subscribe() callback failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("kind", sorted(LEVELS))
def test_every_kind_is_logged_at_its_level_by_the_backends_logger(kind: str,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="fencelock"):
        emit(kind, "orders:42", "redlock", "acquire", fence=5, error="node 2 is out" if kind == "node_out" else None)
    (record,) = [r for r in caplog.records if r.name.startswith("fencelock.")]
    assert record.name == "fencelock.redlock"
    assert record.levelno == LEVELS[kind]
    assert "'orders:42'" in record.getMessage()
    assert "redlock" in record.getMessage()
    assert record.fencelock_event.kind == kind  # type: ignore[attr-defined]


def test_routine_events_are_debug_and_trouble_is_a_warning() -> None:
    assert {k for k, level in LEVELS.items() if level == logging.DEBUG} >= {"acquire", "wait", "grant", "release"}
    trouble = {"lost", "renewal_failed", "node_out", "evicting", "unsafe_version"}
    assert {k for k, level in LEVELS.items() if level == logging.WARNING} == trouble


def test_nothing_is_built_when_nobody_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []
    monkeypatch.setattr(_events, "LockEvent", lambda *a: built.append(a))
    monkeypatch.setattr(_events, "_otel_enabled", lambda: False)
    logging.getLogger("fencelock").setLevel(logging.WARNING)
    try:
        emit("grant", "orders:1", "redis", "acquire", fence=1)
    finally:
        logging.getLogger("fencelock").setLevel(logging.NOTSET)
    assert built == []


def test_backend_kinds_come_from_the_backend_classes() -> None:
    from fencelock._async.redis import AsyncRedisBackend
    from fencelock._async.redlock import AsyncRedlockBackend
    from fencelock._sync.redis import RedisBackend

    assert backend_kind(object.__new__(AsyncRedisBackend)) == "redis"
    assert backend_kind(object.__new__(RedisBackend)) == "redis"
    assert backend_kind(object.__new__(AsyncRedlockBackend)) == "redlock"


def test_spans_and_metrics_with_the_sdk(otel_sdk: tuple[InMemorySpanExporter, InMemoryMetricReader]) -> None:
    spans, reader = otel_sdk
    spans.clear()
    emit("grant", "orders:77", "redis", "acquire", fence=12, waited=0.5, duration=0.5)
    emit("release", "orders:77", "redis", "release", fence=12, held=2.0, duration=0.001)
    emit("timeout", "orders:78", "redis", "acquire", waited=3.0, duration=3.0)
    emit("renewal_failed", "orders:77", "redis", "renew", fence=12, error="no answer")
    emit("lost", "orders:77", "redis", "renew", fence=12, held=2.5, error="its validity ran out")
    finished: dict[tuple[str, Any], tuple[dict[str, Any], int]] = {}
    for span in spans.get_finished_spans():
        attributes = dict(span.attributes or {})
        assert span.start_time is not None
        assert span.end_time is not None
        finished[(span.name, attributes["fencelock.lock.name"])] = (attributes, span.end_time - span.start_time)
    acquire, took = finished[("fencelock.acquire", "orders:77")]
    assert acquire["fencelock.fence"] == 12
    assert acquire["fencelock.backend"] == "redis"
    assert acquire["fencelock.outcome"] == "grant"
    assert acquire["fencelock.wait_s"] == 0.5
    assert took == pytest.approx(0.5e9, rel=1e-3)
    assert finished[("fencelock.release", "orders:77")][0]["fencelock.outcome"] == "release"
    assert finished[("fencelock.acquire", "orders:78")][0]["fencelock.outcome"] == "timeout"
    assert not any(name == "fencelock.renew" for name, _ in finished)  # renewals are metrics, not spans

    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, Any] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)
    for counter in ("fencelock.grants", "fencelock.timeouts", "fencelock.renewal_failures", "fencelock.losses"):
        assert sum(p.value for p in points[counter]) >= 1, counter
        assert all("fencelock.lock.name" not in p.attributes for p in points[counter])  # bounded cardinality
    assert sum(p.count for p in points["fencelock.wait"]) >= 2
    assert sum(p.count for p in points["fencelock.hold"]) >= 2


# -- the lock calls, on a real server ---------------------------------------------------------------------------

from fencelock.testing.servers import RedisServer  # noqa: E402


def test_a_lock_cycle_is_told_in_order_with_fence_and_wait(standalone: RedisServer, name: str,
                                                           events: list[LockEvent],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="fencelock"), fencelock.connect(standalone.url) as locks:
        holder = locks.acquire(name, ttl=5.0)
        with pytest.raises(fencelock.NotAcquired):
            locks.acquire(name, wait=0)
        with pytest.raises(fencelock.AcquireTimeout):
            locks.acquire(name, wait=0.2)
        holder.extend()
        holder.release()
    mine = [e for e in events if e.name == name]
    assert [e.kind for e in mine] == ["acquire", "grant", "acquire", "busy", "acquire", "wait", "timeout",
                                      "extend", "release"]
    grant = mine[1]
    assert (grant.backend, grant.fence, grant.op) == ("redis", holder.fence, "acquire")
    assert grant.waited is not None
    assert mine[6].waited is not None
    assert mine[6].waited >= 0.2
    assert mine[-1].held is not None
    assert mine[-1].held > 0
    logged = [r for r in caplog.records if r.name == "fencelock.redis" and name in r.getMessage()]
    assert len(logged) == len(mine)
    assert all(holder.token not in r.getMessage() for r in caplog.records)
    assert all(holder.token not in repr(e) for e in mine)


def test_a_stolen_lease_is_lost_at_warning_and_a_renewal_that_fails_too(own_server: RedisServer, name: str,
                                                                        events: list[LockEvent],
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="fencelock"), \
            fencelock.connect(own_server.url + "?socket_timeout=0.2") as locks:
        lease = locks.acquire(name, ttl=1.0, renew=True)
        own_server.pause()
        try:
            deadline = time.monotonic() + 5.0
            while not any(e.kind == "renewal_failed" and e.name == name for e in events):
                assert time.monotonic() < deadline, "no renewal_failed event while the server was paused"
                time.sleep(0.05)
        finally:
            own_server.resume()
        deadline = time.monotonic() + 5.0
        while not lease.lost and lease.held:
            locks.force_release(name)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        while not lease.lost:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(fencelock.LockLost):
            lease.release()
    kinds = [e.kind for e in events if e.name == name]
    assert kinds.index("renewal_failed") < kinds.index("lost")
    assert kinds.count("lost") == 1
    warnings = {r.fencelock_event.kind for r in caplog.records  # type: ignore[attr-defined]
                if r.levelno == logging.WARNING and r.name == "fencelock.redis"}
    assert warnings == {"renewal_failed", "lost"}


def test_spans_for_a_real_acquire_and_release(otel_sdk: tuple[InMemorySpanExporter, InMemoryMetricReader],
                                              standalone: RedisServer, name: str) -> None:
    spans, _ = otel_sdk
    spans.clear()
    with fencelock.connect(standalone.url) as locks:
        lease = locks.acquire(name, ttl=5.0)
        lease.release()
    found = [(s.name, dict(s.attributes or {})) for s in spans.get_finished_spans()
             if (s.attributes or {}).get("fencelock.lock.name") == name]
    assert [n for n, _ in found] == ["fencelock.acquire", "fencelock.release"]
    assert found[0][1]["fencelock.fence"] == lease.fence
    assert found[0][1]["fencelock.outcome"] == "grant"
