"""Redis's own wire rules, pure and shared by both front ends' transports (`_async/_transport.py`,
`_sync/_transport.py`): `channel` (a request, the order rule, what a reply means), `resp` (the RESP codec)."""
