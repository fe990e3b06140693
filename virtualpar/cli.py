"""The ``virtualpar`` command line; each subcommand lives in :mod:`virtualpar.commands`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from . import __version__
from .commands import COMMANDS

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="virtualpar", description="One laptop as a virtual cluster.")
    parser.add_argument("--version", action="version", version=f"virtualpar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        command = name.rsplit(".", 1)[-1]
        try:  # a command's register() imports what it lists (schedules, strategies) before adding its parser
            importlib.import_module(name).register(sub)
        except Exception as exc:  # a missing or broken dependency must not take the doctor down with it
            if command not in sub.choices:
                _unavailable(sub, command, exc)
    return parser


def _unavailable(sub: Any, command: str, exc: Exception) -> None:
    """A command whose module cannot be imported here: it stays listed, and running it says why and
    points at ``virtualpar doctor`` (exit 1) instead of every command failing with a traceback."""
    def explain(args: argparse.Namespace) -> int:
        print(f"virtualpar {command}: unavailable here: {type(exc).__name__}: {exc}; run `virtualpar doctor` "
              f"to see what is missing and how to install it", file=sys.stderr)
        return 1

    p = sub.add_parser(command, help=f"(unavailable here: {exc})", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=explain)


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand.  virtualpar's own errors (bad input, a device that raised, a deadlock)
    print as one named message, with the device's remote traceback when there is one, and exit 1;
    Ctrl-C prints one line and exits 130, as a shell reports SIGINT; anything else is a bug and
    keeps its Python traceback.  Output piped into a reader that stops early (``| head -1``) ends
    the command quietly with exit code 1, as Python's documentation advises for ``BrokenPipeError``:
    stdout is pointed at ``/dev/null`` so the interpreter's final flush cannot raise again."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # inside the try: a closed pipe found by the final flush is handled here too
        return code
    except SystemExit:  # argparse's --help, --version and usage errors print, then exit
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
        raise
    except BrokenPipeError:
        _silence_stdout()
        return 1


def _main(argv: list[str] | None) -> int:
    from .errors import VirtualParError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except VirtualParError as exc:
        # a remote traceback prints with leading blank lines (for Python's own chained display): strip them
        cause = f"{str(exc.__cause__).strip(chr(10))}\n\n" if exc.__cause__ is not None else ""
        print(f"{cause}virtualpar {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: the command's clusters are closed on the way out; no traceback
        print(f"virtualpar {args.command}: interrupted", file=sys.stderr)
        return 130


def _silence_stdout() -> None:
    """Point file descriptor 1 at /dev/null: the reader of the pipe is gone, and what the command
    (or the interpreter at exit) still flushes must go nowhere rather than raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (a test's capture): nothing to point
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
