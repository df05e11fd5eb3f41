"""The Redlock node scripts on a real server, held to their specification (`NodeModel`): the same answers on
random sequences, data losses included, and a floor from the node's clock kept as exact digits; then the
configurations `connect()` refuses."""

from __future__ import annotations

import contextlib
import os
import random
import time
from typing import Any

import pytest

import fencelock
from fencelock._redis.keys import redis_keys
from fencelock._redis.redlock import Gate, GateView, NodeModel, Reply, decode
from fencelock._scripts import REDLOCK_ACQUIRE, REDLOCK_GATE, REDLOCK_MARK, REDLOCK_RELEASE
from fencelock.testing.servers import RedisNodes, RedisServer

from . import _support

five = _support.five   # the same fixture, for this module's tests


GATE_KEYS = ["fencelock:redlock:node", "fencelock:redlock:incarnation", "fencelock:redlock:seen"]
TTLS = "fencelock:redlock:ttls"


def _run_id(raw: Any) -> str:
    return str(raw.info("server")["run_id"])


def _acquire(raw: Any, name: str, token: str, t: int, ttl_ms: int = 60_000) -> Any:
    keys = redis_keys(name)
    return raw.eval(REDLOCK_ACQUIRE.source, 6, keys.lock, keys.fence, GATE_KEYS[0], keys.waiters, GATE_KEYS[1],
                    TTLS, token, ttl_ms, t)


def test_the_node_script_answers_exactly_as_the_model_does(own_server: RedisServer) -> None:
    raw: Any = own_server.client()
    raw.set("fencelock:redlock:node", "marker")
    raw.hset(GATE_KEYS[1], "run", _run_id(raw))  # marked by this server process: it counts
    model = NodeModel()
    rng = random.Random(5)
    names = ["a", "b"]
    for step in range(400):
        name = rng.choice(names)
        keys = redis_keys(name)
        token = rng.choice(["t1", "t2", "t3"])
        t = rng.randint(1, 12)
        if rng.random() < 0.7:
            ttl = rng.choice([60_000, 90_000])
            got = decode(_acquire(raw, name, token, t, ttl))
            expected = model.acquire(name, token, t, ttl / 1000, 0.0)
            assert (got.reply, got.hwm) == (expected.reply, expected.hwm), (step, name, token, t)
            # Each TTL granted here, with when its last lease expires: what a repair's quarantine must outlast.
            assert {int(ttl) / 1000 for ttl in raw.zrange(TTLS, 0, -1)} == set(model.ttls), step
        else:
            code = raw.eval(REDLOCK_RELEASE.source, 4, keys.lock, keys.fence, keys.waiters, keys.wake, token, t)
            assert (code == 1) == model.release(name, token, t), (step, name, token, t)
            assert int(raw.get(keys.fence) or 0) == model.hwm.get(name, 0), (step, name)
    assert model.hwm  # the sequence granted something


