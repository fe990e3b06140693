"""Message payloads: how an object becomes bytes for the ring, and how a receive buffer is checked.

A C-contiguous view of a numpy array of a plain dtype (no objects, no fields, a dtype string that
fits the header's 16-byte field) travels raw: kind ``KIND_ARRAY``, its bytes as a flat ``uint8``
view (no copy unless the array is not C-contiguous), its dtype string and shape in the header.
Anything else is pickled at the highest protocol and travels as ``KIND_PICKLE`` bytes.

A payload crosses the transport as a flat byte ``memoryview`` (:func:`byte_view`): a buffer-protocol
cast costs ~0.2 µs where ``arr.reshape(-1).view(np.uint8)`` costs ~0.6 µs, and at 4 KiB that is
a tenth of a message's Python.  Both dtype conversions, ``np.dtype`` -> header string on the way
out and header string -> ``np.dtype`` on the way in, run once per message and are cached (a
handful of distinct values).
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ..errors import PayloadError, UsageError
from .channel import KIND_ARRAY, KIND_PICKLE, Header

__all__ = ["encode", "plain_array", "byte_view", "header_dtype", "check_out", "dumps_by_value"]

_RAW_DTYPES: dict[np.dtype, str | None] = {}  # dtype -> its str if arrays of it travel raw, else None
_DTYPES: dict[str, np.dtype] = {}  # dtype str from a header -> dtype


def _raw_dtype(dt: np.dtype) -> str | None:
    try:
        return _RAW_DTYPES[dt]
    except KeyError:
        raw = dt.str if not dt.hasobject and dt.names is None and len(dt.str) <= 16 else None
        _RAW_DTYPES[dt] = raw
        return raw


def header_dtype(s: str) -> np.dtype:
    """The ``np.dtype`` a header's dtype string names (cached)."""
    dt = _DTYPES.get(s)
    if dt is None:
        dt = _DTYPES[s] = np.dtype(s)
    return dt


def byte_view(arr: np.ndarray) -> memoryview:
    """The bytes of the C-contiguous array ``arr`` as a flat, writable-if-``arr``-is memoryview."""
    try:
        return memoryview(arr).cast("B")
    except (TypeError, ValueError):  # a zero in the shape, or a dtype the buffer protocol lacks (M8, m8)
        return memoryview(arr.reshape(-1).view(np.uint8))


def plain_array(obj: Any) -> bool:
    """Is ``obj`` an array whose bytes, shape and dtype are all of it: an ``ndarray`` or a
    ``memmap``, not a subclass with state of its own (a ``MaskedArray``'s mask, a ``matrix``'s
    2-d rules) that raw bytes would silently drop."""
    return type(obj) is np.ndarray or isinstance(obj, np.memmap)


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


def encode(obj: Any) -> tuple[int, np.ndarray, memoryview, str, tuple[int, ...]]:
    """(kind, C-contiguous payload array, its bytes, dtype str, shape) for any picklable object;
    plain arrays go raw, other ndarray subclasses are pickled (their own state travels too).  The
    array keeps the bytes alive and gives a rendezvous offer its address."""
    if plain_array(obj) and (dtype := _raw_dtype(obj.dtype)) is not None:
        arr = obj if obj.flags.c_contiguous else np.asarray(obj, order="C")  # 0-d stays 0-d
        return KIND_ARRAY, arr, byte_view(arr), dtype, arr.shape
    try:
        data = dumps_by_value(obj)
    except Exception as exc:  # pickling raises many types (PicklingError, TypeError, AttributeError)
        raise PayloadError(f"cannot send {type(obj).__name__} object: it cannot be pickled ({exc})") from None
    return KIND_PICKLE, np.frombuffer(data, np.uint8), memoryview(data), "|u1", ()


def check_out(out: np.ndarray, header: Header | None) -> None:
    """Raise ``UsageError`` unless ``out`` can hold the array message ``header`` describes."""
    if header is None or header.kind & 0xFF != KIND_ARRAY:
        raise UsageError("recv(out=...) needs an array message, but the sender sent a pickled object")
    if out.shape != header.shape or out.dtype != header_dtype(header.dtype):
        raise UsageError(
            f"recv buffer has shape {tuple(out.shape)} and dtype {out.dtype}, "
            f"but the message holds shape {header.shape} and dtype {np.dtype(header.dtype)}"
        )
