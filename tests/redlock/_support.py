"""What the Redlock test modules share: five real, independent Redis nodes set up for Redlock (`five`), their
URLs with a short socket timeout, and whether a node holds a lease's token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fencelock.testing.servers import RedisNodes, RedisServer
from tests.conftest import initialise_redlock, lock_value


@pytest.fixture
def five() -> Iterator[RedisNodes]:
    nodes = RedisNodes(5).start()
    initialise_redlock(nodes.urls)
    yield nodes
    nodes.close()


def _urls(nodes: list[RedisServer], socket_timeout: float = 0.3) -> list[str]:
    return [f"{node.url}?socket_timeout={socket_timeout}" for node in nodes]


def _holds(node: RedisServer, name: str, token: str) -> bool:
    return lock_value(node.client(), name) == token
