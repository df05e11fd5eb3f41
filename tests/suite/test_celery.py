"""fencelock.celery on a real Redis (broker, result backend and lock service) and a real Celery worker.

The worker is a subprocess, `celery -A tests.suite.celery_app worker --pool=prefork --concurrency=2`. Its tasks write
events into Redis lists; the test reads their order as the server saw it, never the worker's clocks.

Invariants: two runs with one key never overlap, and each gets a larger fence than the one before; runs with
different keys do overlap; a busy lock skips, retries or waits as the task says; a lease lost while the task runs
is seen at once by `lease.ensure()` and always ends the run with LockLost; renewal keeps a run's lease past its TTL.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery  # type: ignore[import-untyped]

import fencelock
from fencelock._logic.celery import READABLE_LENGTH
from fencelock.celery import LockedTask, Skipped, current_lease
from fencelock.testing.servers import RedisServer
from tests.conftest import IN_CI, until

from . import celery_app
from .celery_app import URL_VARIABLE, app

ROOT = Path(__file__).resolve().parents[2]
RESULT_WAIT = 60.0


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    try:
        server = RedisServer()
    except RuntimeError as exc:
        if IN_CI:
            pytest.fail(f"CI must run the Celery tests: {exc}")
        pytest.skip(str(exc))
    with server:
        url = f"redis://{server.host}:{server.port}/0"
        celery_app.configure(url)
        yield url


def start_worker(url: str, log_path: Path, pool: str, queue: str) -> subprocess.Popen[bytes]:
    """`celery worker` as a subprocess with two slots on `pool`, consuming `queue`; returns once it answers."""
    env = {**os.environ, URL_VARIABLE: url, "PYTHONPATH": str(ROOT)}
    node = f"{queue}-{uuid.uuid4().hex[:8]}@localhost"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.suite.celery_app", "worker", f"--pool={pool}",
             "--concurrency=2", "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "-Q", queue, "-n", node],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60.0
    while not app.control.ping(destination=[node], timeout=0.5):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_worker(proc)
            pytest.fail(f"the Celery worker did not start:\n{log_path.read_text()[-3000:]}")
    return proc


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # warm shutdown
    try:
        proc.wait(20.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10.0)


@pytest.fixture(scope="module")
def worker(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A real worker process (prefork, two children) consuming the default queue of the real broker."""
    proc = start_worker(redis_url, tmp_path_factory.mktemp("celery") / "worker.log", "prefork", "celery")
    try:
        yield
    finally:
        stop_worker(proc)


@pytest.fixture
def locks(redis_url: str) -> Iterator[fencelock.Locks]:
    """An independent client: holds locks against the tasks, and watches and breaks theirs."""
    client = fencelock.connect(redis_url)
    yield client
    client.close()


@pytest.fixture
def key() -> str:
    return f"celery-test:{uuid.uuid4().hex[:12]}"


def events(key: str) -> list[list[str]]:
    db = celery_app._db()
    return [(e.decode() if isinstance(e, bytes) else e).split() for e in db.lrange(f"events:{key}", 0, -1)]


def get(result: Any) -> Any:
    return result.get(timeout=RESULT_WAIT, propagate=True)


# -- options and names (no worker) -------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "error", "words"), [
    ({"on_busy": "sometimes"}, ValueError, "on_busy must be one of 'skip', 'retry', 'wait'"),
    ({"lock_ttl": 0}, ValueError, "lock_ttl must be"),
    ({"lock_ttl": "30"}, TypeError, "lock_ttl must be"),
    ({"lock_wait": -1}, ValueError, "lock_wait must be"),
    ({"lock_retry_delay": float("inf")}, ValueError, "lock_retry_delay must be"),
    ({"lock_key": 3}, TypeError, "lock_key must be"),
    ({"lock_key": "sync:{}"}, ValueError, "lock_key must be"),
    ({"lock_key": "sync:{0}"}, ValueError, "lock_key must be"),
])
def test_a_bad_option_fails_when_the_task_class_is_made(options: dict[str, Any], error: type[Exception],
                                                        words: str) -> None:
    with pytest.raises(error, match=f"{words}.*task 't.bad'"):
        type("Bad", (LockedTask,), {"name": "t.bad", **options})


def test_the_default_key_is_the_task_and_its_arguments_by_name() -> None:
    expected = 'celery:t.plain:{"customer":7,"region":"eu"}'
    assert celery_app.plain.lock_name((7,), {}) == expected
    assert celery_app.plain.lock_name((), {"customer": 7}) == expected
    assert celery_app.plain.lock_name((7, "eu"), {}) == expected
    assert celery_app.plain.lock_name((8,), {}) != expected
    long = celery_app.plain.lock_name(("x" * 2000,), {})
    assert long.startswith("celery:t.plain:sha256:")
    assert len(long) <= READABLE_LENGTH
    with pytest.raises(TypeError, match="customer"):
        celery_app.plain.lock_name((), {})


