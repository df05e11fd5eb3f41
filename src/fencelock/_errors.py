"""The one exception tree of fencelock.

    LockError                   every fencelock error; `.name` is the lock name (None before a lock is named)
    ├── NotAcquired             the lock is held by someone else and `wait` allowed no more tries
    │   └── AcquireTimeout      ... because the `wait` deadline passed
    ├── LockLost                the lease is no longer ours: it expired, or another holder has the lock
    ├── StaleFence              a fencing guard refused a write: a newer holder already wrote
    ├── NotIndependent          Redlock: two listed nodes are one server, or one is a replica (also a ValueError)
    └── BackendError            the lock service failed or could not be reached (the cause is chained)
        ├── QuorumUnavailable   Redlock: no majority of nodes could be reached, or is ready to count
        └── NotDurable          `durability=...`: the write was not confirmed in time (a grant was given back)

A backend whose optional extra is missing raises `MissingExtra`, an `ImportError` whose message is the
`pip install` to run. Bad arguments are not in this tree: they raise the builtin `TypeError` or `ValueError`,
with a message that names the argument and the lock, before anything is sent to a server. `NotIndependent` is
the one configuration error only the servers can reveal: it is also a `ValueError`, raised at first contact.

Errors of the underlying client libraries (redis-py, httpx, kazoo) are turned into `BackendError` at one boundary
per backend, its module in `_async/`, with `raise ... from exc`; no bare client-library error reaches the caller.

Every error pickles (multiprocessing, Celery): its `args` are its constructor's arguments in order, the lock name
second, so `type(err)(*err.args)` rebuilds it; the `lease` attached to a failed release stays in its process.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = [
    "AcquireTimeout",
    "BackendError",
    "LockError",
    "LockLost",
    "MissingExtra",
    "NotAcquired",
    "NotDurable",
    "NotIndependent",
    "QuorumUnavailable",
    "StaleFence",
]


class LockError(Exception):
    """Base class of every fencelock error. `name` is the lock the error is about; `lease` is the lease whose
    release failed (a failed `release()` or `with` exit: call `err.lease.release()` to try again), else None."""

    lease: Any

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message, name)
        self.name = name
        self.lease = None

    def __str__(self) -> str:
        message = str(self.args[0]) if self.args else ""
        return message if self.name is None else f"{message} (lock {self.name!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its args (each class's constructor arguments, in order), then its attributes; not its lease
        # (connections and a token that mean nothing in another process).
        state = {key: value for key, value in vars(self).items() if key != "lease"}
        return type(self), self.args, state


class NotAcquired(LockError):
    """The lock is held by someone else, and `wait` allowed no further attempt."""


class AcquireTimeout(NotAcquired):
    """The `wait` deadline passed before the lock became free."""


class LockLost(LockError):
    """The lease is no longer ours: its validity ran out, or another holder took the lock."""


class StaleFence(LockError):
    """A fencing guard rejected a write whose fence is lower than one the resource already accepted."""

    def __init__(self, message: str, name: str | None = None, fence: int = 0, highest: int = 0) -> None:
        super().__init__(message, name)
        self.args = (message, name, fence, highest)
        self.fence = fence
        self.highest = highest


class NotIndependent(LockError, ValueError):
    """Redlock: two listed URLs reach one server (the same run_id: another name, a socket, a proxy), or a node is
    a replica. Found at first contact, before any request counts; the message names the URLs."""


class BackendError(LockError):
    """The lock service failed or could not be reached in time. The client library's error is `__cause__`."""


class QuorumUnavailable(BackendError):
    """Redlock: fewer than a majority of the nodes answered, or are ready to count (lost data, not repaired yet).

    `nodes` holds each node's record (`fencelock._redis.redlock.NodeState`) where they were looked at, and
    `retry_in` the seconds until enough of them can be repaired at the latest (None: not while nodes are out).
    """

    def __init__(self, message: str, name: str | None = None, nodes: tuple[Any, ...] = (),
                 retry_in: float | None = None) -> None:
        super().__init__(message, name)
        self.args = (message, name, nodes, retry_in)
        self.nodes = nodes
        self.retry_in = retry_in


class NotDurable(BackendError):
    """`connect(..., durability=...)`: the server did not confirm a grant or extend within `durability_timeout`.

    A grant is given back before this is raised (never a lease that is not durable); an extend claims no new
    validity. `wanted` says what was asked for, `got` what the server confirmed.
    """

    def __init__(self, message: str, name: str | None = None, wanted: str = "", got: str = "") -> None:
        super().__init__(message, name)
        self.args = (message, name, wanted, got)
        self.wanted = wanted
        self.got = got


class MissingExtra(ImportError):
    """A URL's backend needs an optional extra that is not installed; the message is the `pip install` to run."""


E = TypeVar("E", bound=BaseException)


def unsent(error: E) -> E:
    """Mark `error` as one whose request never left the client (refused a connection, not written): the server
    did nothing. Private: the transports set it, the lease reads it (`never_sent`); users see the message."""
    error._never_sent = True  # type: ignore[attr-defined]
    return error


def never_sent(error: BaseException) -> bool:
    """Whether `error` is marked `unsent`: its request certainly never reached the server."""
    return bool(getattr(error, "_never_sent", False))
