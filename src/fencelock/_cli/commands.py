"""The commands of `fencelock`, on click. Each one is a thin layer over the library's public API.

Why click alone, without rich: click is small, pure Python and well kept, and gives `--help` on every command,
environment variables for options, prompts and colour that is dropped when the output is not a terminal. The only
tables here are a few aligned columns, which need no table library; rich would add about 3 MB (with pygments and
markdown-it) to every install of the extra for that.
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import click

import fencelock

from .._errors import BackendError, LockError, LockLost, MissingExtra
from .._logic.args import MAX_SECONDS
from . import exits
from .exits import DEFAULT_GRACE, MIN_RUN_TTL, OnLost
from .options import (
    _connect,
    _lock_name,
    _same_service,
    _seconds,
    _shown,
    _target,
    json_option,
    repair_delay_option,
    split_urls,
    url_option,
)
from .show import OutputFailed, as_json, be_quiet, describe, error, out, say, status_line, table

_state: dict[str, Any] = {"debug": False, "die_by": None}


def die_by() -> int | None:
    """The signal fencelock should end by, once everything is done (the command died of SIGINT), else None."""
    signum: int | None = _state["die_by"]
    return signum


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


@click.group(context_settings=CONTEXT)
@click.version_option(fencelock.__version__, prog_name="fencelock")
@click.option("--debug", is_flag=True, help="Show the full traceback of an error, and every log record of the "
                                            "library (and kazoo) on stderr. The exit status stays the same.")
@click.option("-v", "--verbose", is_flag=True, help="Show the library's log records of INFO and above on stderr "
                                                    "(renewals that got no answer, losses, Redlock nodes out).")
def cli(debug: bool, verbose: bool) -> None:
    """Distributed locks with fencing tokens, from the shell: a flock for cron jobs that run on many machines,
    and a window into the locks that are held.

    \b
    Examples:
      fencelock run --ttl 60 --wait 0 nightly-report -- /usr/local/bin/report
      fencelock status nightly-report
      fencelock list 'report:*' --json
      fencelock release nightly-report --force

    Every command takes --url (else $FENCELOCK_URL, else redis://127.0.0.1:6379/0).
    """
    _state["debug"] = debug
    be_quiet(False)
    _configure_logging(debug, verbose)


class _LogLine(logging.Handler):
    """A log record as one `fencelock: LEVEL: message` line on stderr (never raises, as every line here)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"fencelock: {record.levelname.lower()}: {record.getMessage()}"
            if record.exc_info and _state["debug"]:
                text += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        except Exception:
            return
        say(text)


def _configure_logging(debug: bool, verbose: bool) -> None:
    """The library's log records reach stderr only when asked for (-v: fencelock's INFO and above; --debug: every
    record of fencelock and kazoo); otherwise nothing, not even Python's last-resort WARNING lines: what went wrong
    is said once, by the command, and the exit status."""
    root = logging.getLogger()
    if not (debug or verbose):
        if not root.handlers:
            root.addHandler(logging.NullHandler())
        return
    handler = _LogLine()
    for name, level in (("fencelock", logging.DEBUG if debug else logging.INFO),
                        ("kazoo", logging.DEBUG if debug else logging.WARNING)):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        for old in [h for h in logger.handlers if isinstance(h, _LogLine)]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.propagate = False


class _RunCommand(click.Command):
    """`run`, whose NAME must come before `--`: `fencelock run -- echo hi` would otherwise lock a name 'echo'."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args and not _has_positional(self, args[:args.index("--")]):
            raise click.UsageError("NAME goes before --: fencelock run [OPTIONS] NAME -- COMMAND [ARGS]...", ctx=ctx)
        return super().parse_args(ctx, args)


def _has_positional(command: click.Command, args: list[str]) -> bool:
    """Whether `args` (what comes before `--`) hold a positional argument, skipping options and their values."""
    takes_value = {opt for param in command.params if isinstance(param, click.Option) and not param.is_flag
                   for opt in param.opts}
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in takes_value:
            skip = True
        elif not arg.startswith("-") or arg == "-":
            return True
    return False


@cli.command(cls=_RunCommand, context_settings={"max_content_width": 110})
@click.argument("name", callback=_lock_name)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--ttl", default=str(fencelock.DEFAULT_TTL), callback=_seconds(), metavar="SECONDS", show_default=True,
              help="Seconds the lock lives without renewal (at least 1). It is renewed every TTL/3 while COMMAND "
                   "runs, so this is how soon a crashed machine's lock frees itself.")
@click.option("-w", "--wait", default=str(fencelock.DEFAULT_WAIT), callback=_seconds(forever=True),
              metavar="SECONDS", show_default=True,
              help="Seconds to wait for a busy lock: 0 tries once, 'forever' waits for ever.")
@click.option("-n", "--nonblock", is_flag=True, help="Try once, do not wait (the same as --wait 0, as flock -n).")
@click.option("-q", "--quiet", is_flag=True, help="Say nothing when the lock is busy (with -n -E 0: a silent skip), "
                                                  "nor what fencelock does to COMMAND; errors are still said.")
@click.option("-E", "--conflict-exit-code", "busy_status", type=click.IntRange(0, 255), default=exits.BUSY,
              show_default=True, help="Exit status when the lock is busy (EX_TEMPFAIL by default, as flock -E).")
@click.option("--on-lost", type=click.Choice([p.value for p in OnLost]), default=OnLost.TERM.value,
              show_default=True, help="What happens to COMMAND if the lock is lost while it runs: SIGTERM then "
                                      "SIGKILL after --grace, SIGKILL at once, or nothing.")
@click.option("--grace", default=str(DEFAULT_GRACE), callback=_seconds(), metavar="SECONDS", show_default=True,
              help="Seconds between SIGTERM and SIGKILL when the lock is lost. While the lock's renewal is "
                   "unconfirmed, COMMAND gets SIGTERM once no more than this is left of the lock, and SIGKILL when "
                   "it ends.")
@click.option("--repair-delay", default=None, callback=_seconds(), metavar="SECONDS",
              help="Redlock only: seconds a node that lost its data stays out (default 60); --ttl may not exceed it.")
@url_option
def run(name: str, command: tuple[str, ...], ttl: float, wait: float | None, nonblock: bool, quiet: bool,
        busy_status: int, on_lost: str, grace: float, repair_delay: float | None, urls: tuple[str, ...]) -> int:
    """Run COMMAND while holding the lock NAME, then release it.

    COMMAND runs only once NAME is acquired, with FENCELOCK_NAME, FENCELOCK_FENCE (the fencing token: pass it
    to your storage), FENCELOCK_TOKEN (the lease's secret; never log it) and FENCELOCK_SERVICE (the lock
    service, passwords masked) in its environment. COMMAND runs in a process group of its own: SIGINT, SIGTERM
    and SIGHUP are passed on to the whole group (unless they were ignored when fencelock started, as under
    nohup), a lost lock stops the whole group, and what COMMAND leaves running is stopped before the lock is
    released after it exits; processes that left the group (setsid, daemons) go with it. A guardian process
    stops them if fencelock itself dies.

    \b
    Exit status:
      COMMAND's own    it ran with the lock held (128+N if signal N ended it; on SIGINT fencelock dies of it too)
      75               the lock was busy, or stayed busy for --wait; COMMAND did not run (-E changes it)
      70               the lock was lost (or in doubt) while COMMAND ran; COMMAND was stopped per --on-lost
      69               the lock service failed or could not be reached
      2                bad arguments or URL, a nested run of NAME;  126/127: COMMAND could not run / not found

    \b
    Examples:
      fencelock run nightly-report -- /usr/local/bin/report --since yesterday
      fencelock run -n -q -E 0 backup -- ./backup.sh                  # busy: skip silently (exit 0)
      fencelock run --wait forever migrate -- sh -c 'migrate --fence "$FENCELOCK_FENCE"'
    """
    from .supervise import run as supervise

    if not 0 <= grace <= MAX_SECONDS:  # (NaN fails this too)
        raise click.BadParameter(f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}, got {grace!r}",
                                 param_hint="--grace")
    if not ttl >= MIN_RUN_TTL:
        raise click.BadParameter(f"must be at least {MIN_RUN_TTL:g} s for run (COMMAND is watched every 50 ms and "
                                 f"the lock renewed every TTL/3), got {ttl!r}", param_hint="--ttl")
    if not command[0]:
        raise click.UsageError("COMMAND is empty ('' is no program); nothing was run and no lock was taken")
    _target(urls)  # an empty URL is refused here, before anything else
    service = _shown(urls)
    if os.environ.get("FENCELOCK_NAME") == name and _same_service(os.environ.get("FENCELOCK_SERVICE", ""), urls):
        raise click.UsageError(f"this runs inside a `fencelock run` that holds lock {name!r} on the same service "
                               "already: it would wait for itself. Run COMMAND directly (the lock is held; its "
                               "fence is $FENCELOCK_FENCE), or use another NAME")
    be_quiet(quiet)
    with _connect(urls, repair_delay) as locks:
        ending = supervise(locks, name, command, ttl=ttl, wait=0.0 if nonblock else wait, busy_status=busy_status,
                           on_lost=OnLost(on_lost), grace=grace, quiet=quiet, service=service)
    _state["die_by"] = ending.signal
    return ending.status


@cli.command()
@click.argument("name", callback=_lock_name)
@url_option
@json_option
@click.option("-q", "--quiet", is_flag=True,
              help="Print nothing; exit 0 if the lock is held and 1 if it is free (as grep -q).")
@repair_delay_option
def status(name: str, urls: tuple[str, ...], as_json: bool, quiet: bool, repair_delay: float | None) -> int:
    """Show whether the lock NAME is held, its fence, how long until it expires, and (fair locks) its queue.

    \b
    Exit status: 0, or with --quiet 0 held / 1 free; 69 the lock service failed or could not be reached.

    \b
    Examples:
      fencelock status nightly-report
      fencelock status nightly-report --json     # {"name": ..., "held": true, "fence": 17, "remaining": 42.1, ...}
      if fencelock status -q nightly-report; then echo busy; fi
    """
    with _connect(urls, repair_delay) as locks:
        found = locks.status(name)
    if quiet:
        return 0 if found.held else exits.FREE
    out(_json(found) if as_json else status_line(found))
    return 0


@cli.command(name="list")
@click.argument("pattern", default="*", required=False, callback=_lock_name)
@url_option
@json_option
@repair_delay_option
def list_(pattern: str, urls: tuple[str, ...], as_json: bool, repair_delay: float | None) -> int:
    """List the held locks whose names match PATTERN (a glob: *, ?, [seq]; default: all).

    Redis is walked with SCAN (on every primary of a Cluster), never KEYS, so a large keyspace is not blocked.

    \b
    Examples:
      fencelock list
      fencelock list 'report:*'
      fencelock list --json | jq -r '.[].name'
    """
    with _connect(urls, repair_delay) as locks:
        found = locks.list(pattern)
    if as_json:
        out(_json(found))
    elif found:
        out(table(found))
    else:
        out(f"no held locks match {pattern!r}")
    return 0


@cli.command()
@click.argument("name", callback=_lock_name)
@click.option("--force", is_flag=True, help="Required: this removes the lock whoever holds it.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@url_option
@repair_delay_option
def release(name: str, force: bool, yes: bool, urls: tuple[str, ...], repair_delay: float | None) -> int:
    """Operators only: remove the lock NAME whoever holds it, and say what was removed.

    The holder is not told; its renewal finds the lock lost (`fencelock run` then stops its command). The fence
    counter stays, so the next holder gets a higher fence and guards keep rejecting the old holder's writes.

    \b
    Examples:
      fencelock release nightly-report --force          # asks first
      fencelock release nightly-report --force --yes
    """
    if not force:
        raise click.UsageError("release removes the lock whoever holds it; give --force to mean it")
    with _connect(urls, repair_delay) as locks:
        before = locks.status(name)
        if not before.held:
            out(f"lock {name!r} is not held ({describe(before)}); nothing to remove")
            return 0
        if not yes:
            question = (f"Remove lock {name!r} ({describe(before)})? Its holder is not told and may still be "
                        "working")
            try:
                agreed = click.confirm(question, default=False, err=True)
            except (click.Abort, OSError):  # no answer, or no stderr to ask on
                agreed = False
            if not agreed:
                error(f"lock {name!r} was not removed", "--yes skips the question")
                return exits.DECLINED
        removed = locks.force_release(name)
    if removed.held:
        out(f"removed lock {name!r} ({describe(removed)})")
    else:
        out(f"lock {name!r} was no longer held; nothing removed")
    return 0


PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


@cli.command(context_settings=PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def lab(args: tuple[str, ...]) -> int:
    """The fault lab: real servers, injected faults, and what fencelock does about them."""
    try:
        module: Any = importlib.import_module("fencelock._lab")
    except ModuleNotFoundError as exc:
        if exc.name != "fencelock._lab":
            raise
        if "-h" in args or "--help" in args:
            click.echo("Usage: fencelock lab [ARGS]...\n\n  The fault lab (not built into this version yet).\n"
                       "  `python -m fencelock demo` shows the classic lock failure and the fencing fix.")
            return 0
        error("fencelock lab is not built into this version yet",
              "`python -m fencelock demo` shows the lock failure and the fencing fix")
        return exits.USAGE
    return int(module.main(list(args)))


_CHECKOUT = Path(fencelock.__file__).resolve().parents[2]
"""The repository checkout this copy runs from, if it is one (its bench/ is not part of the package)."""


@cli.command(context_settings=PASS_THROUGH, add_help_option=False,
             hidden=not (_CHECKOUT / "bench" / "__main__.py").is_file())
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> int:
    """The benchmarks against other lock libraries (from a checkout of the repository: python -m bench)."""
    root = _CHECKOUT
    if not (root / "bench" / "__main__.py").is_file():
        error("fencelock bench runs the repository's bench/, which is not part of the installed package",
              "clone the repository and run ./dev bench there")
        return exits.USAGE
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    return subprocess.call([sys.executable, "-m", "bench", *args], env=env)


@cli.command(hidden=True, context_settings=PASS_THROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def demo(args: tuple[str, ...]) -> int:
    """The classic lock failure and the fencing fix, on an embedded server (python -m fencelock demo)."""
    from ..__main__ import main as demo_main

    return demo_main(["demo", *args])


def _json(value: Any) -> str:
    return as_json(value)


HINT_SERVER = "is the server running and reachable? check --url or FENCELOCK_URL"


def run_cli(args: list[str]) -> int:
    """Run the command line; turn every error into one line on stderr and an exit status."""
    try:
        result = cli.main(args=args, prog_name="fencelock", standalone_mode=False)
    except click.UsageError as exc:
        no_args = getattr(click.exceptions, "NoArgsIsHelpError", None)
        if no_args is not None and isinstance(exc, no_args) and exc.ctx is not None:
            click.echo(exc.ctx.get_help())  # `fencelock` alone: the help, as click shows it
            return exits.USAGE
        where = exc.ctx.command_path if exc.ctx is not None else "fencelock"
        hint = f"see '{where} --help'"
        if exc.ctx is not None and exc.ctx.command.name == "run" and isinstance(exc, click.NoSuchOption):
            hint = "put -- before COMMAND so that its options are not read as fencelock's; " + hint
        error(exc.format_message(), hint)
        return exits.USAGE
    except click.Abort:
        error("aborted")
        return exits.DECLINED
    except click.ClickException as exc:
        error(exc.format_message())
        return exc.exit_code
    except OutputFailed as exc:
        if exc.status != exits.BROKEN_PIPE:  # a reader that went away (`| head`) is not an error
            error(str(exc))
        return exc.status
    except MissingExtra as exc:  # a URL whose backend needs an extra that is not installed: configuration
        error(str(exc))
        return exits.USAGE
    except (ValueError, TypeError) as exc:  # the library's argument checks (bad TTL, URL, name, pattern)
        _trace()
        error(str(exc), f"see '{_command_path(args)} --help'")
        return exits.USAGE
    except BackendError as exc:
        _trace()
        error(str(exc), f"{HINT_SERVER}, now {_shown_from(args)}")
        return exits.BACKEND
    except LockLost as exc:
        _trace()
        error(str(exc))
        return exits.LOST
    except LockError as exc:
        _trace()
        error(str(exc))
        return exits.BACKEND
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except Exception as exc:
        _trace()
        error(f"unexpected {type(exc).__name__}: {exc}", "run with --debug for the traceback, and report it")
        return 1
    return int(result or 0)


def _trace() -> None:
    """With --debug, the traceback of the error being handled (the exit status stays what it would be)."""
    if _state["debug"]:
        say(traceback.format_exc().rstrip())


def _command_path(args: list[str]) -> str:
    """`fencelock CMD` for the subcommand in `args` (the context is gone by the time an error is shown)."""
    for arg in args:
        if arg in cli.commands:
            return f"fencelock {arg}"
    return "fencelock"


def _shown_from(args: list[str]) -> str:
    """The URLs this run used, passwords masked (read back from the arguments: the context is gone by now)."""
    urls: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--url" and i + 1 < len(args):
            urls.append(args[i + 1])
        elif arg.startswith("--url="):
            urls.append(arg.split("=", 1)[1])
    if not urls:
        urls = split_urls(os.environ.get("FENCELOCK_URL", ""))
    return _shown(tuple(urls))
from . import nodes as _nodes  # noqa: E402,F401  (`fencelock nodes`: registers itself on `cli`)
