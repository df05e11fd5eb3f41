"""The dedicated server connections of Redlock and the single node (`Channel` in `_transport.py`, both trees), on
real servers: a connection carries one request at a time, a script sent after a wait returns its own reply, a
late reply is read for its own request and never for a later one, a connection with no reply within its socket
timeout is dropped, threads sharing a client never share a connection, and a forked child makes connections of
its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import threading
import time
from typing import Any

import redis
import redis.asyncio

import fencelock
from fencelock._async import _multiplex as async_multiplex
from fencelock._async import _transport as async_transport
from fencelock._redis import channel as _channel
from fencelock._redis import order as _order
from fencelock._redis import request as _request
from fencelock._redis.keys import redis_keys
from fencelock._scripts import Lua
from fencelock._sync import _connection as sync_connection
from fencelock._sync import _multiplex as sync_multiplex
from fencelock._sync import _transport as sync_transport
from fencelock.testing.servers import RedisNodes, RedisServer
from fencelock.testing.timing import slack
from tests.conftest import initialise_redlock

_ECHO_SOURCE = "return ARGV[1]"
ECHO = Lua("echo", _ECHO_SOURCE, hashlib.sha1(_ECHO_SOURCE.encode()).hexdigest())
SOCKET_TIMEOUT = 0.3


def _one(done: dict[int, Any]) -> bool:
    return len(done) == 1


def test_a_late_reply_is_read_for_its_own_request_and_a_silent_connection_is_dropped(
        own_server: RedisServer) -> None:
    channel = sync_transport.Channel(redis.Redis.from_url(f"{own_server.url}?socket_timeout={SOCKET_TIMEOUT}"))

    def ask(value: str, timeout: float = 2.0) -> tuple[Any, Any]:
        done, handles = sync_multiplex.run_scripts([_request.ScriptRequest(channel, ECHO, [], [value])], timeout,
                                                _one)
        return done.get(0), handles[0]

    assert ask("warm")[0] == b"warm"  # (the first request connects, and meets NOSCRIPT: EVAL, then cached)
    assert ask("cached")[0] == b"cached"
    own_server.pause()
    try:
        late, handle = ask("late", timeout=0.05)
        assert late is None
    finally:
        own_server.resume()
    assert ask("next")[0] == b"next"  # not "late": that reply belongs to the request before
    assert handle.result(timeout=2.0) == b"late"  # read in the background, for its own request
    own_server.pause()
    try:
        lost, handle = ask("lost", timeout=0.05)
        assert lost is None
        assert isinstance(handle.result(timeout=2.0), redis.TimeoutError)  # no reply within the socket timeout
    finally:
        own_server.resume()
    assert ask("after")[0] == b"after"  # on another connection: the silent one was closed, never reused
    channel.close()


def test_asyncio_a_late_reply_is_read_for_its_own_request_and_a_silent_connection_is_dropped(
        own_server: RedisServer) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(f"{own_server.url}?socket_timeout={SOCKET_TIMEOUT}")
        channel = async_transport.Channel(client)

        async def ask(value: str, timeout: float = 2.0) -> tuple[Any, Any]:
            done, handles = await async_multiplex.run_scripts(
                [_request.ScriptRequest(channel, ECHO, [], [value])], timeout, _one)
            return done.get(0), handles[0]

        assert (await ask("warm"))[0] == b"warm"
        own_server.pause()
        try:
            late, handle = await ask("late", timeout=0.05)
            assert late is None
        finally:
            own_server.resume()
        assert (await ask("next"))[0] == b"next"
        assert await asyncio.wait_for(handle, 2.0) == b"late"
        own_server.pause()
        try:
            lost, handle = await ask("lost", timeout=0.05)
            assert lost is None
            assert isinstance(await asyncio.wait_for(handle, 2.0), redis.TimeoutError)
        finally:
            own_server.resume()
        assert (await ask("after"))[0] == b"after"
        await channel.aclose()
        await client.aclose()

    asyncio.run(main())


def _connections(server: RedisServer) -> int:
    """The server's client connections other than the one asking."""
    with server.client() as asking:
        return len(asking.client_list()) - 1


