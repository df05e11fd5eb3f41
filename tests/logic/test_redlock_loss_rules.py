"""Redlock's rules for losses and for what clients see of them, with no server: the restart check and the
durable take-over (`NodeModel`), a new deployment's one floor, the quarantine a repair must outlast, the TTL
rule, a waiter's pauses, the identity of nodes, node_out once per change, and the majority an operator sees."""

from __future__ import annotations

import random

import pytest
from redis.exceptions import (
    BusyLoadingError,
    MasterDownError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from fencelock._logic.status import LockStatus, NodeView, majority_status, split_views
from fencelock._redis.keys import fence_match, glob_escape, scan_match
from fencelock._redis.redlock import (
    QUARANTINE_POLL,
    Answer,
    Gate,
    GateView,
    Identity,
    NodeModel,
    NodeState,
    Reply,
    check_ttl_within,
    decode,
    deployment_floor,
    deployment_id,
    durable_run,
    floor_seen,
    holder_ttl,
    live_ttl,
    newly_out,
    node_answer,
    node_states,
    not_independent,
    ready_in,
    required_delay,
    unavailable_pause,
    verdict,
)

DAY = 86_400.0


def _marked(durable: bool = False) -> NodeModel:
    node = NodeModel(ready=False, inc_run=None)
    node.gate(0.0, 10.0, 2.0, "n0", durable=durable, us=5_000_000)
    node.ready = True  # (as a fresh mark leaves it)
    return node


# -- a restart --------------------------------------------------------------------------------------------------

def test_a_marked_data_set_of_an_earlier_server_process_does_not_count_until_the_gate_judged_it() -> None:
    node = _marked()
    assert node.acquire("n", "a", 1, 5.0, 0.0).reply is Reply.GRANTED
    node.restart()                                               # from a snapshot: marker and keys as they were
    assert node.acquire("n", "b", 2, 5.0, 0.0).reply is Reply.UNREADY
    assert node.gate(1.0, 10.0, 2.0, "n1", durable=None).gate is Gate.RESTARTED   # ask whether it is durable
    assert node.ready                                            # (nothing written yet)
    assert node.gate(1.0, 10.0, 2.0, "n1", peek=True).left is None
    view = node.gate(1.0, 10.0, 2.0, "n1", durable=False)        # not durable: it may have lost writes
    assert (view.gate, view.nonce, view.left) == (Gate.QUARANTINED, "n1", 10.0)
    assert not node.ready
    assert not node.fresh
    assert node.hwm == {"n": 1}                                  # what it had stays; a repair only raises it
    assert node.mark("n0", "repair", 0, False, {}, 20.0, 0) == -1   # a repair planned before: another data set
    assert node.mark("n1", "repair", 0, False, {"n": 7}, 5.0, 0) == -2
    assert node.mark("n1", "repair", 0, False, {"n": 7}, 11.0, 0) == 1
    assert node.counts
    assert node.hwm == {"n": 7}


def test_a_durable_server_keeps_its_data_set_across_a_restart() -> None:
    node = _marked(durable=True)
    node.restart()
    assert node.gate(1.0, 10.0, 2.0, "n1", durable=True).gate is Gate.READY
    assert node.counts
    assert node.nonce == "n0"


def test_a_restart_is_taken_over_only_if_the_writer_was_durable_too() -> None:
    """A writer without fsync always may have lost its last grants, however durable the process after it is."""
    node = _marked(durable=False)
    node.restart()
    view = node.gate(1.0, 10.0, 2.0, "n1", durable=True)
    assert (view.gate, view.nonce) == (Gate.QUARANTINED, "n1")
    assert node.inc_durable is True  # (the new incarnation's writer is durable: its own restart is taken over)


def test_a_replica_promoted_in_place_of_a_durable_writer_is_quarantined() -> None:
    """Its copy came by asynchronous replication: it may lack the writer's last grants."""
    node = _marked(durable=True)
    copy = node.snapshot()
    node.acquire("n", "a", 1, 5.0, 0.0)        # acknowledged by the master, not replicated yet
    node.restore(copy)
    node.promote()
    assert node.gate(1.0, 10.0, 2.0, "n1", durable=None).gate is Gate.RESTARTED
    view = node.gate(1.0, 10.0, 2.0, "n1", durable=True)
    assert (view.gate, view.nonce) == (Gate.QUARANTINED, "n1")
    node.restart()                             # the promoted replica's own durable restart is taken over
    assert node.gate(2.0, 10.0, 2.0, "n2", durable=True).nonce == "n1"


def test_a_nodes_clock_set_back_neither_stretches_nor_shortens_its_quarantine() -> None:
    """Set back behind the first look, the node cannot tell how long was waited: the whole quarantine again from
    then, which is never less than what was left, and never more than the quarantine (not a day)."""
    node = _marked()
    node.restart()
    node.gate(1000.0, 10.0, 2.0, "n1", durable=False)           # quarantined from t=1000 until 1010
    assert node.gate(1004.0, 10.0, 2.0, "n1").left == 6.0
    view = node.gate(1004.0 - 86_400.0, 10.0, 2.0, "n1")      # the clock jumps back a day
    assert (view.gate, view.left) == (Gate.QUARANTINED, 10.0)
    assert node.gate(1004.0 - 86_400.0 + 9.0, 10.0, 2.0, "n1").left == 1.0
    assert node.gate(1004.0 - 86_400.0 + 10.0, 10.0, 2.0, "n1").gate is Gate.REPAIRABLE


def test_a_look_that_writes_asks_the_durability_of_a_writer_not_recorded_yet() -> None:
    node = NodeModel(ready=True, nonce="n0", inc_run=0)   # (an older version's incarnation: none recorded)
    assert node.gate(0.0, 10.0, 2.0, "n1", durable=None).gate is Gate.RESTARTED
    assert node.gate(0.0, 10.0, 2.0, "n1", peek=True, durable=None).gate is Gate.READY  # a peek does not ask
    assert node.gate(0.0, 10.0, 2.0, "n1", durable=True).gate is Gate.READY
    assert node.inc_durable is True
    assert node.gate(0.0, 10.0, 2.0, "n1", durable=None).gate is Gate.READY            # asked once


def test_durable_only_with_aof_and_fsync_always_read_from_that_very_process() -> None:
    info = {"run_id": "abc"}
    assert durable_run("yes", "always", info) == "abc"
    assert durable_run("yes", "everysec", info) == ""
    assert durable_run("no", "always", info) == ""


def test_a_snapshot_brings_back_the_data_set_as_it_was() -> None:
    node = _marked()
    saved = node.snapshot()
    node.acquire("n", "a", 3, 5.0, 0.0)
    node.restore(saved)
    node.restart()
    assert node.hwm == {}
    assert not node.locks
    assert not node.counts


# -- a new deployment ------------------------------------------------------------------------------------------------

def test_a_new_deployment_takes_one_floor_the_latest_first_look_whatever_order_the_nodes_are_listed_in() -> None:
    views = [GateView(Gate.FRESH, "b", 5.0, 7_000), GateView(Gate.FRESH, "a", 5.0, 9_000), None]
    assert deployment_floor(views) == 9_000
    assert deployment_id(views) == deployment_id(views[::-1])     # the digest does not follow the list order
    assert deployment_id(views) != deployment_id([views[0], GateView(Gate.FRESH, "c"), None])
    node = NodeModel(ready=False, inc_run=None)
    fresh = node.gate(0.0, 10.0, 2.0, "n", us=4_000_000)
    assert fresh.floor == 4_001_000                               # the first look's µs, + 1 ms
    assert node.mark("n", "claim", 0, False, {}, 0.0, 0, "d") == 1
    assert node.mark("n", "fresh", 9_000, False, {}, 0.0, 0, "d") == 1
    assert node.floor == 9_000


def test_a_new_deployment_can_be_granted_and_shows_no_quarantine_end_until_one_started() -> None:
    unseen = NodeModel(ready=False, inc_run=None).gate(0.0, 60.0, 5.0, "n", peek=True)
    assert (unseen.gate, unseen.left) == (Gate.FRESH, None)
    states = node_states(["a", "b", "c"], [unseen] * 3, 1000.0)
    assert [s.quarantine_left for s in states] == [None] * 3
    assert verdict(states, 3).available
    restarted = node_states(["a", "b", "c"], [GateView(Gate.READY), GateView(Gate.READY, floor=1),
                                              GateView(Gate.QUARANTINED, "", None)], 0.0)
    assert verdict(restarted, 3).available
    waiting = node_states(["a", "b", "c"], [GateView(Gate.READY), GateView(Gate.QUARANTINED, "", None),
                                            GateView(Gate.QUARANTINED, "", None)], 0.0)
    assert verdict(waiting, 3).eta is None                        # it starts at the next look: not known
    assert GateView.decode([b"fresh", b"", -1, b"0"]).left is None
    assert GateView.decode([b"fresh", b"n", 0, b"5"]).left == 0.0


# -- repairs and TTLs ------------------------------------------------------------------------------------------------

def test_a_repair_outlasts_the_longest_lease_still_valid_on_the_others() -> None:
    node = NodeModel()
    node.acquire("n", "a", 1, 30.0, 0.0)
    node.release("n", "a", 1)
    node.acquire("n", "b", 2, 5.0, 1.0)
    assert node.live_ttl(10.0) == 30.0                             # the 30 s lease may be valid till 30
    assert node.live_ttl(31.0) == 0.0                              # ... and after that nothing is
    assert required_delay(10.0, [30.0, 5.0]) == 30.0
    assert required_delay(10.0, []) == 10.0
    assert live_ttl([(b"30000", 31_000.0), (b"5000", 6_000.0)], 10_000.0) == 30.0
    assert live_ttl([(b"30000", 31_000.0)], 31_000.0) == 0.0
    quarantined = NodeModel(ready=False, inc_run=None)
    quarantined.gate(0.0, 10.0, 2.0, "n")
    assert quarantined.gate(1.0, 30.0, 2.0, "n").left == 29.0     # the gate keeps the longest asked for
    assert quarantined.gate(2.0, 10.0, 2.0, "n").left == 28.0     # ... a shorter one does not shorten it


def test_a_ttl_longer_than_the_repair_delay_is_refused_naming_both_and_the_lock() -> None:
    check_ttl_within(60_000, 60_000, "x")
    with pytest.raises(ValueError, match=r"ttl 90 s .* repair_delay of 60 s.*repair_delay >= 90 \(lock 'x'\)"):
        check_ttl_within(90_000, 60_000, "x")


def test_a_prefix_with_glob_characters_matches_only_itself() -> None:
    assert glob_escape("app[1]*?\\") == "app\\[1\\]\\*\\?\\\\"
    assert fence_match("app[1]") == "app\\[1\\]:{*}:fence"
    assert scan_match("jobs:*", "app[1]") == "app\\[1\\]:{jobs:*}:lock"


# -- a waiter ---------------------------------------------------------------------------------------------------------

def test_a_node_that_is_not_ready_is_not_free_for_a_waiter() -> None:
    unready, held, granted = Answer(Reply.UNREADY), Answer(Reply.HELD, 4, 27.0), Answer(Reply.GRANTED, 5)
    assert holder_ttl([unready, held, granted], 3) == 27.0        # (was 0.0: a spin)
    assert holder_ttl([unready, held, granted], 3, [2.0, None, None]) == 2.0  # the quarantine ends first
    assert holder_ttl([unready, unready, granted], 3) is None     # not by any time known here
    assert holder_ttl([Answer(Reply.FAILED), held, granted], 3) == 0.0        # a silent node may be free


def test_quorum_unavailable_is_retried_soon_once_then_when_the_quarantine_ends_at_most_a_poll_apart() -> None:
    rng = random.Random(1)
    assert unavailable_pause(1, 50.0, rng) <= 0.01
    assert QUARANTINE_POLL <= unavailable_pause(2, 50.0, rng) <= QUARANTINE_POLL * 1.1
    assert 0.3 <= unavailable_pause(2, 0.3, rng) <= 0.33
    assert unavailable_pause(5, None, rng) <= 0.25


def test_refusals_teach_the_nodes_floors() -> None:
    raw = [0, 1_000_005, -1, 1_000_000, b"r1"]
    answer = decode(raw)
    assert (answer.reply, answer.floor, answer.run) == (Reply.STALE, 1_000_000, "r1")
    assert floor_seen(7, [answer, None, Answer(Reply.FAILED)]) == 1_000_000
    assert node_answer(None).slow
    assert not node_answer(ConnectionError()).slow


# -- who the nodes are --------------------------------------------------------------------------------------------

def test_two_urls_of_one_server_or_a_replica_are_named() -> None:
    shown = ["unix:///s", "redis://127.0.0.1:7000/0", "redis://127.0.0.1:7001/0"]
    same = [Identity("r1"), Identity("r1"), Identity("r2")]
    assert not_independent(shown, same) == ("url: unix:///s and redis://127.0.0.1:7000/0 reach one server "
                                            "(run_id r1...): Redlock needs independent nodes; list each server once")
    replica = [Identity("r1"), Identity("r2"), Identity("r3", "127.0.0.1:7000")]
    places = [{"/s"}, {"127.0.0.1:7000", "loopback:7000"}, {"127.0.0.1:7001"}]
    found = not_independent(shown, replica, places)
    assert found is not None
    assert found.startswith("url: redis://127.0.0.1:7001/0 is a replica (of 127.0.0.1:7000, listed as "
                            "redis://127.0.0.1:7000/0)")
    assert not_independent(shown, [Identity("r1"), None, Identity("r2")]) is None
    assert Identity.from_info({"run_id": "x"}, {"role": "slave", "master_host": "h", "master_port": 1}) == \
        Identity("x", "h:1")


# -- what is told, and how often ----------------------------------------------------------------------------------

def _state(state: str, ready: bool = False) -> NodeState:
    return NodeState("a", True, ready, state, None, None, False)


def test_node_out_is_told_once_per_change_of_a_nodes_state() -> None:
    changed, reported = newly_out({}, [_state("fresh"), _state("ready", True)])
    assert (changed, reported) == ([0], {0: "fresh"})
    changed, reported = newly_out(reported, [_state("fresh"), _state("ready", True)])
    assert changed == []                                           # a retry meeting the same: nothing
    changed, reported = newly_out(reported, [_state("quarantined"), _state("ready", True)])
    assert changed == [0]
    changed, reported = newly_out(reported, [_state("ready", True), _state("ready", True)])
    assert (changed, reported) == ([], {})                          # back: a later outage is news again


def test_ready_in_says_when_each_node_could_count_again() -> None:
    views = [GateView(Gate.READY), GateView(Gate.QUARANTINED, "n", 4.0), None, GateView(Gate.REPAIRABLE)]
    assert ready_in(views) == [0.0, 4.0, None, 0.0]


# -- what an operator sees ---------------------------------------------------------------------------------------

def _view(pttl: int, fence: int, holder: str = "") -> NodeView:
    return NodeView(pttl, fence, 0, holder)


def test_free_only_when_no_holder_could_have_a_quorum_even_with_every_silent_node() -> None:
    held_on_one = [_view(900, 9, "x"), None, _view(-2, 8)]
    assert majority_status("n", held_on_one, 3) is None             # the silent node may be x's second
    assert majority_status("n", [_view(-2, 8), None, _view(-2, 8)], 3) == LockStatus("n", False, 8, None, None)
    assert majority_status("n", [_view(-2, 8), None, None], 3) is None
    assert split_views(["a", "b", "c"], held_on_one) == "a: held (holder 1); b: no answer; c: free"


def test_a_rolling_restart_is_indistinguishable_from_a_new_deployment_and_still_counts_above() -> None:
    """Every node emptied one at a time: all fresh again. The new floor is a first look after the last loss,
    above every fence counted from the earlier floor (the clock assumption)."""
    nodes = [NodeModel(ready=False, inc_run=None) for _ in range(3)]
    for i, node in enumerate(nodes):
        node.gate(0.0, 10.0, 2.0, f"{i}", us=1_000_000)
    deployment = deployment_id([GateView(Gate.FRESH, f"{i}") for i in range(3)])
    for i, node in enumerate(nodes):
        node.mark(f"{i}", "claim", 0, False, {}, 0.0, 0, deployment)
        node.mark(f"{i}", "fresh", 1_001_000, False, {}, 0.0, 0, deployment)
    fence = max(node.acquire("n", "a", 1_001_005, 5.0, 0.0).hwm for node in nodes)
    for node in nodes:                                              # one at a time, nobody looking
        node.lose_data()
        node.restart()
    views = [node.gate(DAY, 10.0, 2.0, f"{i}.1", us=2_000_000) for i, node in enumerate(nodes)]
    assert all(view.gate is Gate.FRESH for view in views)
    assert deployment_floor(views) > fence


def test_a_server_error_is_told_apart_from_a_node_that_is_down_or_not_ready() -> None:
    """A server that refuses the request (OOM, WRONGTYPE, NOPERM) answered: its error is kept for the message;
    no answer, a network fault, a replica or a server not ready yet say nothing of the kind."""
    assert node_answer(OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")).error.startswith(
        "OOM command not allowed")
    assert node_answer(ResponseError("WRONGTYPE Operation against a key")).error.startswith("WRONGTYPE")
    assert node_answer(NoPermissionError("this user has no permissions")).error.startswith("NOPERM")
    for quiet in (BusyLoadingError("Redis is loading"), RedisConnectionError("refused"), ReadOnlyError("replica"),
                  MasterDownError("link down"), ResponseError("NOREADY not ready"), ResponseError("BUSY script")):
        assert node_answer(quiet).error == "", quiet
    assert node_answer(None).slow
