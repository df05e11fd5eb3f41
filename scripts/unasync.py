"""Generate `src/fencelock/_sync/` from `src/fencelock/_async/`, so the two front ends are never two hand-kept copies.

    python scripts/unasync.py           write the synchronous files
    python scripts/unasync.py --check   exit 1 if any synchronous file differs from what would be generated

The substitutions are plain and few (as in httpcore's scripts/unasync.py); everything that really differs between
asyncio and threads lives in the hand-written pairs named in HAND_WRITTEN (same name in both trees), never generated.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src" / "fencelock"
SOURCE, TARGET = ROOT / "_async", ROOT / "_sync"
HAND_WRITTEN = {
    "__init__.py",
    "_concurrency.py",  # background work, cancellation, signals, runners
    "_multiplex.py",  # run_scripts: a task per request / the deliberate sync-only fork, a select loop
    "_connection.py",  # one Redis connection's write, read and close, and who owns a Channel's connections
    "_cluster.py",  # Redis Cluster's node lookup and client gaps
    "_kazoo.py",  # bridges to kazoo's threads (its results, watches and events)
}

SUBSTITUTIONS = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"__aenter__", "__enter__"),
    (r"__aexit__", "__exit__"),
    (r"\baclose\b", "close"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\baiter_lines\b", "iter_lines"),  # httpx's streamed response
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\bredis\.asyncio\b", "redis"),
    (r"\b_async\b", "_sync"),
]


def transform(text: str, source_name: str) -> str:
    for pattern, replacement in SUBSTITUTIONS:
        text = re.sub(pattern, replacement, text)
    header = f"# Generated from _async/{source_name} by scripts/unasync.py: do not edit, edit that file instead.\n"
    return header + text


def expected() -> dict[Path, str]:
    files = {}
    for path in sorted(SOURCE.glob("*.py")):
        if path.name not in HAND_WRITTEN:
            files[TARGET / path.name] = transform(path.read_text(encoding="utf-8"), path.name)
    return files


def main(argv: list[str]) -> int:
    check = "--check" in argv
    files = expected()
    stale = [path for path, text in files.items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    generated = {path.name for path in files} | HAND_WRITTEN
    orphans = [path for path in TARGET.glob("*.py") if path.name not in generated]
    if check:
        for path in stale:
            print(f"{path.relative_to(ROOT.parent.parent)} is out of date: run python scripts/unasync.py")
        for path in orphans:
            print(f"{path.relative_to(ROOT.parent.parent)} has no source in _async/")
        return 1 if stale or orphans else 0
    for path in stale:
        path.write_text(files[path], encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT.parent.parent)}")
    for path in orphans:
        path.unlink()
        print(f"removed {path.relative_to(ROOT.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