def _settled(server: RedisServer, expected: int) -> int:
    deadline = time.monotonic() + 2.0
    while (count := _connections(server)) != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return count


def test_a_request_that_gets_its_thread_after_close_makes_no_connection(own_server: RedisServer) -> None:
    """close() while a request waits for a thread (every pool thread busy): when it runs, it must not connect,
    or that connection would be kept in a closed channel and left to the garbage collector (a ResourceWarning)."""
    channel = sync_transport.Channel(redis.Redis.from_url(f"{own_server.url}?socket_timeout=2"))
    before = _connections(own_server)
    gate = threading.Event()
    busy = [channel.submit(gate.wait, 10.0) for _ in range(sync_connection.LANE_WORKERS)]  # the server's every thread
    try:
        done, handles = sync_multiplex.run_scripts([_request.ScriptRequest(channel, ECHO, [], ["late"])], 0.05,
                                                _one)
        assert done == {}  # no idle connection: the request waits for a thread to connect it
        channel.close()
    finally:
        gate.set()
    for future in busy:
        future.result(timeout=5.0)
    reply = handles[0].result(timeout=5.0)
    assert isinstance(reply, redis.ConnectionError), reply
    assert _settled(own_server, before) == before


def test_asyncio_closing_a_channel_while_a_request_connects_leaves_no_connection(own_server: RedisServer) -> None:
    """aclose() while a request's TCP connect is under way: aclose cannot close what is not connected yet, so the
    request must close it itself once connected, instead of dropping it open (a ResourceWarning later)."""
    before = _connections(own_server)

    async def main() -> Any:
        client = redis.asyncio.Redis.from_url(f"{own_server.url}?socket_timeout=2")
        channel = async_transport.Channel(client)
        request = asyncio.ensure_future(async_multiplex.run_scripts(
            [_request.ScriptRequest(channel, ECHO, [], ["late"])], 2.0, _one))
        await asyncio.sleep(0)  # the request has started to connect
        await channel.aclose()
        _, handles = await request
        reply = await asyncio.wait_for(handles[0], 5.0)
        await client.aclose()
        return reply

    reply = asyncio.run(main())
    assert isinstance(reply, redis.ConnectionError), reply
    assert _settled(own_server, before) == before


def _our_connections(nodes: RedisNodes) -> list[int]:
    """Per node, the client connections other than the one asking."""
    counts = []
    for node in nodes.nodes:
        with node.client() as asking:
            counts.append(len(asking.client_list()) - 1)
    return counts


def test_threads_sharing_a_redlock_client_never_share_a_node_connection(name: str) -> None:
    """Eight threads, one client, each thread locking its own name 30 times: if two requests ever shared a
    connection, replies would cross between threads and show as errors or fences out of step."""
    with RedisNodes(5) as nodes:
        initialise_redlock(nodes.urls)
        before = _our_connections(nodes)
        locks = fencelock.connect(nodes.urls)
        failures: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                first = 0
                for k in range(30):  # a new deployment's fences start at its clock floor, then go up by one
                    lease = locks.acquire(f"{name}:{i}", ttl=5.0, wait=0)
                    first = first or lease.fence
                    assert lease.fence == first + k, (lease.fence, first, k)
                    lease.release()
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not failures, failures[:3]
        # As many as were in use at once (a reply left to the background keeps its connection a while), not one
        # per request (240 requests went to every node).
        assert max(_our_connections(nodes)) <= 3 * 8 + max(before)
        locks.close()
        time.sleep(0.05)  # (the nodes see the connections close)
        assert _our_connections(nodes) == before


def _child_status(pid: int, deadline: float, failure: str) -> int:
    """The forked child's wait status once it exits; killed, and `failure` raised, if it is still running at
    `deadline` (time.monotonic)."""
    while time.monotonic() < deadline:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            return status
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(failure)


