"""Redis's and Redlock's own rules, pure (no I/O), shared by both front ends.

- `keys`:       a lock name's keys (one hash slot per name);
- `fences`:     how one node hands out fences (counter and clock floor) and how long it keeps them;
- `durability`: what `durability=` asks of the server (WAIT / WAITAOF) and whether its answer is enough;
- `redlock`:    Redlock over N masters: quorum, validity, the fencing rule, heal and repair;
- `channel`:    the wire rule of the transport (`_transport.py`) and the sync select loop: a request, the
                per-node order rule, how a reply is read and what it means;
- `resp`:       the RESP codec.
"""
