"""One behavioural suite that every fencelock backend must pass, unchanged: `ConformanceSuite`.

fencelock runs it on a single Redis, a Redis Cluster, Redlock, etcd and ZooKeeper; a third-party backend runs it
the same way. The suite talks to the service only through the public API and a `Deployment`
(`fencelock.testing.Deployment`): `holder(name)` to look behind fencelock's back, `steal(name)` to take a lock away
from its holder, `pause()`/`resume()` to stall the service. It covers the API (acquire, release, `lock()`,
extend, `remaining()`, a `repr` that hides the token), the errors, bad input (refused before anything is sent),
`wait` deadlines, mutual exclusion under contention (threads, tasks and processes), strictly increasing fences,
the release of a lost lease, `SQLGuard` (on SQLite) rejecting a stale writer, asyncio cancellation, the loss
signal, renewal, `fair=True` (honoured or refused, per `Deployment.supports_fair`), fork safety, and a paused
service giving `BackendError` in bounded time. What reads a backend's own storage (keys, scripts, queues) is
that backend's own tests' business. The tests are grouped by what they check (`_api`, `_exclusion`,
`_liveness`); `ConformanceSuite` combines them with its fixtures.

Running it on your backend
--------------------------
Subclass `Deployment` (four methods: `holder`, `steal`, `pause`, `resume`; say `min_ttl` if your leases are
coarser than 10 ms), then subclass `ConformanceSuite` in a test module and give it a `deployment` fixture::

    # tests/test_conformance.py
    import pytest
    from fencelock.testing import Deployment
    from fencelock.testing.conformance import ConformanceSuite

    class MyDeployment(Deployment):
        kind = "mine"
        def holder(self, name): ...     # the token holding `name`, read from your servers; None if free
        def steal(self, name): ...      # delete the lock behind its holder's back
        def pause(self): ...            # SIGSTOP your servers
        def resume(self): ...           # SIGCONT them

    @pytest.fixture(scope="session")
    def my_service():
        with MyDeployment(start_my_servers()) as deployment:   # `close()` stops what it started
            yield deployment

    class TestMyBackend(ConformanceSuite):
        @pytest.fixture
        def deployment(self, my_service):
            return my_service

and run `pytest`. Start the service in a session- or module-scoped fixture, as here, and hand it to the class's
`deployment` (pytest 9 deprecates class-scoped fixtures written as methods). Tests that pause the service ask for
`own_deployment`; by default that is `deployment`, resumed in a `finally`. Override `own_deployment` as well to give
those tests servers of their own. Put `pytest.register_assert_rewrite("fencelock.testing.conformance")` in your
`conftest.py` for pytest's detailed assertion messages. The suite needs pytest and nothing else: no markers, no
plugins, no fixtures of yours but `deployment`.

What the suite reads from your `Deployment` besides the four methods (see `fencelock.testing.deployment`):

- `min_ttl`: tests that let a lease run out use at least this TTL (etcd: 1 s).
- `expiry_slack`: how late the service may free a lease nobody renewed; waits for an expiry add it.
- `stall_timeout`: how long one request to a paused service may take to fail; the bound for `BackendError`.
- `supports_fair`: if True, four fair waiters must be served in arrival order; if False, `fair=True` must be
  refused with a `ValueError` before anything is sent.
- `ttl_left(name)`, `leftovers(name)`, `queued(name)`: optional look-ups (None: cannot tell). With them the suite
  also checks the server's TTL after `extend`, that a cancelled acquire left nothing behind, and it waits for fair
  waiters to be queued instead of sleeping 0.3 s between them.

The suite assumes what fencelock promises on every backend: a lease that nobody renews is gone from the service
`ttl` (+ `expiry_slack`) after it was granted, even while its client stays connected; `steal(name)` is noticed
by the holder's watchdog within one renewal interval (`ttl / 3`); and `connect()` gives a client whose requests
to a paused service fail with `BackendError` within `stall_timeout`.

Adding a backend to fencelock's own suite
-----------------------------------------
`tests/conftest.py` keeps a registry, `BACKENDS`: a kind mapped to a function that starts a deployment (and calls
`pytest.skip`, or `pytest.fail` in CI, when the server is not installed; see `redis_deployment` there). One more
line, for instance `"etcd": etcd_deployment,`, runs every test of this suite on it (`tests/suite/test_conformance.py`).
Each function is called once for the session's shared deployment of its kind, and once for every test that asks
for `own_deployment` (these are stopped after the test). `pytest tests/suite/test_conformance.py -k etcd` runs the
suite on that backend alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import NoReturn

import pytest

import fencelock

from ..deployment import Deployment
from ._api import ApiTests
from ._exclusion import ExclusionTests
from ._helpers import BAD_ARGUMENTS as BAD_ARGUMENTS
from ._helpers import BAD_NAMES as BAD_NAMES
from ._liveness import LivenessTests

__all__ = ["ConformanceSuite"]


# pytest collects the tests of the bases last first: the API's run first, the stalled service's last.
class ConformanceSuite(LivenessTests, ExclusionTests, ApiTests):
    """The behaviour every backend shares. Subclass it as `Test<Backend>` and give it a `deployment` fixture."""

    # -- fixtures (override `deployment`; the rest has defaults) -------------------------------------------------

    @pytest.fixture
    def deployment(self) -> NoReturn:
        pytest.fail("a ConformanceSuite subclass must define a `deployment` fixture that yields a "
                    "fencelock.testing.Deployment (see the fencelock.testing.conformance docstring)")

    @pytest.fixture
    def own_deployment(self, deployment: Deployment) -> Deployment:
        """The deployment for tests that pause the service. Override it to give them servers of their own."""
        return deployment

    @pytest.fixture
    def name(self, request: pytest.FixtureRequest) -> str:
        """A lock name no other test uses."""
        return f"conformance:{request.node.name}:{uuid.uuid4().hex[:8]}"

    @pytest.fixture
    def locks(self, deployment: Deployment) -> Iterator[fencelock.Locks]:
        client = deployment.connect()
        yield client
        client.close()
