"""What the driver ships to devices and reads about them: a run's function and arguments
(cloudpickle), and a device's resident memory (/proc)."""

from __future__ import annotations

import pickle
from typing import Any, Callable

from ..errors import PayloadError

__all__ = ["dumps_call", "resident", "dumps_by_value", "ByValue"]


def dumps_by_value(obj: Any) -> bytes:
    """``obj`` pickled, plain pickle first and cloudpickle when that fails: a class the run's
    function brought by value (defined in a script's ``__main__`` or a notebook) is "not the same
    object as __main__.Box" to plain pickle; cloudpickle sends it by value again, and its class
    tracker makes the far end's class the one it already has.  ``pickle.loads`` reads either.
    Only that case goes by value: what plain pickle refuses otherwise (a lambda) is refused, as
    mpi4py and torch refuse it."""
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except pickle.PicklingError as exc:
        if "not the same object as" not in str(exc):
            raise  # a lambda or a local class fails here as under mpi4py, not only under virtualpar
        import cloudpickle

        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


class ByValue:
    """Bytes from :func:`dumps_by_value` that unpickle as the object itself: a device's reply
    holding one is read by the driver's plain unpickler with no unwrapping."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple:
        return (pickle.loads, (self.data,))


def dumps_call(name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    """``(fn, args, kwargs)`` pickled with cloudpickle (functions by value where needed; plain
    pickle's speed for everything importable).  Errors name the argument that could not go."""
    import cloudpickle

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
        raise PayloadError(f"cannot send {culprit} of {name}() to the devices: {exc}. Everything passed to "
                           "cluster.run must be picklable (functions may be lambdas or closures)") from None


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


