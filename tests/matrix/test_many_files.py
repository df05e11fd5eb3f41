"""A process with many open files (a busy server has thousands): every request still works, on every backend of
the Redis family and both front ends, because no socket is ever handed to `select()` (it takes fds < 1024)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
from collections.abc import Iterator

import pytest

from .rigs import Front, Rig, start_rig

OPEN_FILES = 1100


@contextlib.contextmanager
def _many_files() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = OPEN_FILES + 512
    assert hard == resource.RLIM_INFINITY or hard >= wanted, f"the hard limit on open files is {hard}"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(OPEN_FILES)]
    try:
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module", params=["redis", "redlock"])
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    with start_rig(request.param) as started:
        yield started


@pytest.mark.parametrize("front", ["sync", "async"])
def test_every_request_works_with_more_than_1024_files_open(rig: Rig, front: str) -> None:
    name = f"many-files:{rig.kind}:{front}"

    async def run() -> None:
        locks = rig.connect(front)
        call = Front(front).call
        try:
            lease = await call(locks.acquire, name, ttl=5.0, wait=0)
            await call(lease.extend)
            assert (await call(locks.status, name)).held
            await call(lease.release)
            assert not (await call(locks.status, name)).held
        finally:
            await Front(front).close(locks)

    with _many_files():
        asyncio.run(run())
