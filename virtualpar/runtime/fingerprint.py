"""What a collective call is, as the contract check compares it across its group: a fingerprint
(op, readable description, comparable key), its stable 64-bit digest, and the fields on which
several fingerprints differ (see runtime/collective_call.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

__all__ = ["_fingerprint", "_digest", "_dtype_name", "_differences"]

_ROOT_ONLY_INPUT = ("broadcast", "scatter")  # x is read on the root only
_DIM_MASKED = ("all_gather", "gather")  # pieces may differ in size along dim


def _fingerprint(name: str, x: Any, algo: str, params: dict[str, Any]) -> tuple[str, str, tuple]:
    """(op, readable description, comparable key) of one call."""
    parts = []
    shape = dtype = None
    if isinstance(x, np.ndarray):
        shape, dtype = tuple(x.shape), _dtype_name(x.dtype)
        parts += [f"shape={shape}", dtype]
    parts += [f"{k}={v}" for k, v in params.items()]
    parts.append(f"algorithm={algo}")
    key = (("shape", shape), ("dtype", dtype), *sorted(params.items()), ("algorithm", algo))
    return name, f"{name}({', '.join(parts)})", key


_DIGESTS: dict[tuple, int] = {}


def _digest(fp: tuple[str, str, tuple]) -> int:
    """A stable 64-bit digest of what :func:`_differences` compares: the op and the comparable key,
    without the gathered dim's size (pieces may differ there) and without a root-only input's
    shape and dtype (non-roots have none).  Stable across processes (blake2b, not ``hash``, whose
    strings are salted per process under spawn)."""
    name, _, key = fp
    digest = _DIGESTS.get((name, key))
    if digest is None:
        fields = dict(key)
        if name in _ROOT_ONLY_INPUT:
            fields.pop("shape", None)
            fields.pop("dtype", None)
        elif name in _DIM_MASKED and fields.get("shape") is not None:
            fields["shape"] = tuple("*" if i == fields["dim"] else n for i, n in enumerate(fields["shape"]))
        text = repr((name, sorted(fields.items())))
        digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
        if len(_DIGESTS) >= 4096:
            _DIGESTS.clear()
        _DIGESTS[(name, key)] = digest
    return digest


_DTYPE_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, cached (it costs ~2 µs per call); structured dtypes are never cached,
    because two equal ones can print differently."""
    name = _DTYPE_NAMES.get(dtype) if dtype.names is None else None
    if name is None:
        name = str(dtype)
        if dtype.names is None:
            _DTYPE_NAMES[dtype] = name
    return name


def _differences(fps: list[tuple[str, str, tuple]], name: str) -> list[str]:
    """The fields on which the fingerprints disagree, in fingerprint order ("collective" first).

    Pieces of an all_gather/gather may differ in size along the gathered dim, so when every device
    gathers along the same dim, that dim is left out of the shape comparison.  The algorithm is named
    only when nothing else differs: a default algorithm depends on the op and the size, so a
    different algorithm next to a different op or shape is a consequence, not the cause.
    """
    keys = [dict(fp[2]) for fp in fps]
    dims = {k.get("dim") for k in keys}
    masked = name in _DIM_MASKED and len({fp[0] for fp in fps}) == 1 and len(dims) == 1
    fields: dict[str, set] = {"collective": {fp[0] for fp in fps}}
    for key in keys:
        for k, v in key.items():
            if v is None and name in _ROOT_ONLY_INPUT and k in ("shape", "dtype"):
                continue  # non-roots of broadcast/scatter have no input to compare
            if k == "shape" and masked and v is not None:
                v = tuple("*" if i == key["dim"] else s for i, s in enumerate(v))
            fields.setdefault(k, set()).add(repr(v))
    differs = [k for k, vals in fields.items() if len(vals) > 1]
    if len(differs) > 1 and "algorithm" in differs:
        differs.remove("algorithm")  # the default algorithm follows the op and size: name the cause
    return differs
