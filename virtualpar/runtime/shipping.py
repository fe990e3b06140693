"""What the driver ships to devices and reads about them: a run's function and arguments
(cloudpickle), and a device's resident memory (/proc)."""

from __future__ import annotations

import pickle
from typing import Any, Callable

from .._words import counted, plural
from ..errors import PayloadError, UsageError

__all__ = ["dumps_call", "resident", "ByValue"]


class ByValue:
    """Bytes from :func:`~virtualpar.transport.payload.dumps_by_value` that unpickle as the object itself: a
    device's reply holding one is read by the driver's plain unpickler with no unwrapping."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple:
        return (pickle.loads, (self.data,))


def dumps_call(name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    """``(fn, args, kwargs)`` pickled with cloudpickle (functions by value where needed; plain
    pickle's speed for everything importable).  Errors name the argument that could not go.
    ``fn`` is checked here first, in the driver: not callable, or not callable as
    ``fn(dev, *args, **kwargs)`` (a forgotten ``dev``), would fail on every device at once."""
    import cloudpickle

    _check_callable(name, fn, args, kwargs)
    try:
        return cloudpickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        culprit = f"{name}()"
        labelled = [(f"argument {i} ({type(a).__name__})", a) for i, a in enumerate(args)]
        labelled += [(f"keyword argument {k}= ({type(v).__name__})", v) for k, v in kwargs.items()]
        for label, value in labelled:
            try:
                cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:
                culprit = label
                break
        held = _captured_clusters(fn) if culprit == f"{name}()" else []
        hint = (f"; {name}() uses the cluster {', '.join(held)} itself, which stays in the "
                "driver: on a device use "
                "dev (its collectives, dev.state)") if held else ""
        found = _unpicklable_capture(fn, cloudpickle) if culprit == f"{name}()" and not held else None
        if found:
            raise PayloadError(f"cannot send {name}() to the devices: it captures {found}, which cannot be "
                               f"pickled ({exc}); create it inside the function, on the device, or pass what "
                               "it holds instead") from None
        raise PayloadError(f"cannot send {culprit} of {name}() to the devices: "
                           f"{exc}{hint}. Everything passed to "
                           "cluster.run must be picklable (functions may be lambdas or closures)") from None


def _check_callable(name: str, fn: Any, args: tuple, kwargs: dict) -> None:
    import inspect

    if not callable(fn):
        raise UsageError("cluster.run needs a function fn(dev, ...) to run on every device, "
                         f"got {type(fn).__name__} "
                         f"{fn!r}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: let the devices try
        return
    try:
        sig.bind(None, *args, **kwargs)
    except TypeError as exc:
        keywords = f"{plural(len(kwargs), 'keyword')} {sorted(kwargs)}" if kwargs else "no keywords"
        raise UsageError(f"{name}() cannot be called as {name}(dev, *args, **kwargs) with "
                         f"{counted(len(args), 'argument')} "
                         f"and {keywords} given ({exc}); every device calls it with itself "
                         f"first: def {getattr(fn, '__name__', 'fn')}(dev, ...)") from None


def _captured_clusters(fn: Any) -> list[str]:
    """Names under which ``fn`` reaches a ``VirtualCluster`` (its globals or closure)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    found = [n for n in code.co_names if type(getattr(fn, "__globals__",
                                                      {}).get(n)).__name__ == "VirtualCluster"]
    cells = zip(code.co_freevars, getattr(fn, "__closure__", None) or ())
    found += [n for n, c in cells if type(getattr(c, "cell_contents", None)).__name__ == "VirtualCluster"]
    return found


def _unpicklable_capture(fn: Any, cloudpickle: Any, seen: set[int] | None = None) -> str | None:
    """The first thing ``fn`` takes along that cannot be pickled, named: a closure variable, a
    default argument or a global it reads (``the variable 'lock' (a _thread.lock)``), looking
    inside captured functions too (``... of the function 'helper'``); None if none is found."""
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return None
    seen.add(id(fn))
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    names: list[tuple[str, str, Any]] = []
    cells = zip(code.co_freevars, getattr(fn, "__closure__", None) or ())
    for n, cell in cells:
        try:
            names.append(("variable", n, cell.cell_contents))
        except ValueError:  # an empty cell: nothing to send
            continue
    params = code.co_varnames[:code.co_argcount]
    for n, v in zip(params[len(params) - len(fn.__defaults__ or ()):], fn.__defaults__ or ()):
        names.append(("default argument", n, v))
    names += [("default argument", n, v) for n, v in (getattr(fn, "__kwdefaults__", None) or {}).items()]
    glob = getattr(fn, "__globals__", {})
    for n in _global_names(code):
        if n in glob:
            names.append(("global", n, glob[n]))
    for what, n, value in names:
        try:
            cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            inner = _unpicklable_capture(value, cloudpickle, seen) if callable(value) else None
            kind = type(value)
            here = f"the {what} {n!r} (a {kind.__module__}.{kind.__qualname__})"
            return f"{inner}, inside {here}" if inner else here
    return None


def _global_names(code: Any) -> list[str]:
    """Global names a code object and its nested functions' code read."""
    out = list(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            out += _global_names(const)
    return list(dict.fromkeys(out))


def resident(pid: int) -> dict[str, int]:
    fields = {"Rss": 0, "Pss": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in fields:
                    fields[key] = int(rest.split()[0]) * 1024  # kB
    except OSError:
        pass
    return {"rss": fields["Rss"], "pss": fields["Pss"]}


