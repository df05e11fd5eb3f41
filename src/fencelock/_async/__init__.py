"""The asyncio implementation: the one source of truth for every I/O flow.

`_sync/` is generated from this folder by `scripts/unasync.py` (plain substitutions: `async def` -> `def`,
`await x` -> `x`, `AsyncLocks` -> `Locks`, `redis.asyncio` -> `redis`, ...). Only `_compat.py` is written twice by
hand, because it holds the few things that really differ (shielding cleanup from cancellation, sleeping).
"""
