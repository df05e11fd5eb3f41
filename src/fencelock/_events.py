"""What happens to locks, told to whoever listens: `subscribe()` callbacks, the `fencelock` loggers, OpenTelemetry.

Every event goes to all three from one place (`emit`), so a subscriber, a log and a trace never disagree. An
event names the lock and the backend; it never carries a token or a password. With nobody listening (no
subscriber, the logger below its level, no OpenTelemetry SDK configured) `emit` returns before building anything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LEVELS", "LockEvent", "emit", "subscribe"]

LEVELS = {
    "acquire": logging.DEBUG,         # an acquire began
    "wait": logging.DEBUG,            # the lock was busy: the acquire waits for it
    "grant": logging.DEBUG,           # granted (fence, waited)
    "busy": logging.DEBUG,            # wait=0 and the lock was held: NotAcquired
    "timeout": logging.INFO,          # the wait ran out: AcquireTimeout
    "release": logging.DEBUG,         # released (held: seconds since the grant)
    "extend": logging.DEBUG,          # extended by the caller
    "failed": logging.INFO,           # a request failed with a BackendError (error: its message)
    "cancelled": logging.INFO,        # an acquire, extend or release was interrupted by its caller (error: how)
    "renewal_failed": logging.WARNING,  # a renewal got no answer or an error; retried while validity remains
    "lost": logging.WARNING,          # the lease is lost (error: why)
    "node_out": logging.WARNING,      # Redlock: a node cannot take part (error: its state)
    "evicting": logging.WARNING,      # a Redis server may evict held locks (error: its memory settings)
    "unsafe_version": logging.WARNING,  # an etcd server's version may revoke live leases (error: which, the fix)
}
"""Every event kind and the level it is logged at: DEBUG for routine events, WARNING for trouble."""


@dataclass(frozen=True)
class LockEvent:
    """One thing that happened to a lock. `backend` is "redis", "redlock", "etcd" or "zookeeper"."""

    kind: str
    name: str
    backend: str
    op: str = ""                    # the call it belongs to: "acquire", "release", "extend" or "renew"
    fence: int | None = None
    waited: float | None = None     # seconds since the acquire began (grant, busy, timeout)
    held: float | None = None       # seconds since the grant (release, lost)
    duration: float | None = None   # seconds the request took (acquire outcomes, release, extend)
    error: str | None = None        # why (failed, cancelled, renewal_failed, lost, node_out, evicting, ...)
    at: float = 0.0                 # time.time() when it happened

    def describe(self) -> str:
        parts = [f"lock {self.name!r} on {self.backend}: {self.kind}"]
        if self.fence is not None:
            parts.append(f"fence {self.fence}")
        if self.waited is not None:
            parts.append(f"waited {self.waited:.3f} s")
        if self.held is not None:
            parts.append(f"held {self.held:.3f} s")
        if self.error:
            parts.append(self.error)
        return ", ".join(parts)


Subscriber = Callable[[LockEvent], object]

_subscribers: tuple[Subscriber, ...] = ()
_subscribers_lock = threading.Lock()
_loggers = {kind: logging.getLogger(f"fencelock.{kind}") for kind in ("redis", "redlock", "etcd", "zookeeper")}
_fallback = logging.getLogger("fencelock")
_otel: Callable[[LockEvent], None] | None = None
_otel_enabled: Callable[[], bool] = lambda: False  # noqa: E731 - replaced when opentelemetry is importable


def subscribe(callback: Subscriber) -> Callable[[], None]:
    """Call `callback(event)` for every `LockEvent` from now on; returns the function that unsubscribes it.

    It runs in the thread or task where the event happened: keep it quick. An exception in it is logged, never
    raised into fencelock."""
    global _subscribers
    if not callable(callback):
        raise TypeError(f"callback must be callable, got {callback!r}")
    with _subscribers_lock:
        _subscribers = (*_subscribers, callback)

    def unsubscribe() -> None:
        global _subscribers
        with _subscribers_lock:
            _subscribers = tuple(s for s in _subscribers if s is not callback)

    return unsubscribe


_kinds: dict[type, str] = {}


def backend_kind(backend: object) -> str:
    """"redis", "redlock", "etcd" or "zookeeper" for a backend object (from its class name)."""
    cls = type(backend)
    kind = _kinds.get(cls)
    if kind is None:
        kind = _kinds[cls] = cls.__name__.removeprefix("Async").removesuffix("Backend").lower()
    return kind


def emit(kind: str, name: str, backend: str, op: str, *, fence: int | None = None, waited: float | None = None,
         held: float | None = None, duration: float | None = None, error: str | None = None) -> None:
    """Tell every listener that `kind` happened to lock `name`; nothing is built when nobody listens."""
    logger = _loggers.get(backend, _fallback)
    level = LEVELS[kind]
    logs = logger.isEnabledFor(level)
    traced = _otel is not None and _otel_enabled()
    if not (_subscribers or logs or traced):
        return
    event = LockEvent(kind, name, backend, op, fence, waited, held, duration, error, time.time())
    if logs:
        logger.log(level, "%s", event.describe(), extra={"fencelock_event": event})
    if traced and _otel is not None:
        try:
            _otel(event)
        except Exception:
            _fallback.exception("recording %s of lock %r in OpenTelemetry failed", kind, name)
    for subscriber in _subscribers:
        try:
            subscriber(event)
        except Exception:
            _fallback.exception("a fencelock.subscribe() callback failed on %s of lock %r", kind, name)


def _install_otel() -> None:
    global _otel, _otel_enabled
    try:
        from . import _otel as otel
    except ImportError:  # the `otel` extra (opentelemetry-api) is not installed
        return
    _otel, _otel_enabled = otel.record, otel.configured


_install_otel()