def test_a_key_format_or_function_names_the_lock() -> None:
    assert celery_app.skip.lock_name(("orders:42", "r1"), {}) == "orders:42"
    assert celery_app.wait.lock_name((), {"key": "orders:43", "run": "r1"}) == "orders:43"
    odd = type("Odd", (LockedTask,), {"name": "t.odd", "lock_key": "x:{nope}", "run": staticmethod(lambda a: a)})()
    with pytest.raises(ValueError, match=r"lock_key 'x:\{nope\}' names 'nope'.*task 't.odd'"):
        odd.lock_name((1,), {})
    empty = type("Empty", (LockedTask,), {"name": "t.empty", "lock_key": lambda a: "", "run": staticmethod(
        lambda a: a)})()
    with pytest.raises(ValueError, match=r"the lock key of task 't\.empty'"):
        empty.lock_name((1,), {})


def test_without_celery_the_import_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "celery", None)  # what a missing package looks like to `import`
    monkeypatch.delitem(sys.modules, "fencelock.celery")
    with pytest.raises(ImportError, match=re.escape("pip install 'fencelock[celery]'")):
        importlib.import_module("fencelock.celery")


def _identity(n: int) -> int:
    return n


def test_a_task_without_a_lock_service_says_how_to_name_one() -> None:
    other = Celery("no_lock_url", broker="amqp://guest:secret-password@127.0.0.1:1//")
    task = other.task(base=LockedTask, name="t.nowhere")(_identity)
    with pytest.raises(ValueError, match=r"task 't\.nowhere' has no lock service: set lock_url=") as caught:
        task(1)
    assert "secret-password" not in str(caught.value)


def test_current_lease_outside_a_task_is_an_error() -> None:
    with pytest.raises(fencelock.LockError, match=r"no fencelock\.celery task is running"):
        current_lease()


def test_a_direct_call_holds_the_lock_while_it_runs(redis_url: str, locks: fencelock.Locks) -> None:
    fence = celery_app.plain(9001)
    assert isinstance(fence, int)
    assert fence > 0
    assert not locks.status(celery_app.plain.lock_name((9001,), {})).held  # released at the end


# -- on a real worker --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("worker")
def test_one_key_never_overlaps_and_each_run_gets_a_larger_fence(key: str) -> None:
    results = [celery_app.hold.delay(key, f"r{i}", 0.15) for i in range(4)]
    fences = [get(r) for r in results]
    seen = events(key)
    assert len(seen) == 8, seen
    for start, end in zip(seen[0::2], seen[1::2], strict=True):
        assert start[0] == "start"
        assert end == ["end", start[1]], f"another run started before {start[1]} ended: {seen}"
    started = [int(e[2]) for e in seen[0::2]]
    assert started == sorted(set(started)), f"fences not strictly increasing in the order of the runs: {seen}"
    assert sorted(fences) == started


@pytest.mark.usefixtures("worker")
def test_different_keys_run_at_the_same_time(key: str) -> None:
    group = uuid.uuid4().hex
    results = [celery_app.meet.delay(f"{key}:{i}", f"m{i}", group, 2) for i in range(2)]
    assert [get(r) for r in results] == [True, True], "the two runs never held their locks at the same time"


def test_threads_pool_runs_give_each_run_its_own_lease(redis_url: str, key: str, tmp_path: Path) -> None:
    """Two runs at once in one process share the task object: `self.lease` is still each run's own."""
    proc = start_worker(redis_url, tmp_path / "worker.log", "threads", "threads")
    try:
        group = uuid.uuid4().hex
        results = [celery_app.meet.apply_async((f"{key}:{i}", f"m{i}", group, 2), queue="threads")
                   for i in range(2)]
        assert [get(r) for r in results] == [True, True]
    finally:
        stop_worker(proc)
    for i in range(2):
        assert events(f"{key}:{i}")[1] == ["end", f"m{i}", "True"], "a run saw the other run's lease"


@pytest.mark.usefixtures("worker")
def test_skip_when_busy_does_not_run_and_says_so(key: str, locks: fencelock.Locks) -> None:
    with locks.lock(key, ttl=30.0) as held:
        result = celery_app.skip.delay(key, "s1")
        with pytest.raises(Skipped, match="skipped: another run holds the lock"):
            get(result)
        assert result.state == "FAILURE"
        assert isinstance(result.result, Skipped)
        assert result.result.name == key  # through the result backend
    assert events(key) == [], "a skipped run started its body"
    assert get(celery_app.skip.delay(key, "s2")) > held.fence  # the lock free again, the task runs


