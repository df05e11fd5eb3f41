"""Fixtures of the etcd tests: the shared member's deployment and a client of it."""

from __future__ import annotations

from typing import Any

import pytest

import fencelock
from fencelock.testing.etcd import EtcdDeployment, EtcdServer


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> EtcdDeployment:
    return EtcdDeployment(etcd_server)


@pytest.fixture
def locks(etcd_server: EtcdServer) -> Any:
    client = fencelock.connect(etcd_server.url)
    yield client
    client.close()
