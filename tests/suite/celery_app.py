"""The Celery app of tests/suite/test_celery.py; its worker runs it as `celery -A tests.suite.celery_app worker`.

Every task records what it did as events in a Redis list (`events:<key>`), so the test reads the order in which
the server saw them: `start <run> <fence>` when the body begins, `end <run>` when it ends.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery  # type: ignore[import-untyped]

from fencelock import LockLost
from fencelock.celery import LockedTask, current_lease

URL_VARIABLE = "FENCELOCK_CELERY_TEST_URL"

app: Any = Celery("fencelock_celery_test")
_redis: list[redis.Redis] = []


def configure(url: str) -> None:
    """Broker, result backend and lock service: one real Redis."""
    app.conf.update(broker_url=url, result_backend=url, fencelock_url=url, task_track_started=True,
                    worker_prefetch_multiplier=1, broker_connection_retry_on_startup=True,
                    worker_hijack_root_logger=False)


if os.environ.get(URL_VARIABLE):
    configure(os.environ[URL_VARIABLE])


def _db() -> redis.Redis:
    if not _redis:
        _redis.append(redis.Redis.from_url(app.conf.fencelock_url))
    return _redis[0]


def event(key: str, *words: object) -> None:
    _db().rpush(f"events:{key}", " ".join(str(w) for w in words))


def _until(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _hold(self: Any, key: str, run: str, hold: float) -> int:
    """Hold the lock `key` for `hold` seconds, between a start and an end event."""
    fence = self.lease.fence
    event(key, "start", run, fence)
    time.sleep(hold)
    event(key, "end", run)
    return int(fence)


def _meet(self: Any, key: str, run: str, group: str, n: int) -> bool:
    """Start, then wait until `n` runs of `group` have started: True only if they all ran at the same time."""
    event(key, "start", run, self.lease.fence)
    _db().rpush(f"group:{group}", run)
    met = _until(lambda: int(_db().llen(f"group:{group}")) >= n, 20.0)
    event(key, "end", run, self.lease.name == key)  # the lease of this run, not of the one beside it
    return met


def _once(self: Any, key: str, run: str) -> int:
    """One start event, and the fence, on each run; Celery's retry count goes along."""
    event(key, "start", run, self.lease.fence, self.request.retries)
    return int(self.lease.fence)


def _until_lost(self: Any, key: str, run: str) -> str:
    """Check the lease before each step, as a task that writes in steps must; stops at the first LockLost."""
    started = time.monotonic()
    event(key, "start", run, self.lease.fence)
    try:
        while time.monotonic() < started + 20.0:
            self.lease.ensure()
            time.sleep(0.02)
    except LockLost:
        event(key, "lost-after", run, time.monotonic() - started)
        raise
    return "never lost"


def _finish_lost(self: Any, key: str, run: str, fail: bool = False) -> str:
    """Ignore the loss signal and finish (or fail, with `fail`): the run must still end with LockLost."""
    event(key, "start", run, self.lease.fence)
    _until(lambda: self.lease.lost, 20.0)
    event(key, "saw-lost", run, self.lease.lost)
    if fail:
        raise ValueError("the body failed after its lease was lost")
    return "finished"


def _again_when_lost(self: Any, key: str, run: str) -> int:
    """The first run waits for its lease to be lost; `autoretry_for=(LockLost,)` runs it again, and it returns."""
    event(key, "start", run, self.lease.fence, self.request.retries)
    if self.request.retries == 0:
        _until(lambda: self.lease.lost, 20.0)
        self.lease.ensure()
    return int(self.lease.fence)


def _outlive(self: Any, key: str, run: str) -> int:
    """Run until the test says `go` (a Redis key): longer than the lock's TTL."""
    event(key, "start", run, self.lease.fence)
    _until(lambda: _db().exists(f"go:{run}"), 20.0)
    event(key, "end", run, self.lease.held)
    return int(self.lease.fence)


def _plain(customer: int, region: str = "eu") -> int:
    """A task that is not bound: its lease is `current_lease()`."""
    return current_lease().fence


hold = app.task(base=LockedTask, bind=True, name="t.hold", lock_key="{key}", on_busy="wait", lock_wait=30,
                lock_ttl=5)(_hold)
meet = app.task(base=LockedTask, bind=True, name="t.meet", lock_key="{key}", on_busy="skip")(_meet)
skip = app.task(base=LockedTask, bind=True, name="t.skip", lock_key="{key}", on_busy="skip")(_once)
retry = app.task(base=LockedTask, bind=True, name="t.retry", lock_key="{key}", on_busy="retry",
                 lock_retry_delay=0.2, max_retries=200)(_once)
wait = app.task(base=LockedTask, bind=True, name="t.wait", lock_key=lambda key, run: key, on_busy="wait",
                lock_wait=30)(_once)
wait_briefly = app.task(base=LockedTask, bind=True, name="t.wait_briefly", lock_key="{key}", on_busy="wait",
                        lock_wait=0.3)(_once)
until_lost = app.task(base=LockedTask, bind=True, name="t.until_lost", lock_key="{key}", lock_ttl=9.0)(_until_lost)
finish_lost = app.task(base=LockedTask, bind=True, name="t.finish_lost", lock_key="{key}",
                       lock_ttl=1.5)(_finish_lost)
again_when_lost = app.task(base=LockedTask, bind=True, name="t.again_when_lost", lock_key="{key}", lock_ttl=1.5,
                           autoretry_for=(LockLost,), max_retries=1, default_retry_delay=0)(_again_when_lost)
outlive = app.task(base=LockedTask, bind=True, name="t.outlive", lock_key="{key}", lock_ttl=1.0)(_outlive)
plain = app.task(base=LockedTask, name="t.plain")(_plain)