def test_a_forked_child_uses_node_connections_of_its_own(name: str) -> None:
    with RedisNodes(5) as nodes:
        initialise_redlock(nodes.urls)
        locks = fencelock.connect(nodes.urls)
        locks.acquire(name + ":warm", ttl=5.0, wait=0).release()  # the parent has a connection to every node
        report_r, report_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: works, on its own connections, while the parent works on its own
            code = 1
            try:
                for _ in range(50):
                    locks.acquire(name + ":child", ttl=5.0, wait=0).release()
                code = 0
            except BaseException as exc:
                os.write(report_w, repr(exc).encode())
            finally:
                os._exit(code)
        os.close(report_w)
        deadline = time.monotonic() + 30
        for _ in range(50):
            locks.acquire(name + ":parent", ttl=5.0, wait=0).release()
        status = _child_status(pid, deadline, "the child did not finish")
        with os.fdopen(report_r) as report:
            assert os.waitstatus_to_exitcode(status) == 0, report.read()
        locks.acquire(name + ":parent", ttl=5.0, wait=0).release()
        locks.close()


def test_a_child_forked_while_a_reply_is_held_back_never_reads_it_and_the_parent_gets_its_own(
        own_server: RedisServer, name: str) -> None:
    """Fork while the parent's release waits for a late reply (in another thread): the child inherits that
    connection mid-request. The child's own requests go on connections of its own and get their own replies; the
    parent's release still gets its reply; an independent client sees the parent's key gone."""
    from fencelock.testing.faults import LATE, FaultProxy, Rule

    with FaultProxy("127.0.0.1", own_server.port) as proxy:
        locks = fencelock.connect(f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=2")
        lease = locks.acquire(name, ttl=10.0, wait=0)
        rule = proxy.arm(Rule(LATE, "release", delay=0.5))
        errors: list[BaseException] = []

        def release() -> None:
            try:
                lease.release()
            except BaseException as exc:
                errors.append(exc)

        releasing = threading.Thread(target=release)
        releasing.start()
        assert rule.hit.wait(slack(2.0))  # the release is on the wire; its reply is held back
        report_r, report_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for k in range(20):
                    child = locks.acquire(f"{name}:child{k}", ttl=5.0, wait=0)
                    child.extend()
                    child.release()
                try:
                    lease.release()
                except fencelock.LockError:
                    code = 0  # the parent's lease is not the child's to release
                else:
                    os.write(report_w, b"the child released its parent's lease")
            except BaseException as exc:
                os.write(report_w, repr(exc).encode())
            finally:
                os._exit(code)
        os.close(report_w)
        status = _child_status(pid, time.monotonic() + slack(30.0), "the child did not finish")
        releasing.join(slack(5.0))
        assert not releasing.is_alive()
        with os.fdopen(report_r) as report:
            assert os.waitstatus_to_exitcode(status) == 0, report.read()
        assert errors == []
        assert not lease.held  # released, and confirmed:
        assert not lease.lost
        raw = own_server.client()
        assert raw.get(redis_keys(name).lock) is None
        assert [raw.get(redis_keys(f"{name}:child{k}").lock) for k in range(20)] == [None] * 20
        locks.acquire(name, ttl=5.0, wait=0).release()  # and the parent's client works on
        locks.close()


_POP_SOURCE = "return redis.call('LPOP', KEYS[1]) or 'empty'"
POP = Lua("pop", _POP_SOURCE, hashlib.sha1(_POP_SOURCE.encode()).hexdigest())


def test_a_script_after_a_wait_runs_once_the_wake_up_comes_and_only_its_own_reply_is_returned(
        own_server: RedisServer) -> None:
    """The single node's waiting acquire: BLPOP and the script in one write. The script runs the moment the
    push comes (not at the BLPOP's timeout), the BLPOP's answer is never taken for the script's, also when it is
    an error; after NOSCRIPT the script alone is sent again (the wait is not repeated), on the same connection."""
    admin = redis.Redis.from_url(own_server.url)
    channel = sync_transport.Channel(redis.Redis.from_url(f"{own_server.url}?socket_timeout=5"))
    admin.script_flush()
    pusher = threading.Timer(0.2, lambda: admin.rpush("wake", "w1", "w2", "w3"))
    started = time.monotonic()
    pusher.start()
    # NOSCRIPT here: the script is sent again as EVAL, alone (a repeated BLPOP would pop "w2" and block no more).
    assert sync_transport.call_script(channel, POP, ["wake"], [], wake=("wake", 3.0)) == b"w2"
    # woken by the push, not at the BLPOP's 3 s timeout
    assert 0.15 < time.monotonic() - started < min(0.2 + slack(0.8), 2.9)
    assert admin.lrange("wake", 0, -1) == [b"w3"]
    assert sync_transport.call_script(channel, POP, ["wake"], [], wake=("wake", 3.0)) == b"empty"  # w3 by BLPOP
    started = time.monotonic()
    assert sync_transport.call_script(channel, POP, ["wake"], [], wake=("wake", 0.2)) == b"empty"  # timed out
    assert time.monotonic() - started >= 0.15
    admin.set("not-a-list", "x")
    assert sync_transport.call_script(channel, ECHO, [], ["after"], wake=("not-a-list", 1.0)) == b"after"  # WRONGTYPE
    assert sync_transport.call_script(channel, ECHO, [], ["plain"]) == b"plain"  # nothing left unread
    assert len(channel._open) == 1  # one connection carried all of it
    channel.close()


def test_asyncio_a_script_after_a_wait_runs_once_the_wake_up_comes_and_only_its_own_reply_is_returned(
        own_server: RedisServer) -> None:
    async def main() -> None:
        admin = redis.Redis.from_url(own_server.url)
        channel = async_transport.Channel(redis.asyncio.Redis.from_url(f"{own_server.url}?socket_timeout=5"))
        admin.script_flush()
        pusher = threading.Timer(0.2, lambda: admin.rpush("wake", "w1", "w2", "w3"))
        started = time.monotonic()
        pusher.start()
        assert await async_transport.call_script(channel, POP, ["wake"], [], wake=("wake", 3.0)) == b"w2"
        assert 0.15 < time.monotonic() - started < min(0.2 + slack(0.8), 2.9)
        assert admin.lrange("wake", 0, -1) == [b"w3"]
        assert await async_transport.call_script(channel, POP, ["wake"], [], wake=("wake", 3.0)) == b"empty"
        started = time.monotonic()
        assert await async_transport.call_script(channel, POP, ["wake"], [], wake=("wake", 0.2)) == b"empty"
        assert time.monotonic() - started >= 0.15
        admin.set("not-a-list", "x")
        assert await async_transport.call_script(channel, ECHO, [], ["after"], wake=("not-a-list", 1.0)) == b"after"
        assert await async_transport.call_script(channel, ECHO, [], ["plain"]) == b"plain"
        assert len(channel._open) == 1
        await channel.aclose()

    asyncio.run(main())


def _finished(result: Any = None, *, error: BaseException | None = None, cancelled: bool = False) -> Any:
    future: Any = concurrent.futures.Future()
    if cancelled:
        future.cancel()
    elif error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
    return future


def test_the_order_rule_waits_for_the_latest_request_that_was_sent_and_only_an_answer_lets_the_next_go() -> None:
    """`_redis/order.py`'s rule, which both twins' channels follow: a request that was not sent is never waited for,
    the one it waited for is; a reply or the server's own error is an answer, a network failure is not."""
    channel = _channel.ChannelBase(redis.Redis(host="127.0.0.1", port=1, socket_timeout=0.5))
    assert channel.where == "127.0.0.1:1"
    sent: Any = concurrent.futures.Future()  # in flight
    skipped = _finished(channel.not_sent((sent, 0.5)))
    assert _order.last_sent((skipped, 0.5))[0] is sent
    assert _order.last_sent((_finished(channel.not_sent((skipped, 0.5))), 0.5))[0] is sent  # a chain of them
    channel.track("caller", skipped, 0.1)
    assert channel.in_flight("caller") == (sent, 0.5)  # the one actually sent, still in flight
    assert channel.in_flight("someone else") is None  # callers are not ordered with each other
    sent.set_result(b"reply")
    assert channel.in_flight("caller") is None  # its reply came: nothing to wait for
    assert _order.answered((sent, 0.5))
    assert _order.answered((_finished(redis.ResponseError("WRONGTYPE")), 0.5))  # the server's own answer
    assert not _order.answered((_finished(redis.ConnectionError("reset")), 0.5))
    assert not _order.answered((_finished(error=RuntimeError("crashed")), 0.5))
    assert not _order.answered((_finished(cancelled=True), 0.5))
    slow: Any = concurrent.futures.Future()
    channel.track("slow", slow, 0.1)
    assert channel.in_flight("slow") == (slow, 0.5)  # waited for as long as the socket timeout, not 0.1 s
    channel.track("slower", slow, 2.0)
    assert channel.in_flight("slower") == (slow, 2.0)  # or its own per-server timeout, if that is longer


_SET_SOURCE = "redis.call('SET', KEYS[1], ARGV[1]) return 1"
SET = Lua("set", _SET_SOURCE, hashlib.sha1(_SET_SOURCE.encode()).hexdigest())


def test_asyncio_a_request_waiting_for_its_predecessor_is_never_sent_once_its_caller_is_cancelled(
        own_server: RedisServer) -> None:
    """A cancelled caller's request that had not yet been sent (it waited for the reply of the caller's previous
    request there) is dropped, not sent once that reply comes: a cancelled extend must not land later."""
    key = f"cancelled:{os.getpid()}"

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(f"{own_server.url}?socket_timeout={SOCKET_TIMEOUT}")
        channel = async_transport.Channel(client)
        warm, _ = await async_multiplex.run_scripts([_request.ScriptRequest(channel, ECHO, [], ["warm"])], 2.0,
                                                 _one)
        assert warm == {0: b"warm"}
        handles: list[Any] = []

        async def caller() -> None:
            done, sent = await async_multiplex.run_scripts(
                [_request.ScriptRequest(channel, ECHO, [], ["late"])], 0.02, _one)
            assert done == {}  # in flight: this task's next request there waits for its reply
            handles.extend(sent)
            await async_multiplex.run_scripts([_request.ScriptRequest(channel, SET, [key], ["sent"])], 2.0, _one)

        own_server.pause()
        try:
            task = asyncio.ensure_future(caller())
            await asyncio.sleep(0.1)  # the second request waits behind "late"
            assert handles
            assert not task.done()
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        finally:
            own_server.resume()
        assert await asyncio.wait_for(handles[0], 2.0) == b"late"  # the predecessor was answered ...
        await asyncio.sleep(0.2)
        assert await client.get(key) is None  # ... and the cancelled caller's request was never sent
        await channel.aclose()
        await client.aclose()

    asyncio.run(main())


def test_a_forked_child_is_not_blocked_by_a_lock_a_parents_thread_held_at_the_fork(name: str) -> None:
    """A node's job that finishes in one of the parent's threads at the moment of the fork holds that node's
    locks: the child's copies of them would stay held for ever (this hung a child in CI). Here a parent's thread
    holds every node's locks across the fork, deterministically."""
    with RedisNodes(5) as nodes:
        initialise_redlock(nodes.urls)
        locks = fencelock.connect(nodes.urls)
        locks.acquire(name + ":warm", ttl=5.0, wait=0).release()
        channels = locks.backend._channels  # type: ignore[attr-defined]
        held = [lock for channel in channels for lock in (channel._jobs_lock, channel._latest_lock)]
        forked = threading.Event()

        def hold() -> None:
            for lock in held:
                lock.acquire()
            forked.wait()
            for lock in held:
                lock.release()

        holder = threading.Thread(target=hold)
        holder.start()
        while not all(lock.locked() for lock in held):
            time.sleep(0.001)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for _ in range(5):
                    locks.acquire(name + ":child", ttl=5.0, wait=0).release()
                code = 0
            finally:
                os._exit(code)
        forked.set()
        holder.join()
        status = _child_status(pid, time.monotonic() + 20,
                               "the child did not finish: blocked on a lock held at the fork")
        assert os.waitstatus_to_exitcode(status) == 0
        locks.close()
