"""How the ``regis`` command line reports an error: one line on stderr (plus, where it helps, one ``hint:`` line),
exit status 2 for usage (what was typed is wrong: an unknown option, a bad value, a query image or image folder
that does not exist) and 1 for failures (the work could not be done: an unreadable image, a missing or corrupt
index, weights that do not load, an empty folder). No traceback unless ``--debug`` or ``REGIS_DEBUG=1``.
"""

from __future__ import annotations

import os
import sys
import traceback

from pydantic import ValidationError

from regis.errors import ConfigError, Interrupted, RegisError

USAGE = 2
FAILURE = 1
INTERRUPTED = 130
DEBUG_ENV = "REGIS_DEBUG"
DEBUG_HINT = f"run again with {DEBUG_ENV}=1 (or regis --debug ...) to see the traceback"
# settings fields -> the command-line option that sets them (a ValidationError names fields)
OPTION_OF_FIELD = {
    "index_dir": "--index", "collections_root": "--collections-root", "api_keys_file": "--api-keys-file",
    "images_root": "--images-root", "uploads_dir": "--uploads-dir", "redis_url": "--redis-url",
    "weights": "--weights", "device": "--device", "backbone": "--backbone", "random_init": "--random-init",
    "enable_jobs": "--enable-jobs", "roi_size": "--roi-size", "roi_image_size": "--roi-image-size",
    "cue_method": "--cue-method", "build_batch_size": "--batch-size", "build_workers": "--workers",
}


def debug_requested(argv: list[str]) -> bool:
    """Whether the user asked for tracebacks: ``--debug`` anywhere on the command line, or ``REGIS_DEBUG`` set to
    something other than "", "0", "false" or "no"."""
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _click_classes() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(usage error classes, abort classes) of the click that typer runs on: typer >= 0.16 vendors its own copy
    (``typer._click``, with ``typer.exceptions.Abort``), older ones use the ``click`` package. Both are caught."""
    usage, abort = [], []
    for name in ("typer._click.exceptions", "typer.exceptions", "click.exceptions"):
        try:
            module = __import__(name, fromlist=["_"])
        except ImportError:
            continue
        usage += [c for c in (getattr(module, "ClickException", None),) if isinstance(c, type)]
        abort += [c for c in (getattr(module, "Abort", None),) if isinstance(c, type)]
    return tuple(usage), tuple(abort)


def describe(exc: BaseException) -> tuple[str, str | None, int]:
    """(message, hint or None, exit status) of an exception raised by a command."""
    usage_classes, abort_classes = _click_classes()
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", None, INTERRUPTED
    if isinstance(exc, Interrupted):
        return _one_line(str(exc)), exc.hint, INTERRUPTED
    if isinstance(exc, abort_classes):
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, KeyboardInterrupt):
            return "interrupted", None, INTERRUPTED
        return "aborted: nothing was changed", None, FAILURE
    if isinstance(exc, usage_classes):
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError":  # `regis` or `regis index` alone: a group without its command
            command = ctx.command_path if ctx is not None else "regis"
            where = "listed above" if not message.strip() else f"that `{command} --help` lists"  # rich printed it
            return (f"no command given: {command} needs one of the commands {where}",
                    f"see {command} COMMAND --help for one command's arguments", USAGE)
        hint = f"{ctx.command_path} --help" if ctx is not None else "regis --help"
        return _one_line(message), f"see {hint}", getattr(exc, "exit_code", USAGE) or USAGE
    if isinstance(exc, ValidationError):
        problems = "; ".join(_problem(e) for e in exc.errors())
        return f"invalid value: {problems}", None, USAGE
    if isinstance(exc, RegisError):
        return _one_line(str(exc)), getattr(exc, "hint", None), USAGE if isinstance(exc, ConfigError) else FAILURE
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or type(exc).__name__}{where}", None, FAILURE
    return f"unexpected {type(exc).__name__}: {_one_line(str(exc))}", DEBUG_HINT, FAILURE


def _problem(error: dict) -> str:
    loc = [str(p) for p in error.get("loc", ())]
    name = OPTION_OF_FIELD.get(loc[0], loc[0]) if loc else ""
    message = error.get("msg", "invalid").removeprefix("Value error, ")
    return f"{name}: {message}" if name else message


def _one_line(text: str) -> str:
    return " ".join(text.split())


def report(exc: BaseException, debug: bool = False) -> int:
    """Print ``exc`` as the command line's error (the traceback first when ``debug``) and return the exit
    status to leave with."""
    try:
        message, hint, status = describe(exc)
    except Exception:  # the reporter must not become the traceback it exists to avoid
        message, hint, status = f"unexpected {type(exc).__name__}", DEBUG_HINT, FAILURE
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"error: {message}" if status != INTERRUPTED else message, file=sys.stderr)
    if hint and not debug:
        print(f"hint: {hint}", file=sys.stderr)
    return status
