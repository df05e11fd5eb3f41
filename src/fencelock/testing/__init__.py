"""Helpers for testing fencelock against real servers (see :mod:`fencelock.testing.servers`)."""