@pytest.mark.usefixtures("worker")
def test_retry_when_busy_runs_later(key: str, locks: fencelock.Locks) -> None:
    with locks.lock(key, ttl=30.0) as held:
        result = celery_app.retry.delay(key, "r1")
        until(lambda: result.state == "RETRY", RESULT_WAIT, "the task was not retried")
        assert events(key) == []
        celery_app.event(key, "released")
    fence = get(result)
    assert fence > held.fence
    seen = events(key)
    assert seen[0] == ["released"]
    assert seen[1][:3] == ["start", "r1", str(fence)]
    assert int(seen[1][3]) >= 1, "the body ran on the first attempt, while the lock was held"


@pytest.mark.usefixtures("worker")
def test_wait_when_busy_waits_for_the_lock(key: str, locks: fencelock.Locks) -> None:
    with locks.lock(key, ttl=30.0) as held:
        result = celery_app.wait.delay(key, "w1")
        until(lambda: result.state == "STARTED", RESULT_WAIT, "the task did not start waiting")
        with pytest.raises(fencelock.AcquireTimeout):
            get(celery_app.wait_briefly.delay(key, "w2"))
        assert events(key) == []
        celery_app.event(key, "released")
    fence = get(result)
    assert fence > held.fence
    assert [e[:3] for e in events(key)] == [["released"], ["start", "w1", str(fence)]]


@pytest.mark.usefixtures("worker")
def test_a_lost_lease_stops_the_task_at_ensure_and_fails_it(key: str, locks: fencelock.Locks) -> None:
    result = celery_app.until_lost.delay(key, "l1")
    until(lambda: events(key), RESULT_WAIT, "the task did not start")
    locks.force_release(key)
    with pytest.raises(fencelock.LockLost):
        get(result)
    assert result.state == "FAILURE"
    assert isinstance(result.result, fencelock.LockLost)
    seen = events(key)
    # Found by the next renewal (every 3 s), not when the 9 s lease would have run out by itself.
    assert seen[1][:2] == ["lost-after", "l1"]
    assert float(seen[1][2]) < 6.0, f"the loss was found only when the lease ran out: {seen}"
    fence = int(seen[0][2])
    assert get(celery_app.skip.delay(key, "after")) > fence  # the lock is usable, with a larger fence


@pytest.mark.usefixtures("worker")
def test_a_task_that_ignores_the_loss_still_ends_with_lock_lost(key: str, locks: fencelock.Locks) -> None:
    result = celery_app.finish_lost.delay(key, "l2")
    until(lambda: events(key), RESULT_WAIT, "the task did not start")
    locks.force_release(key)
    with pytest.raises(fencelock.LockLost):
        get(result)  # the body returned "finished"; the run is reported lost all the same
    assert events(key)[1] == ["saw-lost", "l2", "True"]


@pytest.mark.usefixtures("worker")
def test_a_loss_outranks_the_error_of_the_body(key: str, locks: fencelock.Locks) -> None:
    result = celery_app.finish_lost.delay(key, "l3", fail=True)
    until(lambda: events(key), RESULT_WAIT, "the task did not start")
    locks.force_release(key)
    with pytest.raises(fencelock.LockLost):
        get(result)  # not the ValueError the body raised after the loss


@pytest.mark.usefixtures("worker")
def test_autoretry_for_lock_lost_runs_the_task_again_under_a_new_lease(key: str, locks: fencelock.Locks) -> None:
    result = celery_app.again_when_lost.delay(key, "a1")
    until(lambda: events(key), RESULT_WAIT, "the task did not start")
    locks.force_release(key)
    fence = get(result)
    seen = events(key)
    assert [e[:2] + e[3:] for e in seen] == [["start", "a1", "0"], ["start", "a1", "1"]]
    assert fence == int(seen[1][2]) > int(seen[0][2])


@pytest.mark.usefixtures("worker")
def test_renewal_keeps_a_task_alive_past_its_ttl(key: str, locks: fencelock.Locks) -> None:
    result = celery_app.outlive.delay(key, "o1")
    until(lambda: events(key), RESULT_WAIT, "the task did not start")
    fence = int(events(key)[0][2])
    started = time.monotonic()
    while time.monotonic() - started < 3.0:  # three TTLs of the task's lock
        status = locks.status(key)
        assert status.held, "the running task's lock expired"
        assert status.fence == fence
        time.sleep(0.1)
    celery_app._db().set("go:o1", 1)
    assert get(result) == fence
    assert events(key)[1] == ["end", "o1", "True"]
    assert not locks.status(key).held
