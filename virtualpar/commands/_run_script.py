"""The target of ``virtualpar run``: the user's script loaded as a module (its errors shown from its
own frames), the function named by ``FILE.py:FUNCTION`` found in it (or a usage error that lists
the functions it does define), and the cluster options the command's flags ask for."""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import sys
import traceback

__all__ = ["cluster_options", "load"]


def _import(path: str):
    """Import the user's script; an error in it is shown as ``python FILE.py`` would show it,
    from the script's own frames, without virtualpar's import machinery above them."""
    if os.path.isdir(path) or not path.endswith(".py"):
        raise _usage(f"virtualpar run: {path!r} is not a Python file (FILE.py:FUNCTION)")
    spec = importlib.util.spec_from_file_location("__virtualpar_run__", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != os.path.abspath(path):
            tb = tb.tb_next  # a SyntaxError has no frame of the script: its own text names the line
        shown = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()
        raise SystemExit(f"virtualpar run: importing {path} failed:\n{shown}") from None
    return module


def _functions(module) -> list[str]:
    """The public functions the script itself defines (not those it imports)."""
    return sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
                  and v.__module__ == module.__name__)


def _defined(path: str) -> list[str]:
    """The public functions a script defines at top level, read without running it (an mpi4py
    script run by mistake without --mpi would start real MPI in the driver, and may never end)."""
    import ast

    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []
    return sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and not n.name.startswith("_"))


def _usage(message: str) -> SystemExit:
    """A usage error found while loading the target: the message on stderr, exit 2 as argparse's."""
    print(message, file=sys.stderr)
    return SystemExit(2)


def load(target: str):
    path, _, func = target.rpartition(":")
    if not path or not func:
        path = path or target.rstrip(":")
        if not os.path.exists(path):
            raise _usage(f"virtualpar run: expected FILE.py:FUNCTION, got {target!r} (and "
                         f"there is no file {path!r})")
        names = _defined(path)
        hint = f"; {path} defines {', '.join(names)}: e.g. virtualpar run {path}:{names[0]}" if names else ""
        raise _usage(f"virtualpar run: name the function to run on every device, FILE.py:FUNCTION, or pass "
                         f"--mpi to run an mpi4py script; got {target!r}{hint}")
    if not os.path.exists(path):
        raise _usage(f"virtualpar run: no such file {path!r}")
    module = _import(path)
    fn = getattr(module, func, None)
    if not callable(fn):
        what = (
            f"has no function {func!r}"
            if fn is None
            else f"defines {func!r} as {type(fn).__name__}, not a function"
        )
        raise _usage(f"virtualpar run: {path} {what}; its functions: {_functions(module)}")
    return fn


def cluster_options(args: argparse.Namespace, size: int) -> dict:
    tag = size > 1 if args.tag_output is None else args.tag_output
    return dict(timeout=args.timeout, run_timeout=args.run_timeout, eager_limit=args.eager_limit,
                shuffle=args.shuffle, tag_output=tag)
