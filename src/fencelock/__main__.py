"""`python -m fencelock ...` is the `fencelock` command (see `fencelock._cli`).

`python -m fencelock demo` (what `./dev lab` runs) shows the classic lock failure and its fix on an embedded Redis;
it is kept here, without the command line's dependencies, so that it runs on the base install.
"""

from __future__ import annotations

import sys
import time

USAGE = "usage: python -m fencelock demo [--url redis://host:port/0]"


def demo(url: str | None) -> int:
    import fencelock
    from fencelock.testing.servers import RedisServer

    server = None
    if url is None:
        server = RedisServer(name="demo").start()
        url = server.url
        print(f"started an embedded server: {server.binary} on {url}")
    try:
        locks = fencelock.connect(url)
        import redis

        store = redis.Redis.from_url(url)
        guard = fencelock.RedisGuard(store)
        name = "demo:orders:42"
        data = guard.key(name, "state")

        print("\n1. Client A takes the lock for 0.3 s, then pauses for 0.5 s (a GC pause, a stalled VM).")
        a = locks.acquire(name, ttl=0.3, wait=0)
        print(f"   A holds {name!r} with fence {a.fence}")
        time.sleep(0.5)
        print(f"   A's lease ran out meanwhile: remaining() = {a.remaining():.3f} s")

        print("2. Client B takes the lock and writes through the fencing guard.")
        b = locks.acquire(name, ttl=5.0, wait=0)
        plain = guard.key(name, "unguarded")
        guard.set(name, b.fence, data, "paid by B")
        store.set(plain, "paid by B")
        print(f"   B holds it with fence {b.fence} and wrote 'paid by B' (to a guarded and to a plain record)")

        print("3. A wakes up and writes 'paid by A', believing it still holds the lock.")
        store.set(plain, "paid by A")
        print(f"   without a guard (plain SET):  accepted, the record now says {store.get(plain)!r}: "
              "B's update is lost")
        try:
            guard.set(name, a.fence, data, "paid by A")
            print("   through the guard:            ACCEPTED (this must not happen)")
            return 1
        except fencelock.StaleFence as exc:
            print(f"   through the guard:            rejected: {exc}")
        print(f"   the record still says {store.get(data)!r}")

        try:
            a.release()
        except fencelock.LockLost as exc:
            print(f"4. A's release tells it the truth: LockLost: {exc}")
        b.release()
        store.delete(data, plain)
        store.close()
        locks.close()
        print("\nA lock alone does not protect a resource; a fencing token checked by the resource does.")
        return 0
    finally:
        if server is not None:
            server.close()


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "demo":
        from ._cli import main as cli

        return cli(argv)
    url = None
    if len(argv) == 3 and argv[1] == "--url":
        url = argv[2]
    elif len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    return demo(url)


if __name__ == "__main__":
    status = main(sys.argv[1:])
    if sys.argv[1:2] != ["demo"]:
        from ._cli import finish

        finish(status)
    sys.exit(status)
