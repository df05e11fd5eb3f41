"""Redis's and Redlock's own rules, pure (no I/O), shared by both front ends.

- `keys`:       a lock name's keys (one hash slot per name);
- `fences`:     how one node hands out fences (counter and clock floor) and how long it keeps them;
- `durability`: what `durability=` asks of the server (WAIT / WAITAOF) and whether its answer is enough;
- `redlock`:    Redlock over N masters, every name of the three below (import from here);
- `redlock_acquire`: quorum, proposals, rounds, release and extend outcomes: the fencing rule;
- `redlock_heal`: gates, heal plans, repair, node states and the verdict: a node that lost its data;
- `redlock_node`: `NodeModel`, one node as the Lua scripts keep it (their specification);
- `channel`:    the wire rule of the transport (`_transport.py`) and the sync select loop: a request, the
                per-node order rule, how a reply is read and what it means;
- `resp`:       the RESP codec.
"""
