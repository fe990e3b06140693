"""A collective call validated once (:class:`CollectiveSpec`) and the group it runs on (:class:`GroupInfo`).

``CollectiveSpec.build`` checks a call's arguments where the user made it (root, dims, reduce op,
the input's type and dtype), picks the default algorithm (every member sees the same shape, dtype
and group, so every member picks the same one), and works out once what each later run of the
same call needs: the fingerprint and its 64-bit digest for the contract check
(:mod:`.collective_call`), the algorithm's function and parameters, and the texts of its flight
record and trace event.  Specs are kept per device (``DeviceCore.specs``), keyed by the call, so a
loop of collectives validates once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..collectives import ALGORITHMS, FENCE_FIRST, default_algorithm
from ..collectives.direct import check_all_reduce_memory as check_direct_memory
from ..collectives.ops import check_op, premultiplies
from ..collectives.shm_copy import usable as shm_usable
from ..errors import PayloadError, UsageError
from ..transport.payload import plain_array
from .fingerprint import _ROOT_ONLY_INPUT, _digest, _dtype_name, _fingerprint

if TYPE_CHECKING:  # pragma: no cover
    from .core import DeviceCore

__all__ = ["CollectiveSpec", "GroupInfo"]


class GroupInfo(NamedTuple):
    """A collective's group resolved on the mesh (``VirtualDevice._group`` keeps them)."""

    axes: tuple[str, ...]
    ranks: tuple[int, ...]
    position: int  # of the calling device in ``ranks``
    desc: str  # ``tp=(0,1)``, for messages
    kind: int = 0  # which set of mesh axes the group spans (runtime/fence_kinds.py)


