"""Redlock on real, independent Redis nodes: stopped, slow and restarted nodes, start-up and repair."""
