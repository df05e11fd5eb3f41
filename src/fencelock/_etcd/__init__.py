"""etcd's pure side, no I/O (the gateway client and the backend are `_async/etcd_gateway.py` and `_async/etcd.py`):

- `url`:   `etcd://` and `etcds://` URLs;
- `rules`: the key layout, the TTL mapping, and what an answer means;
- `txn`:   the lock's transactions and reads, built as JSON bodies, and their answers decoded.
"""
