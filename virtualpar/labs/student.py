"""Loading a student's file, and the rules a lab enforces on the device it hands to it.

The student's module is loaded from its path under a private name and registered with cloudpickle
to ship *by value*, so its functions reach the device processes whatever the start method.  A lab
that asks for an algorithm "from send/recv" hands the student a :class:`RuledDevice`: the real
device with the calls the lab forbids replaced by ones that raise :class:`LabRuleError`.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import sys
import traceback
from types import ModuleType
from typing import Any, Iterable

from ..errors import UsageError, VirtualParError

__all__ = ["broke_rule", "LabRuleError", "RuledDevice", "StudentCodeError", "StudentFunction", "load_student",
           "COLLECTIVES", "student_traceback"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter",
               "all_to_all", "barrier")
_COUNTER = itertools.count()


class LabRuleError(VirtualParError):
    """The student's code called something the lab forbids."""


def broke_rule(exc: BaseException | None) -> bool:
    """Whether a run's error is the lab's rule refusing a call (raised directly, or as a device's
    error naming it)."""
    return isinstance(exc, LabRuleError) or getattr(exc, "exc_type", None) == "LabRuleError"


class StudentCodeError(UsageError):
    """The student's file cannot be loaded, or lacks a function the lab asks for."""


def load_student(path: str | os.PathLike[str], functions: Iterable[str]) -> ModuleType:
    """Import the student's file and check it defines ``functions``; errors show the student's own
    frames, as ``python FILE.py`` would."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise StudentCodeError(f"no such file {path!r}: write your solution there (virtualpar lab start)")
    name = f"_virtualpar_lab_student_{next(_COUNTER)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise StudentCodeError(f"{path!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the student's error, shown from their own frames
        tb = exc.__traceback__
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != os.path.abspath(path):
            tb = tb.tb_next
        shown = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()
        raise StudentCodeError(f"importing {path} failed:\n{shown}") from None
    missing = [f for f in functions if not callable(getattr(module, f, None))]
    if missing:
        raise StudentCodeError(f"{path} must define {', '.join(f'{m}()' for m in missing)}")
    return module


class RuledDevice:
    """A device on which the calls in ``forbidden`` raise :class:`LabRuleError` naming the lab's
    rule, and which records each collective it makes (``calls``: name and shape) for the cost
    checks; everything else is the real device's."""

    def __init__(self, dev: Any, forbidden: Iterable[str], rule: str) -> None:
        self._dev = dev
        self._forbidden = frozenset(forbidden)
        self._rule = rule
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        if name in self._forbidden:
            def refused(*args: Any, **kwargs: Any) -> Any:
                raise LabRuleError(f"{self._dev.name} called dev.{name}(): {self._rule}")
            return refused
        attr = getattr(self._dev, name)
        if name in COLLECTIVES:
            def recorded(*args: Any, **kwargs: Any) -> Any:
                self.calls.append((name, tuple(getattr(args[0], "shape", ())) if args else ()))
                return attr(*args, **kwargs)
            return recorded
        return attr


_LOADED: dict[tuple[str, float], ModuleType] = {}


class StudentFunction:
    """A function of the student's file, shipped to the devices as (path, name): each device loads
    the file itself (once per file version), so tracebacks name the student's file and lines — a
    function pickled by value would show as ``<dynamic-code>``."""

    def __init__(self, path: str | os.PathLike[str], name: str) -> None:
        self.path, self.name = os.path.abspath(os.fspath(path)), name

    def __repr__(self) -> str:
        return f"{self.name}() of {self.path}"

    def resolve(self) -> Any:
        key = (self.path, os.stat(self.path).st_mtime)
        if key not in _LOADED:
            _LOADED[key] = load_student(self.path, [self.name])
        return getattr(_LOADED[key], self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


def student_traceback(text: str, path: str) -> str:
    """The frames of a remote traceback that are in the student's file, and the error itself."""
    path = os.path.abspath(path)
    lines, keep, out = text.splitlines(), False, []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("Traceback ("):
            out.append(stripped)
        elif stripped.startswith("File "):
            keep = f'"{path}"' in stripped
            if keep:
                out.append("  " + stripped)
        elif line.startswith((" ", "\t")):
            if keep:
                out.append("    " + stripped)
        elif stripped:
            out.append(line)
    return "\n".join(out)
