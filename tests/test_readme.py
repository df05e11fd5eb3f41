"""The README's examples run as written (with the URL pointed at a test server)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import fencelock
from fencelock.testing.servers import RedisServer

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_opening_example_runs_and_writes_through_the_guard(standalone: RedisServer) -> None:
    code = _python_blocks()[0].replace("redis://127.0.0.1:6379/0", standalone.url)
    db = sqlite3.connect(":memory:")
    with db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, state TEXT)")
        db.execute("INSERT INTO orders VALUES (42, 'new')")
        fencelock.SQLGuard().create_table(db.cursor())
    namespace: dict[str, Any] = {"db": db}
    exec(compile(code, "README.md", "exec"), namespace)
    assert db.execute("SELECT state FROM orders WHERE id = 42").fetchone() == ("paid",)
    assert fencelock.SQLGuard().highest(db.cursor(), "orders:42") is not None


def test_the_asyncio_example_runs(standalone: RedisServer) -> None:
    import asyncio

    block = next(b for b in _python_blocks() if "fencelock.aio.connect" in b and "async with" in b)
    body = "\n".join("    " + line for line in block.replace("redis://127.0.0.1:6379/0", standalone.url).splitlines())
    code = f"async def main():\n{body.replace('...', 'entered.append(lease.fence)')}\n    await locks.aclose()\n"
    entered: list[int] = []
    namespace: dict[str, Any] = {"fencelock": fencelock, "entered": entered}
    exec(compile(code, "README.md", "exec"), namespace)
    asyncio.run(namespace["main"]())
    assert len(entered) == 1
