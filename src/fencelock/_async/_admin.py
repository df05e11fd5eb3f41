"""The commands a `Channel` sends of its own on a connection: `CLIENT ID` at connect, `CLIENT KILL ID` of a
connection a request was dropped with (the order rule in `_redis/order.py`)."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from .._redis.order import kill_command, killed


async def client_id(conn: Any) -> int | None:
    """The server's id of a new connection (`CLIENT ID`), None if it has none to give (an error answered)."""
    await conn.send_command("CLIENT", "ID", check_health=False)
    try:
        reply = await conn.read_response()
    except ResponseError:
        return None
    return reply if isinstance(reply, int) else None


async def kill(conn: Any, orphan: int) -> bool:
    """End the server's connection `orphan` from `conn`: True once the server says it is gone."""
    await conn.send_command(*kill_command(orphan), check_health=False)
    try:
        return killed(await conn.read_response())
    except ResponseError:
        return False
