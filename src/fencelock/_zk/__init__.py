"""ZooKeeper's side shared by both front ends (the backend itself is `_async/zookeeper.py`, on
`_async/zookeeper_queue.py` and `_async/zookeeper_requests.py`):

- `url`:     `zookeeper://` URLs;
- `rules`:   pure: node paths, queue order, sessions for TTLs, what a renewal means;
- `session`: one kazoo session per session timeout, and the nodes it must still delete;
- `nodes`:   our node in a lock's queue, and the thread that deletes held nodes whose TTL ran out.
"""