@dataclass
class CollectiveSpec:
    """A validated collective call: what runs, on which group, with which parameters."""

    name: str
    axes: tuple[str, ...]
    ranks: tuple[int, ...]
    position: int
    algorithm: str
    params: dict[str, Any]
    group_desc: str
    kind: int = 0  # of the group (runtime/fence_kinds.py)
    fingerprint: tuple[str, str, tuple] = field(default=("", "", ()))
    digest: int = 0  # 64 bits that agree across the group exactly when the fingerprints do
    # worked out once per cached call, so that a repeated call does none of it again:
    reads_x: bool = False  # does this device's call read its input (a non-root's broadcast does not)
    run: Any = None  # the algorithm's function
    fence_first: bool = False  # the contract check rides on the algorithm's first fence
    tail: str = ""  # of the flight record's text, after the group's call number
    traced: tuple = ()  # the trace event's fixed fields: (group, shape, dtype name, algorithm)
    run_params: dict[str, Any] = field(default_factory=dict)  # what the algorithm is called with
    premul: bool = False  # an avg summed as x/n (collectives.ops.premultiplies)

    @classmethod
    def build(cls, core: "DeviceCore", name: str, x: Any, group: GroupInfo, algorithm: str | None,
              params: dict[str, Any]) -> "CollectiveSpec":
        """The validated call, from the device's cache when the same op, group, algorithm, parameters
        and input shape and dtype were seen before (validation, the default algorithm's choice and
        the fingerprint depend on nothing else): a loop of collectives validates once.  The spec
        holds no array — the caller passes ``x`` along when ``reads_x`` — so the cached one is
        returned as it is: at 64 devices on two cores every µs of Python is paid again with cold
        caches after each wake-up."""
        key = None
        if x is None or type(x) is np.ndarray:  # anything else: validate (and most likely reject) it
            try:  # parameters keyed with their types: root=True must not pass as root=1
                key = (name, group, algorithm, x if x is None else (x.shape, x.dtype),
                       tuple([(k, type(v), v) for k, v in params.items()]) if params else ())
                known = core.specs.get(key)
            except TypeError:  # an unhashable parameter: likewise
                key = None
            else:
                if known is not None:
                    return known
        spec = cls._validate(core, name, x, group, algorithm, params)
        if key is not None:
            if len(core.specs) >= 256:
                core.specs.clear()
            core.specs[key] = spec
        return spec

    @classmethod
    def _validate(cls, core: "DeviceCore", name: str, x: Any, group: GroupInfo, algorithm: str | None,
                  params: dict[str, Any]) -> "CollectiveSpec":
        axes, ranks, pos, gdesc, kind = group
        n = len(ranks)
        where = f"{core.name}: {name} on group {gdesc}"
        choices = ALGORITHMS[name]
        if algorithm is not None and (not isinstance(algorithm, str) or algorithm not in choices):
            raise UsageError(f"{where}: unknown algorithm {algorithm!r}; choose one of {sorted(choices)}")
        if "root" in params:
            root = params["root"]
            if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
                raise UsageError(f"{where}: root={root!r} is not an int; root is a position in the group, "
                                 f"0..{n - 1}")
            if not 0 <= root < n:
                raise UsageError(f"{where}: root={root!r} is out of range; root is a position in the group, "
                                 f"0..{n - 1}")
            params["root"] = int(root)
        if isinstance(params.get("op"), str):
            params["op"] = str(params["op"])  # np.str_('sum') is 'sum': the same call, the same digest
        raw = {k: int(params[k]) if isinstance(params[k], np.integer) else params[k]  # np.int64(0) is 0
               for k in ("dim", "split_dim", "concat_dim") if k in params}
        reads_x = name != "barrier" and not (name in _ROOT_ONLY_INPUT and pos != params.get("root"))
        if reads_x:
            if not plain_array(x):
                if isinstance(x, np.ndarray):
                    raise PayloadError(f"{where}: needs a plain numpy array, got {type(x).__name__}, an "
                                       "ndarray subclass whose own state (a mask, ...) would be lost; pass "
                                       "np.asarray(x) to reduce its data")
                raise PayloadError(f"{where}: needs a numpy array, got {type(x).__name__}")
            if x.dtype.hasobject or x.dtype.names is not None:
                what = "objects" if x.dtype.hasobject else "a structured dtype"
                raise PayloadError(f"{where}: cannot move arrays of {what} ({x.dtype}) as raw bytes; send() "
                                   "and recv() move them pickled")
            for key in ("dim", "split_dim", "concat_dim"):
                if key in params:
                    params[key] = _normalize_dim(where, key, params[key], x.ndim)
            if "op" in params:
                try:
                    check_op(params["op"], x.dtype)
                except UsageError as exc:
                    raise exc.replace(f"{where}: {exc.message}") from None
        elif name != "barrier":
            x = None
        if "op" in params and not isinstance(params["op"], str):
            raise UsageError(f"{where}: op must be a name such as 'sum', got {params['op']!r}")
        algo = algorithm
        if algo is None:  # every member sees the same shape, dtype and group: the same choice
            nbytes, itemsize = (x.nbytes, x.itemsize) if isinstance(x, np.ndarray) else (0, 1)
            shared = shm_usable(name, core.scratch_bytes, itemsize, n)
            algo = default_algorithm(name, nbytes, n, shared_memory=shared)
        if name == "all_reduce" and algo == "direct" and isinstance(x, np.ndarray):
            check_direct_memory(where, n, x.nbytes, core.size)
        spec = cls(name, axes, ranks, pos, algo, params, gdesc, kind)
        # root-only inputs: non-roots cannot normalise a negative dim, so compare what was passed
        passed = {k: v for k, v in raw.items() if name in _ROOT_ONLY_INPUT}
        spec.fingerprint = _fingerprint(name, x, algo, dict(params, **passed))
        spec.digest = _digest(spec.fingerprint)
        spec.reads_x = reads_x
        spec.run = choices[algo]
        spec.run_params = params
        if x is not None and premultiplies(params.get("op", ""), x.dtype, n):  # float16: summed as x/n
            spec.premul, spec.run_params = True, dict(params, op="sum")
        spec.fence_first = (name, algo) in FENCE_FIRST
        spec.tail = f" on {gdesc}: {spec.fingerprint[1]}"
        array = isinstance(x, np.ndarray)
        spec.traced = (ranks, tuple(x.shape) if array else None, _dtype_name(x.dtype) if array else None,
                       algo)
        return spec


def _normalize_dim(where: str, key: str, dim: Any, ndim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise UsageError(f"{where}: {key} must be an int, got {dim!r}")
    if ndim == 0 or not -ndim <= dim < ndim:
        raise UsageError(f"{where}: {key}={dim} is out of range for an array of shape with {ndim} dims")
    return int(dim) % ndim
