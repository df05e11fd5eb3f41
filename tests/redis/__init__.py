"""The Redis family on real servers: what only Redis shows (scripts, keys, channels, fair queues, TLS, faults)."""
