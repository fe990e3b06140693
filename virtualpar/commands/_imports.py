"""``virtualpar doctor``'s import check: does every module of virtualpar import here, and if not,
what does the user install?

A package that virtualpar imports but the environment lacks shows only when the module that
imports it is first used (``virtualpar tour`` died half-way through on a missing ``scipy``, pulled in
by ``nn``'s exact GELU through ``autograd.scipy``).  So the doctor imports every module, as
:func:`pkgutil.walk_packages` lists them, and turns each failure into one finding:

- a missing module that a requirement of virtualpar provides is ``FAIL`` with the requirement as
  installed metadata spells it (``python -m pip install "scipy>=1.11"``);
- a missing module of an extra (mpi, viz; pytest for the plugin) is ``WARN`` naming what it disables;
- a missing module virtualpar does not declare is ``FAIL`` too, and says setup.cfg should declare it;
- any other exception while importing (an old ``autograd`` under numpy 2 raises ``AttributeError``)
  is ``FAIL`` naming the installed package it was raised in and the version virtualpar requires.

Modules that start MPI when imported (a top-level ``from mpi4py import MPI``) are not imported
here: loading MPI into the doctor's process would initialise it before the live check forks its
devices.  Their dependency is the mpi extra, which the environment check reports on its own.

Cost: importing every module once, about 1–2 s, most of it numpy's, scipy's and autograd's own.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import sys
import traceback
from importlib import metadata

__all__ = ["import_findings", "requirements"]

Finding = tuple[str, str, str]

# used when virtualpar runs from a checkout that is not installed, so no metadata can be read
_FALLBACK = {"numpy": "numpy>=1.26", "networkx": "networkx>=3.0", "autograd": "autograd[scipy]>=1.7",
             "scipy": "scipy>=1.11", "cloudpickle": "cloudpickle>=2.2", "threadpoolctl": "threadpoolctl>=3.1"}
EXTRAS = {"matplotlib": ("viz", "PNG timelines (trace.gantt, the tour's pictures)"),
          "mpi4py": ("mpi", "real MPI runs under mpiexec and the MPICH references"),
          "pytest": ("test", "the pytest plugin (the cluster fixture, the spmd mark)")}
_SKIP = {"virtualpar.__main__"}  # importing it runs the command line


def requirements() -> dict[str, str]:
    """Module name -> the requirement of virtualpar that installs it (``{"scipy": "scipy>=1.11"}``),
    read from the installed metadata, so it is what ``pip install`` of this version asked for."""
    try:
        declared = metadata.requires("virtualpar") or []
    except metadata.PackageNotFoundError:
        return dict(_FALLBACK)
    out = {}
    for req in declared:
        spec, _, marker = req.partition(";")
        if "extra" in marker:
            continue
        name = re.match(r"\s*([A-Za-z0-9_.-]+)", spec)
        if name:
            out[name.group(1).lower().replace("-", "_")] = spec.strip()
    return out or dict(_FALLBACK)


def _starts_mpi(path: str | None) -> bool:
    """Whether the module at ``path`` imports ``mpi4py.MPI`` when it is imported (at its top
    level, a ``try`` or an ``if`` included; not inside a function or a class)."""
    if not path or not path.endswith(".py"):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return False
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.ImportFrom) and (node.module == "mpi4py.MPI" or (
                node.module == "mpi4py" and any(a.name == "MPI" for a in node.names))):
            return True
        if isinstance(node, ast.Import) and any(a.name == "mpi4py.MPI" for a in node.names):
            return True
        todo.extend(ast.iter_child_nodes(node))
    return False


def _missing(exc: BaseException) -> str | None:
    """The top-level name of the module whose absence caused ``exc``, following the chain
    (``raise ImportError("... needs mpi4py") from exc`` keeps the original as the cause)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ImportError) and exc.name:
            return exc.name.partition(".")[0]
        exc = exc.__cause__ or exc.__context__
    return None


def _modules() -> list[tuple[str, BaseException | None]]:
    """Every module of virtualpar with the exception importing it raised (None: it imported)."""
    import virtualpar

    results: list[tuple[str, BaseException | None]] = [("virtualpar", None)]
    pending = [("virtualpar", list(virtualpar.__path__))]
    while pending:
        prefix, path = pending.pop(0)
        for info in pkgutil.iter_modules(path, prefix + "."):
            if info.name in _SKIP:
                continue
            spec = getattr(info.module_finder, "find_spec", lambda *_: None)(info.name)
            if spec is not None and _starts_mpi(spec.origin):
                continue
            try:
                module = importlib.import_module(info.name)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 - every failure is a finding, never a traceback
                results.append((info.name, exc))
                continue
            results.append((info.name, None))
            if info.ispkg:
                pending.append((info.name, list(module.__path__)))
    return results


def _raised_in(exc: BaseException) -> str | None:
    """The top-level package of the deepest frame of ``exc`` that is neither virtualpar's, nor the
    standard library's (the third-party package where an import broke)."""
    culprit = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        top = str(frame.f_globals.get("__name__", "")).partition(".")[0]
        if top and top != "virtualpar" and top not in sys.stdlib_module_names and not top.startswith("_"):
            culprit = top
    return culprit


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "of unknown version"


def _cause(exc: BaseException, reqs: dict[str, str]) -> tuple[str, str]:
    """(status, why) of one failed import: what is missing or broken, and the install that fixes it."""
    missing = _missing(exc) if isinstance(exc, ImportError) else None
    if missing in EXTRAS:
        extra, disables = EXTRAS[missing]
        return "WARN", (f"{missing} is missing: {disables} will not work; "
                        f'python -m pip install "virtualpar[{extra}]"')
    if missing in reqs:
        return "FAIL", (f"{missing} is missing, a requirement of virtualpar: "
                        f'python -m pip install "{reqs[missing]}"')
    if missing is not None:
        return "FAIL", (f"{missing} is missing, and virtualpar does not declare it (setup.cfg should): "
                        f"python -m pip install {missing}")
    where = _raised_in(exc)
    fix = ""
    if where:
        wanted = reqs.get(where)
        upgrade = f'; virtualpar requires {wanted}: python -m pip install -U "{wanted}"' if wanted else ""
        fix = f" (raised in {where} {_version(where)}{upgrade})"
    return "FAIL", f"{type(exc).__name__}: {exc}{fix}"


def import_findings() -> list[Finding]:
    """One finding per cause: ``OK`` if every module imported, else what is missing or broken."""
    reqs = requirements()
    results = _modules()
    failed: dict[tuple[str, str], list[str]] = {}
    for name, exc in results:
        if exc is not None:
            failed.setdefault(_cause(exc, reqs), []).append(name)
    if not failed:
        return [("OK", "imports", f"all {len(results)} modules of virtualpar import")]
    found = []
    for (status, why), names in failed.items():
        more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
        found.append((status, "imports", f"import {names[0]}{more} failed: {why}"))
    return found
