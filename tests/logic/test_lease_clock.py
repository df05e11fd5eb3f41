"""The clients' clock counts a suspend: lease validity is measured on CLOCK_BOOTTIME where the system has it."""

from __future__ import annotations

import time

import pytest

import fencelock
from fencelock._logic.timing import lease_clock


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="CLOCK_BOOTTIME is Linux's")
def test_the_lease_clock_is_boot_time_which_counts_a_suspend() -> None:
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    read = lease_clock()
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert before <= read <= after


def test_clients_of_every_kind_measure_their_leases_on_the_lease_clock() -> None:
    for url in ("redis://127.0.0.1:1/0", ["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"],
                "etcd://127.0.0.1:1", "zookeeper://127.0.0.1:1"):
        locks = fencelock.connect(url)
        try:
            assert locks._clock is lease_clock  # nothing is sent: connect() is lazy
        finally:
            locks.close()
