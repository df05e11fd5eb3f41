"""Celery tasks that run at most once at a time per key, with a fenced, renewed lease.

    from fencelock.celery import LockedTask

    @app.task(base=LockedTask, bind=True, lock_key="sync:{customer_id}", lock_ttl=60, on_busy="skip")
    def sync_customer(self, customer_id):
        for batch in batches(customer_id):
            self.lease.ensure()                      # LockLost the moment the lease is gone
            store.write(batch, fence=self.lease.fence)

The lock is taken in the worker, around each run, and renewed while it runs. Options (task attributes, so also
`@app.task(...)` keywords): `lock_key`, `lock_ttl`, `on_busy` ("skip", "retry", "wait"), `lock_wait`,
`lock_retry_delay`, `lock_url` (else `app.conf.fencelock_url`, else a redis:// broker URL). See
docs/design/celery.md.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar

from ._errors import MissingExtra

try:
    from celery import Task  # type: ignore[import-untyped]
    from celery.exceptions import Retry  # type: ignore[import-untyped]
except ImportError as exc:
    raise MissingExtra("fencelock.celery needs Celery, which the celery extra installs: "
                       "pip install 'fencelock[celery]'") from exc

from ._errors import LockError, LockLost, NotAcquired
from ._logic.args import DEFAULT_TTL, DEFAULT_WAIT
from ._logic.celery import LockOptions, OnBusy, check_options, checked_name, default_name, format_name
from ._sync.client import Locks
from ._sync.connect import connect
from ._sync.lease import Lease

__all__ = ["LockedTask", "Skipped", "current_lease"]

log = logging.getLogger("fencelock.celery")

_lease: contextvars.ContextVar[Lease | None] = contextvars.ContextVar("fencelock_celery_lease", default=None)


class Skipped(NotAcquired):
    """A run of a task with `on_busy="skip"` did not start: another run held its lock. (A result backend rebuilds
    it as `Skipped(*args)`: its args are its message and name, as every fencelock error's.)"""


def current_lease() -> Lease:
    """The lease of the `LockedTask` run in progress in this thread; `LockError` outside one."""
    lease = _lease.get()
    if lease is None:
        raise LockError("no fencelock.celery task is running here")
    return lease


_clients: dict[tuple[int, str], Locks] = {}
_clients_lock = threading.Lock()


def _client(url: str) -> Locks:
    """One client (one watchdog) per lock service URL and process: a prefork child makes its own."""
    key = (os.getpid(), url)
    with _clients_lock:
        locks = _clients.get(key)
        if locks is None:
            locks = _clients[key] = connect(url)
        return locks


def _broker_lock_url(broker: object) -> str | None:
    if isinstance(broker, str) and broker.startswith(("redis://", "rediss://")) and ";" not in broker:
        return broker
    return None


class LockedTask(Task):  # type: ignore[misc]
    """A Celery task base class: each run holds the lock named by `lock_name()` and is renewed while it runs."""

    lock_key: ClassVar[str | Callable[..., object] | None] = None
    """None: one lock per task and argument values; a str: a format string over the arguments by name
    ("sync:{customer_id}"); a callable: called with the task's arguments, returns the name."""
    lock_ttl: ClassVar[float] = DEFAULT_TTL
    on_busy: ClassVar[str] = "skip"
    lock_wait: ClassVar[float | None] = DEFAULT_WAIT
    """Seconds `on_busy="wait"` waits for the lock (None: for ever), then the run fails with `AcquireTimeout`."""
    lock_retry_delay: ClassVar[float | None] = None
    """Seconds before `on_busy="retry"` runs again; None: Celery's `default_retry_delay`."""
    lock_url: ClassVar[str | None] = None

    throws: ClassVar[tuple[type[BaseException], ...]] = (Skipped,)
    _lock_options: ClassVar[LockOptions | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        task = getattr(cls, "name", None) or cls.__qualname__
        cls._lock_options = check_options(str(task), key=cls.lock_key, ttl=cls.lock_ttl, on_busy=cls.on_busy,
                                          wait=cls.lock_wait, retry_delay=cls.lock_retry_delay)
        if Skipped not in tuple(cls.throws):
            cls.throws = (*tuple(cls.throws), Skipped)  # a skip is routine: logged at INFO, not as an error

    @property
    def lease(self) -> Lease:
        """The lease of the run in progress (`self.lease.fence`, `self.lease.ensure()`)."""
        return current_lease()

    def _options(self) -> LockOptions:
        cls = type(self)
        options = cls._lock_options
        if options is None:  # LockedTask itself; read from the class, so a key function stays unbound
            options = cls._lock_options = check_options(
                str(self.name), key=cls.lock_key, ttl=cls.lock_ttl, on_busy=cls.on_busy, wait=cls.lock_wait,
                retry_delay=cls.lock_retry_delay)
        return options

    def lock_name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The lock one call holds. Override it to build the key your own way."""
        key = self._options().key
        if callable(key):
            return checked_name(key(*args, **kwargs), str(self.name))
        bound = inspect.signature(self.run).bind(*args, **kwargs)
        bound.apply_defaults()
        if key is None:
            return checked_name(default_name(str(self.name), bound.arguments), str(self.name))
        return format_name(key, bound.arguments, str(self.name))

    def get_locks(self) -> Locks:
        """The lock service client of this process. Override it to use a client of your own."""
        url = self.lock_url or self.app.conf.get("fencelock_url") or _broker_lock_url(self.app.conf.broker_url)
        if not url:
            raise ValueError(f"task {self.name!r} has no lock service: set lock_url=... on the task or "
                             f"app.conf.fencelock_url (the broker URL is used only when it is redis://)")
        return _client(str(url))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        options = self._options()
        name = self.lock_name(args, kwargs)
        locks = self.get_locks()
        try:
            lease = locks.acquire(name, ttl=options.ttl, wait=options.acquire_wait, renew=True)
        except NotAcquired as busy:
            if options.on_busy is OnBusy.SKIP:
                log.info("task %s[%s] skipped: lock %r on %s is held by another run", self.name, self.request.id,
                         name, locks.backend.shown)
                raise Skipped("skipped: another run holds the lock", name=name) from None
            if options.on_busy is OnBusy.RETRY:
                log.debug("task %s[%s] retries later: lock %r on %s is busy", self.name, self.request.id, name,
                          locks.backend.shown)
                raise self.retry(exc=busy, countdown=options.retry_delay) from None
            raise
        log.debug("task %s[%s] holds lock %r on %s with fence %d", self.name, self.request.id, name,
                  locks.backend.shown, lease.fence)
        reset = _lease.set(lease)
        try:
            result = super().__call__(*args, **kwargs)
        except BaseException as exc:
            _release_after(lease, exc, str(self.name))
            raise
        finally:
            _lease.reset(reset)
        lease.release()  # LockLost if the lease was lost meanwhile: the run's state says so
        return result


def _release_after(lease: Lease, exc: BaseException, task: str) -> None:
    """Release after the body raised `exc`. A loss outranks the body's error, except a retry (Celery's own
    control flow) and a `LockLost` the body raised itself."""
    try:
        lease.release()
    except LockLost as lost:
        if isinstance(exc, (Retry, LockLost)):
            log.warning("task %s lost lock %r before it ended: %s", task, lease.name, lost)
            return
        raise lost from exc
