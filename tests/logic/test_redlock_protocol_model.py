"""The Redlock start-up and repair protocol, checked on an in-memory model (`redlock_protocol.py`) before any
server is involved.

Over every interleaving of a small scope, and at random over longer runs, it checks liveness (no dead end while a
quorum is up) as well as safety; the older protocol fails the liveness check, and the variants without claims or
without a floor show why each exists. The fencing rule itself is checked in `test_redlock_model.py`.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fencelock._redis.redlock import quorum

from .redlock_protocol import DELAY, EPS, PTTL, NoClaim, NoFloor, OldProtocol, Protocol, ProtoWorld, explore, moves
from .test_redlock_model import NAME

SCOPE = {"clients": 2, "crashes": 1, "ticks": 2, "attempts": 2}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("down", [(), (2,)])
def test_exhaustively_for_three_nodes_startup_and_repair_have_no_dead_end_and_stay_safe(down: tuple[int, ...]) -> None:
    """Liveness and safety of start-up and repair, over every interleaving of a small scope: 3 nodes (one of
    them down at first contact, or none), two concurrent clients crashing at any step, one node losing its
    data at any step, the clock passing the window and the quarantine, two attempts anywhere."""
    states, violation = explore(ProtoWorld.new(Protocol(), 3, down), **SCOPE)
    assert violation is None, violation
    assert states > 100_000, states  # the scope really was explored (156,050 and 161,268 when written)


def test_exhaustively_marking_a_new_deployment_without_claims_lets_two_grants_share_a_fence() -> None:
    """Why claims: a look that straddles another client's marks and grant and a node's loss sees every node
    fresh; marking from it hands the emptied node fence 1 again while the first grant is valid."""
    _, violation = explore(ProtoWorld.new(NoClaim(), 3), **SCOPE)
    assert violation is not None
    assert violation.startswith("fence 1 granted after fence 1"), violation


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
        assert all(node.ready for node in world.nodes) is not dead, protocol.name
        assert world.recovers() is not dead, protocol.name


def _floor_scenario(protocol: Protocol) -> ProtoWorld:
    """3 nodes in use; fence 5 is granted on {0, 1} while node 2 is down; then 0 and 1 both lose their data and
    node 2 (which never saw fence 5) comes back: no quorum of ready nodes remembers fence 5."""
    world = ProtoWorld.new(protocol, 3)
    for node in world.nodes:
        node.ready = True
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

    @initialize(n=st.sampled_from([3, 5]), down=st.integers(0, 2))
    def start(self, n: int, down: int) -> None:
        self.world = ProtoWorld.new(Protocol(), n, tuple(range(n - down, n)))

    @rule(data=st.data())
    def event(self, data: st.DataObject) -> None:
        options = moves(self.world, clients=3, crashes=3, ticks=4, attempts=6)
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
