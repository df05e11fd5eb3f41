"""The Redlock start-up and repair protocol, checked on an in-memory model (`redlock_protocol.py`) before any
server is involved.

Over every interleaving of a small scope, and at random over longer runs, it checks liveness (no dead end while a
quorum is up) as well as safety, with nodes that restart empty, restart from a snapshot (rolled back, their marker
back), or lose their data one at a time with no look between (a rolling restart); the older protocol fails the
liveness check, and the variants without claims, without a floor, without the restart check or without a new
deployment's clock floor show why each exists. The fencing rule itself is checked in `test_redlock_model.py`.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fencelock._redis.redlock import quorum

from .redlock_protocol import (
    DELAY,
    EPS,
    PTTL,
    NoClaim,
    NoFloor,
    NoFreshFloor,
    NoRestartCheck,
    OldProtocol,
    Protocol,
    ProtoWorld,
    explore,
    moves,
)
from .test_redlock_model import NAME

SCOPE = {"clients": 2, "crashes": 1, "ticks": 2, "attempts": 2}
ROLLBACK = {"clients": 1, "crashes": 1, "ticks": 2, "attempts": 2, "saves": 1}
"""A snapshot saved at any step, and a node restarted from it (or empty) at any later step."""
ROLLING = {"clients": 2, "crashes": 3, "ticks": 1, "attempts": 2}
"""Up to three losses, one node at a time, at any steps: a rolling restart of every node, or of a majority, with
or without a look between; a second client to start the deployment again after it."""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("down", [(), (2,)])
def test_exhaustively_for_three_nodes_startup_and_repair_have_no_dead_end_and_stay_safe(down: tuple[int, ...]) -> None:
    """Liveness and safety of start-up and repair, over every interleaving of a small scope: 3 nodes (one of
    them down at first contact, or none), two concurrent clients crashing at any step, one node losing its
    data at any step, the clock passing the window and the quarantine, two attempts anywhere."""
    states, violation = explore(ProtoWorld.new(Protocol(), 3, down), **SCOPE)
    assert violation is None, violation
    assert states > 100_000, states  # the scope really was explored (168,409 and 174,369 when written)


@pytest.mark.timeout(600)
def test_exhaustively_for_three_nodes_a_node_restarted_from_a_snapshot_counts_only_after_its_quarantine() -> None:
    """A snapshot taken at any step, the node restarted from it (its marker and incarnation back, the writes after
    it gone) or empty at any later step: no fence repeats or goes backwards, no two leases overlap, no dead end.
    Without the restart check (the rolled-back data set counting whatever its marker says), leases overlap."""
    states, violation = explore(ProtoWorld.new(Protocol(), 3), **ROLLBACK)
    assert violation is None, violation
    assert states > 50_000, states  # (71,039 when written)
    _, unchecked = explore(ProtoWorld.new(NoRestartCheck(), 3), **ROLLBACK)
    assert unchecked is not None
    assert "overlaps" in unchecked or "granted after" in unchecked, unchecked


@pytest.mark.timeout(600)
def test_exhaustively_for_three_nodes_losses_one_at_a_time_never_hand_out_a_lower_fence() -> None:
    """Losses spread out over time, one node at a time, with or without a look between (a rolling restart of
    every node, or of a majority): fences never repeat or go backwards, and leases never overlap unless every node
    was blank at once (nothing left anywhere of the earlier lease: a new deployment). Without a clock floor for a
    new deployment's marks, such a wipe hands out fence 1 again."""
    states, violation = explore(ProtoWorld.new(Protocol(), 3), **ROLLING)
    assert violation is None, violation
    assert states > 250_000, states  # (326,180 when written)
    _, counted_from_one = explore(ProtoWorld.new(NoFreshFloor(), 3), **ROLLING)
    assert counted_from_one is not None
    assert counted_from_one.startswith("fence 1 granted after fence 1"), counted_from_one


def test_exhaustively_marking_a_new_deployment_without_claims_lets_two_grants_share_a_fence() -> None:
    """Why claims: a look that straddles another client's marks and grant and a node's loss sees every node
    fresh; marking from it hands the emptied node fence 1 again while the first grant is valid."""
    _, violation = explore(ProtoWorld.new(NoClaim(), 3), **SCOPE)
    assert violation is not None
    assert violation.startswith("fence 1 granted after fence 1"), violation
    # A clock floor on the new deployment's marks keeps that fence above, but the leases still overlap.
    _, floored = explore(ProtoWorld.new(NoClaim(fresh_floor=True), 3), **SCOPE)
    assert floored is not None
    assert floored.startswith("grant"), floored
    assert "overlaps" in floored, floored


