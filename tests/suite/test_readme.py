"""Every Python block of the README runs as written, against real servers: only the addresses are changed, to the
test servers' (the README's own addresses are the services' usual ports)."""

from __future__ import annotations

import contextlib
import io
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from fencelock.testing.etcd import EtcdServer
from fencelock.testing.servers import RedisNodes, RedisServer

README = Path(__file__).resolve().parents[2] / "README.md"
REDIS_URL = "redis://127.0.0.1:6379/0"
REDLOCK_URLS = [f"redis://127.0.0.1:{port}" for port in range(7001, 7006)]
ETCD_URL = "etcd://127.0.0.1:2379"
ZOOKEEPER_URL = "zookeeper://127.0.0.1:2181/my-app"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def _first_line(block: str) -> str:
    return next(line for line in block.splitlines() if line.strip() and not line.startswith(("import", "from")))


@pytest.fixture
def addresses(request: pytest.FixtureRequest) -> dict[str, str]:
    """The README's addresses mapped to running test servers; a block's servers are started only if it uses them."""
    block = request.param
    found: dict[str, str] = {}
    if REDIS_URL in block:
        found[REDIS_URL] = request.getfixturevalue("standalone").url
    if REDLOCK_URLS[0] in block:
        nodes: RedisNodes = request.getfixturevalue("redlock_nodes")
        found.update(zip(REDLOCK_URLS, nodes.urls, strict=True))
    if ETCD_URL in block:
        etcd: EtcdServer = request.getfixturevalue("etcd_server")
        found[ETCD_URL] = etcd.url
    if ZOOKEEPER_URL in block:
        zookeeper = request.getfixturevalue("zookeeper_server")
        found[ZOOKEEPER_URL] = zookeeper.url(f"/readme-{uuid.uuid4().hex[:8]}")
    return found


def test_the_readme_has_the_examples_it_promises() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 8
    assert "fencelock.SQLGuard()" in blocks[0]
    assert "create_table" in blocks[0]
    assert any("fencelock.aio.connect" in block and "async with" in block for block in blocks)


@pytest.mark.parametrize("addresses", python_blocks(), ids=_first_line, indirect=True)
def test_every_python_block_runs_as_written(addresses: dict[str, str], request: pytest.FixtureRequest) -> None:
    block = request.node.callspec.params["addresses"]
    code = block
    for readme_address, test_address in addresses.items():
        code = code.replace(readme_address, test_address)
    namespace: dict[str, Any] = {"__name__": "readme"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), namespace)
    if "print(" in block:
        assert printed.getvalue(), "the block prints what it shows"
    if "db" in namespace:  # the quick start: the update went through the guard
        db = namespace["db"]
        assert db.execute("SELECT state FROM orders WHERE id = 42").fetchone() == ("paid",)
        assert namespace["guard"].highest(db.cursor(), "orders:42") is not None


def test_the_quick_start_needs_nothing_but_a_server(standalone: RedisServer) -> None:
    """The first block defines everything it uses (nothing is injected), and runs."""
    code = python_blocks()[0].replace(REDIS_URL, standalone.url)
    namespace: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["db"].execute("SELECT state FROM orders WHERE id = 42").fetchone() == ("paid",)