class _Node:
    """One real server and its model side by side: restarts empty, snapshots (SAVE) and restarts from them."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.raw: Any = server.client()
        self.model = NodeModel(ready=False, inc_run=None)
        self.snapshot: dict[str, object] | None = None

    def save(self) -> None:
        self.raw.save()
        self.snapshot = self.model.snapshot()

    def restart(self, from_snapshot: bool) -> None:
        """Kill the server (no shutdown save) and start it again: from the last snapshot, or empty."""
        if not from_snapshot:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.server.dir, "dump.rdb"))
        self.server.kill()
        self.server.restart()
        self.raw = self.server.client()
        if from_snapshot and self.snapshot is not None:
            self.model.restore(self.snapshot)
        else:
            self.model.lose_data()
            self.snapshot = None
        self.model.restart()


def test_the_gate_and_mark_scripts_answer_exactly_as_the_model_does(own_server: RedisServer) -> None:
    """`redlock_gate.lua` and `redlock_mark.lua` (claim, fresh, raise, repair, plain), and the floor and the restart
    check in `redlock_acquire.lua`, against `NodeModel` on random sequences: data losses (FLUSHALL), restarts empty,
    restarts from a snapshot (a rollback), a durable server's restart (the gate told it is durable) included. A
    delay or window of 0 or of a day makes the node's clock irrelevant to the answers; a floor taken from the
    clock (a new deployment's mark) is read back and must be the server's time."""
    node = _Node(own_server)
    node.raw.flushall()
    rng = random.Random(13)
    day = 86_400_000
    fence_key = redis_keys("a").fence
    seen: set[tuple[str, object]] = set()
    for step in range(1200):
        op = rng.choices(["gate", "mark", "acquire", "lose", "legacy", "save", "restart", "rollback"],
                         [10, 10, 5, 1, 1, 1, 0.4, 0.6])[0]
        model, raw = node.model, node.raw
        nonce = rng.choice(["n1", "n2", model.nonce or "n3"])
        if op == "gate":
            delay, window = rng.choice([(0, 0), (day, day), (day, 0)])
            peek = rng.random() < 0.2
            durable = rng.choice([True, False, False, None])  # None: the client has not asked yet ("?")
            run = _run_id(raw) if durable else "?" if durable is None else ""
            got = GateView.decode(raw.eval(REDLOCK_GATE.source, 3, *GATE_KEYS, delay, window, nonce, int(peek), run))
            expected = model.gate(0.0, delay / 1000, window / 1000, nonce, peek, durable)
            if model.nonce is not None and model.born_us == 0:  # (a first look: the model takes the node's clock)
                model.born_us = int(raw.hget(GATE_KEYS[1], "born")) * 1000
                expected = GateView(expected.gate, expected.nonce, expected.left,
                                    model.born_us + 1000 if expected.gate is Gate.FRESH else expected.floor)
            assert (got.gate, got.nonce, got.floor) == (expected.gate, expected.nonce, expected.floor), (step, op)
            assert (got.left is None) == (expected.left is None), step
            seen.add(("gate", got.gate.value))
        elif op == "mark":
            mode = rng.choice(["claim", "fresh", "raise", "repair", "plain"])
            deployment = rng.choice(["d1", "d2"])
            floor = rng.choice([0, 7, 2**52 + 1])
            value = rng.randint(1, 20)
            third = deployment if mode in ("claim", "fresh") else floor
            fourth = floor if mode == "fresh" else 0  # a new deployment's floor (`deployment_floor`)
            code = raw.eval(REDLOCK_MARK.source, 3, GATE_KEYS[0], GATE_KEYS[1], fence_key, nonce, mode, third,
                            fourth, value)
            expected_code = model.mark(nonce, mode, floor, False, {fence_key: value}, 0.0, 0, deployment)
            assert code == expected_code, (step, mode)
            seen.add((mode, code))
        elif op == "acquire":
            t = rng.choice([rng.randint(1, 25), 2**52 + rng.randint(0, 3)])
            got_answer = decode(_acquire(raw, "a", "tok", t))
            expected_answer = model.acquire(fence_key, "tok", t, 60.0, 0.0)
            assert (got_answer.reply, got_answer.hwm) == (expected_answer.reply, expected_answer.hwm), step
            assert got_answer.floor == expected_answer.floor, step
            seen.add(("acquire", got_answer.reply.value))
            if got_answer.reply is Reply.GRANTED:
                raw.delete(redis_keys("a").lock)
                model.locks.clear()
        elif op == "lose":
            raw.flushall()
            model.lose_data()
        elif op == "legacy":
            raw.set(GATE_KEYS[2], "1")
            model.legacy = True
        elif op == "save":
            node.save()
        else:
            node.restart(from_snapshot=op == "rollback")
            seen.add((op, model.ready))
        assert int(node.raw.get(fence_key) or 0) == node.model.hwm.get(fence_key, 0), step
    # The sequence went through every state and every answer of interest.
    assert {("gate", g.value) for g in (Gate.READY, Gate.FRESH, Gate.QUARANTINED, Gate.REPAIRABLE)} <= seen
    assert {("claim", 1), ("claim", -1), ("fresh", 1), ("repair", 1), ("repair", -2), ("plain", 1)} <= seen
    assert {("acquire", "granted"), ("acquire", "stale"), ("acquire", "unready")} <= seen
    assert ("rollback", True) in seen  # a snapshot with its marker came back at least once


def test_a_floor_from_the_clock_is_the_nodes_time_in_microseconds_as_exact_digits(own_server: RedisServer) -> None:
    raw: Any = own_server.client()
    raw.flushall()
    keys = GATE_KEYS
    view = GateView.decode(raw.eval(REDLOCK_GATE.source, 3, *keys, 0, 0, "n", 0, ""))
    assert view.gate is Gate.REPAIRABLE
    before = int(time.time() * 1_000_000)
    assert raw.eval(REDLOCK_MARK.source, 2, keys[0], keys[1], "n", "repair", 5, 1) == 1
    marker = raw.get(keys[0]).decode()
    assert marker.startswith("floor:")
    floor = int(marker[6:])
    assert before - 5_000_000 < floor < int(time.time() * 1_000_000) + 5_000_000
    refused = _acquire(raw, "x", "t", 1, ttl_ms=1000)
    assert refused[1] == floor  # exact: no digit lost on the way through a Lua double
    assert refused[3] == floor
    granted = _acquire(raw, "x", "t", floor + 1, ttl_ms=1000)
    assert granted[:2] == [1, floor + 1]
    assert int(raw.get(redis_keys("x").fence)) == floor + 1


# -- configuration ----------------------------------------------------------------------------------------------

def test_redlock_configuration_errors(five: RedisNodes) -> None:
    urls = [node.url for node in five.nodes]
    with pytest.raises(ValueError, match="at least 3"):
        fencelock.connect(urls[:2])
    with pytest.raises(ValueError, match="listed twice"):
        fencelock.connect([urls[0], urls[1], urls[0].replace("127.0.0.1", "localhost")])
    with pytest.raises(ValueError, match="not a Redis Cluster"):
        fencelock.connect([*urls[:2], "redis+cluster://127.0.0.1:7000"])
    with pytest.raises(TypeError, match="mixed"):
        fencelock.connect([urls[0], urls[1], five.nodes[2].client()])
    with pytest.raises(ValueError, match="node_timeout"):
        fencelock.connect(urls, node_timeout=-1)
