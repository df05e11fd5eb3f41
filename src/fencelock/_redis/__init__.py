"""Redis's and Redlock's own rules, pure (no I/O), shared by both front ends.

- `keys`:       a lock name's keys (one hash slot per name);
- `fences`:     how one node hands out fences (counter and clock floor) and how long it keeps them;
- `durability`: what `durability=` asks of the server (WAIT / WAITAOF) and whether its answer is enough;
- `redlock`:    Redlock over N masters, every name of the three below (import from here);
- `redlock_acquire`: quorum, proposals, rounds, release and extend outcomes: the fencing rule;
- `redlock_heal`: gates, heal plans, repair, node states and the verdict: a node that lost its data;
- `redlock_node`: `NodeModel`, one node as the Lua scripts keep it (their specification);
- `channel`:    what the transport's channels (`_transport.py`) share of a server's connections: their settings,
                each caller's latest request, idle connections fit to use, the count of blocking waits;
- `order`:      the per-node order rule (`turn`): a request waits for, is refused after, or ends the connection of
                the caller's previous request there;
- `request`:    one script request: its bytes, how its reply is read and what it means, when it may go again;
- `resp`:       the RESP codec.
"""
