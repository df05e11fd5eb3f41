"""The options and arguments the commands share: --url and the lock service it names, --json, --repair-delay,
seconds, and lock names (a server URL given as a NAME or PATTERN is refused)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

import fencelock

from .._logic.urls import ALL_SCHEMES, redact, service_nodes

DEFAULT_URL = "redis://127.0.0.1:6379/0"

F = TypeVar("F", bound=Callable[..., Any])


def split_urls(value: str) -> list[str]:
    """FENCELOCK_URL's URLs: one, or several separated by white space before each `scheme://` (never inside one:
    a password with spaces stays whole, and is never shown in pieces)."""
    return [part for part in re.split(r"\s+(?=[A-Za-z][A-Za-z0-9+.-]*://)", value.strip()) if part]


class _Urls(click.types.StringParamType):
    """--url, read from FENCELOCK_URL by `split_urls`."""

    def split_envvar_value(self, rv: str) -> list[str]:
        return split_urls(rv)


def url_option(f: F) -> F:
    return click.option(
        "--url", "urls", multiple=True, envvar="FENCELOCK_URL", metavar="URL", type=_Urls(),
        help="The lock service: any URL fencelock.connect() takes (default: $FENCELOCK_URL, else "
             "redis://127.0.0.1:6379/0). Give it three or more times (or several URLs separated by spaces in "
             "FENCELOCK_URL) for Redlock over independent nodes. Put a URL with a password in FENCELOCK_URL: "
             "`ps` shows command lines to every user.")(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of text.")(f)


def repair_delay_option(f: F) -> F:
    return click.option("--repair-delay", default=None, callback=_seconds(), metavar="SECONDS",
                        help="Redlock only: seconds a node that lost its data stays out (default 60). Give the "
                             "deployment's own value: every client that looks at the nodes keeps them out that "
                             "long.")(f)


def _target(urls: tuple[str, ...]) -> str | list[str]:
    """The URL (or Redlock's URLs) to connect to. An empty --url, or a FENCELOCK_URL that is set but blank, is a
    mistake (an unset variable in a crontab), never the default server: UsageError."""
    if any(not url.strip() for url in urls):
        raise click.UsageError("--url is empty: give the lock service's URL (leave --url out for $FENCELOCK_URL, "
                               f"else {DEFAULT_URL})")
    if not urls and os.environ.get("FENCELOCK_URL") is not None:
        raise click.UsageError("FENCELOCK_URL is set but blank: give the lock service's URL in it, or unset it "
                               f"for the default {DEFAULT_URL}")
    given = list(urls) or [DEFAULT_URL]
    return given[0] if len(given) == 1 else given


def _shown(urls: tuple[str, ...]) -> str:
    try:
        target = _target(urls)
    except click.UsageError:
        return "(none)"
    return ", ".join(redact(url) for url in ([target] if isinstance(target, str) else target))


def _same_service(outer: str, urls: tuple[str, ...]) -> bool:
    """Whether `urls` name a server (and key space) of `outer`, the FENCELOCK_SERVICE of a run we are inside: the
    same server however spelled (localhost or 127.0.0.1, a default port given or not, a socket path)."""
    target = _target(urls)
    ours = service_nodes([target] if isinstance(target, str) else target)
    return bool(ours & service_nodes(outer.split(", ")))


def _connect(urls: tuple[str, ...], repair_delay: float | None = None) -> fencelock.Locks:
    return fencelock.connect(_target(urls), repair_delay=repair_delay)


def _seconds(forever: bool = False) -> Callable[[click.Context, click.Parameter, Any], float | None]:
    """An option callback: a number of seconds (with `forever`, also 'forever'). The library checks the range."""

    def convert(ctx: click.Context, param: click.Parameter, value: Any) -> float | None:
        if value is None or isinstance(value, (int, float)):
            return value
        text = str(value).strip().lower()
        if forever and text in ("forever", "inf", "none"):
            return None
        try:
            return float(text)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not a number of seconds"
                                     + (" (or 'forever')" if forever else "")) from None

    return convert


def server_url_like(value: str) -> bool:
    """`value` is recognisably a server URL: one of fencelock's schemes then ":/" or "//" (as typed, or mistyped),
    or any URL with credentials before its host. `s3://bucket/key` or `redis:migration` are names."""
    lowered = value.lower()
    if any(lowered.startswith((f"{scheme}:/", f"{scheme}//")) for scheme in ALL_SCHEMES):
        return True
    _, sep, rest = value.partition("://")
    return bool(sep) and "@" in rest.split("/", 1)[0]


def _lock_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A NAME or PATTERN that is a server URL was meant for --url: refused, never shown (it may hold a password)."""
    if server_url_like(value):
        raise click.BadParameter(f"this is a server URL, not a lock {param.name}: give the server with --url (or "
                                 f"FENCELOCK_URL) and the lock's {param.name} on its own (the value is not shown: "
                                 f"it may hold a password)")
    return value