@pytest.mark.parametrize("down", [(), (2,)])
def test_exhaustively_the_old_protocol_has_a_dead_end(down: tuple[int, ...]) -> None:
    """The bug of issue 13, found by the same search: two clients starting at once (or one node down at first
    contact) leave nodes seen, unmarked and unrepairable for ever."""
    _, violation = explore(ProtoWorld.new(OldProtocol(), 3, down), **SCOPE)
    assert violation is not None
    assert violation.startswith("dead end (old protocol)"), violation


def test_the_old_protocol_dead_ends_when_two_clients_look_at_once() -> None:
    """The counterexample step by step: A looks at node 0, B at nodes 0-2 (0 is no longer fresh to B), A at
    1-2 (no longer fresh to A): neither saw all fresh, none is ready, so no repair can ever start."""
    for protocol, dead in ((OldProtocol(), True), (Protocol(), False)):
        world = ProtoWorld.new(protocol, 3)
        world.start_client()
        world.start_client()
        world.step(0)
        for _ in range(3):
            world.step(1)
        world.step(0)
        world.step(0)
        while world.clients:  # both looked: the old protocol found nothing to do, the new one marks
            world.step(0)
        assert all(node.counts for node in world.nodes) is not dead, protocol.name
        assert world.recovers() is not dead, protocol.name


def _floor_scenario(protocol: Protocol) -> ProtoWorld:
    """3 nodes in use; fence 5 is granted on {0, 1} while node 2 is down; then 0 and 1 both lose their data and
    node 2 (which never saw fence 5) comes back: no quorum of ready nodes remembers fence 5."""
    world = ProtoWorld.new(protocol, 3)
    for node in world.nodes:
        node.ready, node.inc_run = True, node.run
    world.up = {0, 1}
    world.nodes[0].hwm[NAME] = world.nodes[1].hwm[NAME] = 4
    assert world.attempt()
    assert world.grants[-1][0] == 5
    world.lose(0)
    world.lose(1)
    world.up = {0, 1, 2}
    return world


@pytest.mark.parametrize(("protocol", "safe"), [(Protocol(), True), (NoFloor(), False)])
def test_a_majority_that_lost_its_data_gets_a_floor_above_every_earlier_fence(protocol: Protocol,
                                                                              safe: bool) -> None:
    """Why the floor exists: repaired from the one ready node (which never saw fence 5), the majority would give
    fence 1 next; the floor from the clock puts it above. Without the floor, liveness holds but the fence goes
    backwards."""
    world = _floor_scenario(protocol)
    assert world.recovers()
    world.clients = []
    world.start_client()
    while world.clients:
        world.step(0)
    world.now += DELAY + EPS
    world.start_client()
    while world.clients:
        world.step(0)
    world.now += PTTL
    assert world.attempt()
    assert (world.violation() is None) is safe, world.grants


class ProtocolModel(RuleBasedStateMachine):
    """The same events at random, on 3 or 5 nodes and longer runs than the exhaustive scope."""

    def __init__(self) -> None:
        super().__init__()
        self.world = ProtoWorld.new(Protocol(), 3)

    @initialize(n=st.sampled_from([3, 5]), down=st.integers(0, 2), durable=st.integers(0, 5))
    def start(self, n: int, down: int, durable: int) -> None:
        """`durable`: how many nodes run AOF with fsync always (their restarts keep every write)."""
        self.world = ProtoWorld.new(Protocol(), n, tuple(range(n - down, n)))
        for node in self.world.nodes[:durable]:
            node.durable = True

    @rule(data=st.data())
    def event(self, data: st.DataObject) -> None:
        options = moves(self.world, clients=3, crashes=3, ticks=4, attempts=6, saves=2)
        if options:
            self.world = data.draw(st.sampled_from(options))

    @invariant()
    def safe(self) -> None:
        assert self.world.violation() is None, self.world.violation()

    @invariant()
    def live(self) -> None:
        if len(self.world.up) >= quorum(self.world.n):
            assert self.world.recovers(), self.world.key()


TestProtocolModel = ProtocolModel.TestCase
TestProtocolModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])
