"""The asyncio implementation: the one source of truth for every I/O flow.

`_sync/` is generated from this folder by `scripts/unasync.py` (plain substitutions: `async def` -> `def`,
`await x` -> `x`, `AsyncLocks` -> `Locks`, `redis.asyncio` -> `redis`, ...). Only the modules named in
`scripts/unasync.py`'s HAND_WRITTEN are written twice by hand (`_concurrency`, `_connection`, `_multiplex`,
`_cluster`, `_kazoo`): the few things that really differ between asyncio and threads.
"""
