"""A device's error, packaged for the driver: who raised it (user code or virtualpar's), on which
device and at which op, whether it follows from an abort — and always picklable.

An error in a device never stays there: the worker sends it back as the reply to the command it
was serving, and the driver picks the root cause among the devices' errors (runtime/supervisor.py).
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from typing import Any

import numpy as np

from ..errors import DeviceAborted, DeviceError, VirtualParError

__all__ = ["package_error", "raised_in"]


def package_error(dev: Any, exc: BaseException) -> tuple:
    """(error, formatted traceback, monotonic time, secondary?) ready to pickle to the driver.

    Exceptions from user code become a ``DeviceError``.  virtualpar's own errors keep their type,
    but one raised below the device layer (a bad mesh axis, an unpicklable payload) does not know
    which device it happened on, so it gets the device's name, rank and last op here.  An error
    is *secondary* if it is, or was caused by, a ``DeviceAborted``: it never hides the root cause.
    """
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    last = (
        f"last op #{dev.op_seq}: {dev._last_op}"
        if dev.op_seq > getattr(dev, "_run_ops_from", 0)
        else "before any op of this run"
    )
    if isinstance(exc, VirtualParError):
        err: BaseException = exc
        if getattr(exc, "rank", None) is None:
            prefix = "" if exc.message.startswith(dev.name) else f"{dev.name}: "
            err = exc.replace(f"{prefix}{exc.message} ({last})", rank=dev.rank, index=str(dev.index),
                              op_seq=dev.op_seq)
    else:
        notes = "".join(f" {n}" for n in getattr(exc, "__notes__", ()))  # where, added on the way up
        err = DeviceError(
            f"{dev.name} raised {type(exc).__name__} in {raised_in(exc)}: {exc}{notes} ({last})",
            rank=dev.rank, index=str(dev.index), op_seq=dev.op_seq, exc_type=type(exc).__name__,
            remote_traceback=tb,
        )
    try:
        pickle.dumps(err)
    except Exception:
        err = DeviceError(f"{dev.name} raised {type(exc).__name__}: {exc} ({last})", rank=dev.rank,
                          index=str(dev.index), op_seq=dev.op_seq, exc_type=type(exc).__name__,
                          remote_traceback=tb)
    return (err, tb, time.monotonic(), _caused_by_abort(exc))


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../virtualpar
_NUMPY, _STDLIB = (os.path.dirname(os.path.abspath(m.__file__)) for m in (np, os))


def _library(path: str) -> bool:
    """numpy or the standard library (other installed packages may be the user's own)."""
    return path.startswith(_NUMPY) or (path.startswith(_STDLIB) and "-packages" not in path[len(_STDLIB):])


def raised_in(exc: BaseException) -> str:
    """Whose code raised ``exc``: "user code", or "virtualpar code (path:line)" when the innermost
    frame outside numpy and the standard library is virtualpar's own (a numpy error raised inside a
    collective is then not blamed on the user's function)."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        # code typed in a shell or exec'd is the user's; "<frozen ...>" is not
        if frame.filename.startswith("<"):
            if frame.filename.startswith("<frozen"):
                continue
            return "user code"
        path = os.path.abspath(frame.filename)
        if path.startswith(_PACKAGE + os.sep):
            return f"virtualpar code ({os.path.relpath(path, os.path.dirname(_PACKAGE))}:{frame.lineno})"
        if not _library(path):
            return "user code"
    return "user code"


def _caused_by_abort(exc: BaseException | None) -> bool:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, DeviceAborted):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
