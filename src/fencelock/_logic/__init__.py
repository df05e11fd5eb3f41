"""Pure decisions, no I/O.

Everything here takes its inputs (including "now" from a clock) as arguments and returns a decision, so it can be
tested with a fake clock and Hypothesis. The backends in `_async/` only carry bytes between these decisions and
the servers.

- `args`:     validation of every user argument (ttl, wait, name) before anything is sent;
- `acquiring`: the acquire loop's decisions (try, grant, sleep, block, raise) from attempts, errors and the clock;
- `timing`:   the `wait` deadline, retry back-off, lease validity (ttl - elapsed - drift);
- `lease`:    a lease's life (valid until, due, renewal in flight, lost), shared by the lease and the watchdog;
- `fencing`:  the rule a resource applies to fencing tokens;
- `fences`:   how one Redis hands out fences (counter and clock floor) and how long it keeps them;
- `keys`:     how a lock name maps to Redis keys (one hash slot per name).
"""
