"""Pure decisions, no I/O.

Everything here takes its inputs (including "now" from a clock) as arguments and returns a decision, so it can be
tested with a fake clock and Hypothesis. The backends in `_async/` only carry bytes between these decisions and
the servers.

Rules every backend shares:

- `args`:      validation of every user argument (ttl, wait, name) before anything is sent;
- `acquiring`: the acquire loop's decisions (try, grant, sleep, block, raise) from attempts, errors and the clock;
- `timing`:    the `wait` deadline, how long a waiter may block, back-off, lease validity (ttl - elapsed - drift);
- `lease`:     a lease's life (valid until, due, renewal in flight, lost), shared by the lease and the watchdog;
- `outcomes`:  what a server's answer means for a lease;
- `waiting`:   one client's waiters on one name, and which of them may talk to the server;
- `admission`: which of one client's requests goes out next (at most a few at once, by urgency);
- `fencing`:   the rule a resource applies to fencing tokens;
- `status`:    what an operator sees of one lock (`Locks.status()`, `list()`, `force_release()`);
- `urls`:      parsing lock-service URLs (the Redis schemes, and the option and redaction rules etcd and
               ZooKeeper URLs reuse);
- `celery`:    the Celery integration's task options and lock names.

Each backend's own rules live with it: `fencelock._redis` (Redis and Redlock), `fencelock._etcd`,
`fencelock._zk`.
"""
