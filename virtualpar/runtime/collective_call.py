"""One collective call on one device: validate, check the contract, run the algorithm.

The contract check is what turns the classic silent hang into an error.  Before any data moves,
the members of the group fence (transport/arrivals.py), each publishing a 64-bit digest of its
call's *fingerprint* (op, group, shape, dtype, reduce op, root, dim, algorithm), and each compares
its digest with its peers'.  If all agree, that is the whole check: two word stores and a read of
the group's digests (one C-level compare) per member and one wake-up, no messages (the
leader-based exchange it replaced sent 2(n−1) pickled messages through one device, which at 64
devices cost a barrier 10 ms).  If any differ, every
member sees it, and they all fall back to that exchange — every device sends its full fingerprint
to the group's leader (position 0), which answers every member with all of them — so that every
device raises the same ``CollectiveMismatch`` naming each device's call and what differs.
No modelled time; ``VirtualCluster(check_collectives=False)`` skips it.  A barrier whose members
have just fenced for the check needs no second fence.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..collectives import ALGORITHMS, FENCE_FIRST, default_algorithm
from ..collectives.ops import check_op
from ..errors import CollectiveMismatch, CollectiveTimeout, NonFiniteError, PayloadError, UsageError
from .config import TAG_FINGERPRINT, TAG_VERDICT
from .fingerprint import _ROOT_ONLY_INPUT, _differences, _digest, _dtype_name, _fingerprint
from .group_comm import GroupComm
from .recorder import format_records

if TYPE_CHECKING:  # pragma: no cover
    from .device import VirtualDevice

__all__ = ["CollectiveSpec", "GroupInfo", "run_collective"]

_ROOTED = ("broadcast", "reduce", "gather", "scatter")


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
    x: Any
    axes: tuple[str, ...]
    ranks: tuple[int, ...]
    position: int
    algorithm: str
    params: dict[str, Any]
    group_desc: str
    kind: int = 0  # of the group (runtime/fence_kinds.py)
    fingerprint: tuple[str, str, tuple] = field(default=("", "", ()))
    digest: int = 0  # 64 bits that agree across the group exactly when the fingerprints do

    @classmethod
    def build(cls, dev: "VirtualDevice", name: str, x: Any, group: GroupInfo, algorithm: str | None, params: dict[str, Any]) -> "CollectiveSpec":
        """The validated call, from ``dev``'s cache when the same op, group, algorithm, parameters
        and input shape and dtype were seen before (validation, the default algorithm's choice and
        the fingerprint depend on nothing else): a loop of collectives validates once, and a
        barrier costs ~40 µs less at 64 devices on two cores, where every µs of Python is paid
        again with cold caches after each wake-up."""
        key = known = None
        if x is None or type(x) is np.ndarray:  # anything else: validate (and most likely reject) it
            try:  # parameters keyed with their types: root=True must not pass as root=1
                key = (name, group, algorithm, x if x is None else (x.shape, x.dtype),
                       tuple((k, type(v), v) for k, v in params.items()))
                known = dev._specs.get(key)
            except TypeError:  # an unhashable parameter: likewise
                key = None
        if known is not None:
            template, reads_x = known  # kept without the array, which the cache must not hold alive
            spec = copy.copy(template)
            spec.x = x if reads_x else None
            return spec
        spec = cls._validate(dev, name, x, group, algorithm, params)
        if key is not None:
            if len(dev._specs) >= 256:
                dev._specs.clear()
            template = copy.copy(spec)
            template.x = None
            dev._specs[key] = (template, spec.x is not None)
        return spec

    @classmethod
    def _validate(cls, dev: "VirtualDevice", name: str, x: Any, group: GroupInfo, algorithm: str | None, params: dict[str, Any]) -> "CollectiveSpec":
        axes, ranks, pos, gdesc, kind = group
        n = len(ranks)
        where = f"{dev.name}: {name} on group {gdesc}"
        choices = ALGORITHMS[name]
        if algorithm is not None and algorithm not in choices:
            raise UsageError(f"{where}: unknown algorithm {algorithm!r}; choose one of {sorted(choices)}")
        if "root" in params:
            root = params["root"]
            if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < n:
                raise UsageError(f"{where}: root={root!r} is out of range; root is a position in the group, 0..{n - 1}")
            params["root"] = int(root)
        raw = {k: params[k] for k in ("dim", "split_dim", "concat_dim") if k in params}
        reads_x = name != "barrier" and not (name in _ROOT_ONLY_INPUT and pos != params.get("root"))
        if reads_x:
            if not isinstance(x, np.ndarray):
                raise PayloadError(f"{where}: needs a numpy array, got {type(x).__name__}")
            if x.dtype.hasobject or x.dtype.names is not None:
                raise PayloadError(f"{where}: cannot move arrays of dtype {x.dtype} as raw bytes; use send() for objects")
            for key in ("dim", "split_dim", "concat_dim"):
                if key in params:
                    params[key] = _normalize_dim(where, key, params[key], x.ndim)
            if "op" in params:
                check_op(params["op"], x.dtype)
        elif name != "barrier":
            x = None
        if "op" in params and not isinstance(params["op"], str):
            raise UsageError(f"{where}: op must be a name such as 'sum', got {params['op']!r}")
        algo = algorithm
        if algo is None:  # every member sees the same shape, dtype and group: the same choice
            nbytes, itemsize = (x.nbytes, x.itemsize) if isinstance(x, np.ndarray) else (0, 1)
            algo = default_algorithm(name, nbytes, n, shared_memory=dev._endpoint.layout.scratch_bytes >= itemsize)
        spec = cls(name, x, axes, ranks, pos, algo, params, gdesc, kind)
        # root-only inputs: non-roots cannot normalise a negative dim, so compare what was passed
        spec.fingerprint = _fingerprint(name, x, algo, dict(params, **{k: v for k, v in raw.items() if name in _ROOT_ONLY_INPUT}))
        spec.digest = _digest(spec.fingerprint)
        return spec


def _normalize_dim(where: str, key: str, dim: Any, ndim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise UsageError(f"{where}: {key} must be an int, got {dim!r}")
    if ndim == 0 or not -ndim <= dim < ndim:
        raise UsageError(f"{where}: {key}={dim} is out of range for an array of shape with {ndim} dims")
    return int(dim) % ndim


def run_collective(dev: "VirtualDevice", spec: CollectiveSpec, timeout: float) -> Any:
    """Count, record, check and run one collective on this device."""
    seq = dev._group_seq[spec.ranks] = dev._group_seq.get(spec.ranks, 0) + 1
    label = f"{spec.name} #{seq} on {spec.group_desc}"
    wall0, model0 = time.monotonic(), dev.clock
    bytes0 = sum(dev._endpoint._bytes_mv) if dev._trace else 0
    slot = dev._begin_op(f"{label}: {spec.fingerprint[1]}")
    deadline = time.monotonic() + timeout
    on_timeout = _timeout_builder(dev, spec, seq, label, timeout)
    try:
        if dev.config.check_nan and isinstance(spec.x, np.ndarray) and spec.x.dtype.kind in "fc":
            _check_finite(dev, spec, label)
        check = (lambda: _exchange_fingerprints(dev, spec, seq, deadline, on_timeout)) \
            if dev.config.check_collectives and len(spec.ranks) > 1 else None
        comm = GroupComm(dev, spec, deadline, on_timeout, check)
        if check is not None and (spec.name, spec.algorithm) not in FENCE_FIRST:
            comm.fence()  # the contract check, before any message; shm algorithms make it at their first fence
        algorithm = ALGORITHMS[spec.name][spec.algorithm]
        result = algorithm(comm) if spec.name == "barrier" else algorithm(comm, spec.x, **spec.params)
    except BaseException:
        dev._recorder.finish(slot, dev.clock, failed=True)
        raise
    dev._recorder.finish(slot, dev.clock)
    if dev._trace:  # the event's fields cost a few µs to build: only when someone will read them
        nbytes = sum(dev._endpoint._bytes_mv) - bytes0
        dev._event("collective", spec.name, wall0, model0, dev.clock, nbytes=nbytes, group=spec.ranks,
                   shape=tuple(spec.x.shape) if isinstance(spec.x, np.ndarray) else None,
                   dtype=_dtype_name(spec.x.dtype) if isinstance(spec.x, np.ndarray) else None,
                   args=(("algorithm", spec.algorithm), ("group_seq", seq)))
    return result


def _check_finite(dev: "VirtualDevice", spec: CollectiveSpec, label: str) -> None:
    x = spec.x
    if not np.isfinite(x).all():
        nan = int(np.isnan(x).sum())
        inf = int(np.isinf(x).sum())
        raise NonFiniteError(
            f"{dev.name}: input to {label} holds {nan} NaN and {inf} Inf values (op #{dev.op_seq}); "
            "check_nan is on", rank=dev.rank, index=str(dev.index), op=spec.name, op_seq=dev.op_seq,
        )


def _exchange_fingerprints(dev: "VirtualDevice", spec: CollectiveSpec, seq: int, deadline: float, on_timeout: Any) -> None:
    """The digests differ: gather every member's full fingerprint at the leader, which sends them
    all back, and raise ``CollectiveMismatch`` (every member of the group takes this path)."""
    ep = dev._endpoint
    leader = spec.ranks[0]
    mine = (dev.rank, spec.fingerprint)
    if dev.rank == leader:
        reqs = [(r, ep.irecv(r, TAG_FINGERPRINT)) for r in spec.ranks[1:]]
        fps = [mine] + [(r, req.wait(deadline - time.monotonic(), on_timeout)[1]) for r, req in reqs]
        verdict = fps if _differences([fp for _, fp in fps], spec.name) else None
        for r in spec.ranks[1:]:
            ep.isend(verdict, r, TAG_VERDICT, control=True)
    else:
        ep.isend(mine, leader, TAG_FINGERPRINT, control=True)
        verdict = ep.irecv(leader, TAG_VERDICT).wait(deadline - time.monotonic(), on_timeout)
    if verdict is not None:
        differs = _differences([fp for _, fp in verdict], spec.name)
        calls = "".join(f"\n  device {r} {dev.mesh.index(r)} called {fp[1]}" for r, fp in verdict)
        records = {r: dev._recorders[r].records() for r in spec.ranks}
        raise CollectiveMismatch(
            f"collective #{seq} on group {spec.group_desc} does not match across the group "
            f"(seen by {dev.name} at op #{dev.op_seq}):{calls}\n  differs in: {', '.join(differs)}",
            rank=dev.rank, group=spec.ranks, seq=seq, differs=differs, calls={r: fp[1] for r, fp in verdict},
            flight_records=records,
        )


def _timeout_builder(dev: "VirtualDevice", spec: CollectiveSpec, seq: int, label: str, timeout: float):
    key = f" #{seq} on {spec.group_desc}:"

    def build() -> CollectiveTimeout:
        records = {r: dev._recorders[r].records() for r in spec.ranks}
        reached = [r for r in spec.ranks if any(rec.run == dev._run and key in rec.text for rec in records[r])]
        missing = [r for r in spec.ranks if r not in reached]
        lines = [
            f"{label} did not complete within {timeout:g} s on {dev.name} (op #{dev.op_seq}).",
            f"  reached: {_ranks(reached)}; missing: {_ranks(missing) or 'none (stuck inside the collective)'}",
        ]
        for r in missing or [r for r in spec.ranks if r != dev.rank]:
            lines.append(f"  device {r} {dev.mesh.index(r)} last ops:\n{format_records(records[r], 4)}")
        return CollectiveTimeout(
            "\n".join(lines), rank=dev.rank, index=str(dev.index), op=spec.name, group=spec.ranks, seq=seq,
            op_seq=dev.op_seq, reached=reached, missing=missing, flight_records=records,
        )

    return build


def _ranks(ranks: list[int]) -> str:
    return ", ".join(f"device {r}" for r in ranks)
