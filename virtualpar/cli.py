"""The ``virtualpar`` command line; each subcommand lives in :mod:`virtualpar.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .commands import COMMANDS

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="virtualpar", description="One laptop as a virtual cluster.")
    parser.add_argument("--version", action="version", version=f"virtualpar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand.  virtualpar's own errors (bad input, a device that raised, a deadlock)
    print as one named message, with the device's remote traceback when there is one, and exit 1;
    Ctrl-C prints one line and exits 130, as a shell reports SIGINT; anything else is a bug and
    keeps its Python traceback."""
    from .errors import VirtualParError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except VirtualParError as exc:
        cause = f"{exc.__cause__}\n\n" if exc.__cause__ is not None else ""
        print(f"{cause}virtualpar {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: the command's clusters are closed on the way out; no traceback
        print(f"virtualpar {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
