"""The Redlock node scripts on a real server, held to their specification (`NodeModel`): the same answers on
random sequences, data losses included, and a floor from the node's clock kept as exact digits; then the
configurations `connect()` refuses."""

from __future__ import annotations

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


def test_the_node_script_answers_exactly_as_the_model_does(own_server: RedisServer) -> None:
    raw: Any = own_server.client()
    raw.set("fencelock:redlock:node", "marker")
    model = NodeModel()
    rng = random.Random(5)
    names = ["a", "b"]
    for step in range(400):
        name = rng.choice(names)
        keys = redis_keys(name)
        token = rng.choice(["t1", "t2", "t3"])
        t = rng.randint(1, 12)
        if rng.random() < 0.7:
            got = decode(raw.eval(REDLOCK_ACQUIRE.source, 4, keys.lock, keys.fence, "fencelock:redlock:node",
                                  keys.waiters, token, 60_000, t))
            expected = model.acquire(name, token, t, 60.0, 0.0)
            assert (got.reply, got.hwm) == (expected.reply, expected.hwm), (step, name, token, t)
        else:
            code = raw.eval(REDLOCK_RELEASE.source, 4, keys.lock, keys.fence, keys.waiters, keys.wake, token, t)
            assert (code == 1) == model.release(name, token, t), (step, name, token, t)
            assert int(raw.get(keys.fence) or 0) == model.hwm.get(name, 0), (step, name)
    assert model.hwm  # the sequence granted something


def test_the_gate_and_mark_scripts_answer_exactly_as_the_model_does(own_server: RedisServer) -> None:
    """`redlock_gate.lua` and `redlock_mark.lua` (claim, fresh, raise, repair, plain), and the floor in
    `redlock_acquire.lua`, against `NodeModel` on random sequences, data losses (FLUSHALL) included. A delay
    or window of 0 or of a day makes the node's clock irrelevant to the answers."""
    raw: Any = own_server.client()
    raw.flushall()
    model = NodeModel(ready=False)
    rng = random.Random(13)
    gate_keys = ["fencelock:redlock:node", "fencelock:redlock:incarnation", "fencelock:redlock:seen"]
    day = 86_400_000
    fence_key = redis_keys("a").fence
    seen: set[tuple[str, object]] = set()
    for step in range(600):
        op = rng.choice(["gate", "gate", "mark", "mark", "acquire", "lose", "legacy"])
        nonce = rng.choice(["n1", "n2", model.nonce or "n3"])
        if op == "gate":
            delay, window = rng.choice([(0, 0), (day, day), (day, 0)])
            peek = rng.random() < 0.2
            got = GateView.decode(raw.eval(REDLOCK_GATE.source, 3, *gate_keys, delay, window, nonce, int(peek)))
            expected = model.gate(0.0, delay / 1000, window / 1000, nonce, peek)
            assert (got.gate, got.nonce, got.floor) == (expected.gate, expected.nonce, expected.floor), step
            seen.add(("gate", got.gate.value))
        elif op == "mark":
            mode = rng.choice(["claim", "fresh", "raise", "repair", "plain"])
            deployment = rng.choice(["d1", "d2"])
            floor = rng.choice([0, 7, 2**52 + 1])
            value = rng.randint(1, 20)
            third = deployment if mode in ("claim", "fresh") else floor
            code = raw.eval(REDLOCK_MARK.source, 3, gate_keys[0], gate_keys[1], fence_key, nonce, mode, third, 0,
                            value)
            expected_code = model.mark(nonce, mode, floor, False, {fence_key: value}, 0.0, 0, deployment)
            assert code == expected_code, (step, mode)
            seen.add((mode, code))
        elif op == "acquire":
            t = rng.choice([rng.randint(1, 25), 2**52 + rng.randint(0, 3)])
            keys = redis_keys("a")
            got_answer = decode(raw.eval(REDLOCK_ACQUIRE.source, 4, keys.lock, keys.fence, gate_keys[0],
                                         keys.waiters, "tok", 60_000, t))
            expected_answer = model.acquire(fence_key, "tok", t, 60.0, 0.0)
            assert (got_answer.reply, got_answer.hwm) == (expected_answer.reply, expected_answer.hwm), step
            seen.add(("acquire", got_answer.reply.value))
            if got_answer.reply is Reply.GRANTED:
                raw.delete(keys.lock)
                model.locks.clear()
        elif op == "lose":
            raw.flushall()
            model.lose_data()
        else:
            raw.set(gate_keys[2], "1")
            model.legacy = True
        assert int(raw.get(fence_key) or 0) == model.hwm.get(fence_key, 0), step
    # The sequence went through every state and every answer of interest.
    assert {("gate", g.value) for g in (Gate.READY, Gate.FRESH, Gate.QUARANTINED, Gate.REPAIRABLE)} <= seen
    assert {("claim", 1), ("claim", -1), ("fresh", 1), ("repair", 1), ("repair", -2), ("plain", 1)} <= seen
    assert {("acquire", "granted"), ("acquire", "stale"), ("acquire", "unready")} <= seen


def test_a_floor_from_the_clock_is_the_nodes_time_in_microseconds_as_exact_digits(own_server: RedisServer) -> None:
    raw: Any = own_server.client()
    raw.flushall()
    keys = ["fencelock:redlock:node", "fencelock:redlock:incarnation", "fencelock:redlock:seen"]
    view = GateView.decode(raw.eval(REDLOCK_GATE.source, 3, *keys, 0, 0, "n", 0))
    assert view.gate is Gate.REPAIRABLE
    before = int(time.time() * 1_000_000)
    assert raw.eval(REDLOCK_MARK.source, 2, keys[0], keys[1], "n", "repair", 5, 1) == 1
    marker = raw.get(keys[0]).decode()
    assert marker.startswith("floor:")
    floor = int(marker[6:])
    assert before - 5_000_000 < floor < int(time.time() * 1_000_000) + 5_000_000
    lock = redis_keys("x")
    refused = raw.eval(REDLOCK_ACQUIRE.source, 4, lock.lock, lock.fence, keys[0], lock.waiters, "t", 1000, 1)
    assert refused[1] == floor  # exact: no digit lost on the way through a Lua double
    granted = raw.eval(REDLOCK_ACQUIRE.source, 4, lock.lock, lock.fence, keys[0], lock.waiters, "t", 1000,
                       floor + 1)
    assert granted == [1, floor + 1]
    assert int(raw.get(lock.fence)) == floor + 1


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
