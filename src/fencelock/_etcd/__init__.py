"""etcd's pure side, no I/O (the gateway client, the backend and its waiters are `_async/etcd_gateway.py`,
`_async/etcd.py` and `_async/etcd_waiting.py`):

- `url`:   `etcd://` and `etcds://` URLs;
- `rules`: the key layout, the TTL mapping, and what an answer means;
- `txn`:   the lock's transactions and reads, built as JSON bodies, and their answers decoded.
"""
