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
No modelled time; ``VirtualCluster(check_collectives=False)`` skips it.  Algorithms whose first
dependency on their peers is a fence (``registry.FENCE_FIRST``: the shm barrier and all_reduce)
carry the digests in that fence instead of one of their own, so a barrier is a single fence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..collectives import ALGORITHMS, FENCE_FIRST, default_algorithm
from ..collectives.direct import check_all_reduce_memory as check_direct_memory
from ..collectives.ops import check_op, premultiplies, premultiply
from ..collectives.shm_copy import usable as shm_usable
from ..errors import CollectiveMismatch, CollectiveTimeout, NonFiniteError, PayloadError, UsageError
from ..transport.payload import plain_array
from .config import TAG_FINGERPRINT, TAG_VERDICT
from .fingerprint import _ROOT_ONLY_INPUT, _differences, _digest, _dtype_name, _fingerprint
from .group_comm import GroupComm
from .recorder import format_records

if TYPE_CHECKING:  # pragma: no cover
    from .core import DeviceCore

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


def run_collective(core: "DeviceCore", spec: CollectiveSpec, x: Any, timeout: float) -> Any:
    """Count, record, check and run one collective on this device (``x``: its input, or None
    when its call reads none)."""
    seqs = core.group_seq
    seq = seqs[spec.kind] = seqs.get(spec.kind, 0) + 1  # the kind names this device's group
    trace, wall0 = core.trace, time.monotonic()
    if trace:
        model0 = core.clock.now
    slot = core.begin_op(f"{spec.name} #{seq}{spec.tail}")
    deadline = wall0 + timeout
    on_timeout = partial(_collective_timeout, core, spec, seq, timeout)  # (built only if the call times out)
    config = core.config
    try:
        if x is not None and config.check_nan and x.dtype.kind in "fc":
            _check_finite(core, spec, x, seq)
        check = None
        if config.check_collectives and len(spec.ranks) > 1:
            def check() -> None:
                _exchange_fingerprints(core, spec, seq, deadline, on_timeout)
        comm = GroupComm(core, spec, deadline, on_timeout, check)
        if check is not None and not spec.fence_first:
            comm.fence()  # the contract check, before any message (shm algorithms: at their first fence)
        if spec.premul and x is not None:
            x = premultiply(x, len(spec.ranks))
        result = spec.run(comm) if spec.name == "barrier" else spec.run(comm, x, **spec.run_params)
    except BaseException:
        core.fail(slot)
        raise
    model1 = core.clock.now
    core.recorder.finish(slot, model1)
    if trace:
        core.events.collective(spec.name, wall0, model0, model1, core.op_seq, comm.moved, spec.traced, seq)
    return result


def _check_finite(core: "DeviceCore", spec: CollectiveSpec, x: np.ndarray, seq: int) -> None:
    if not np.isfinite(x).all():
        label = f"{spec.name} #{seq} on {spec.group_desc}"
        nan = int(np.isnan(x).sum())
        inf = int(np.isinf(x).sum())
        raise NonFiniteError(
            f"{core.name}: input to {label} holds {nan} NaN and {inf} Inf values (op #{core.op_seq}); "
            "check_nan is on", rank=core.rank, index=str(core.index), op=spec.name, op_seq=core.op_seq,
        )


def _exchange_fingerprints(core: "DeviceCore", spec: CollectiveSpec, seq: int, deadline: float,
                           on_timeout: Any) -> None:
    """The digests differ: gather every member's full fingerprint at the leader, which sends them
    all back, and raise ``CollectiveMismatch`` (every member of the group takes this path)."""
    ep = core.endpoint
    leader = spec.ranks[0]
    mine = (core.rank, spec.fingerprint)
    if core.rank == leader:
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
        calls = _calls_text(core.mesh, verdict)
        records = {r: core.recorders[r].records() for r in spec.ranks}
        raise CollectiveMismatch(
            f"collective #{seq} on group {spec.group_desc} does not match across the group "
            f"(seen by {core.name} at op #{core.op_seq}):{calls}\n  differs in: {', '.join(differs)}",
            rank=core.rank, index=str(core.index), group=spec.ranks, seq=seq, differs=differs,
            calls={r: fp[1] for r, fp in verdict},
            flight_records=records,
        )


def _collective_timeout(core: "DeviceCore", spec: CollectiveSpec, seq: int,
                        timeout: float) -> CollectiveTimeout:
    """The error of call ``seq`` of ``spec`` that did not complete within ``timeout`` seconds."""
    key = f" #{seq} on {spec.group_desc}:"
    label = f"{spec.name} #{seq} on {spec.group_desc}"
    records = {r: core.recorders[r].records() for r in spec.ranks}
    reached = [r for r in spec.ranks if any(rec.run == core.run and key in rec.text for rec in records[r])]
    missing = [r for r in spec.ranks if r not in reached]
    lines = [
        f"{label} did not complete within {timeout:g} s on {core.name} (op #{core.op_seq}).",
        f"  reached: {_ranks(reached)}; missing: {_ranks(missing) or 'none (stuck inside the collective)'}",
    ]
    for r in missing or [r for r in spec.ranks if r != core.rank]:
        lines.append(f"  device {r} {core.mesh.index(r)} last ops:\n{format_records(records[r], 4)}")
    return CollectiveTimeout(
        "\n".join(lines), rank=core.rank, index=str(core.index), op=spec.name, group=spec.ranks, seq=seq,
        op_seq=core.op_seq, reached=reached, missing=missing, flight_records=records,
    )


def _calls_text(mesh: Any, verdict: list) -> str:
    """One line per device's call; in a group of more than 8, one line per distinct call, its
    devices as rank ranges, the rarest first (at 64 devices the odd one out was line 45 of 64)."""
    if len(verdict) <= 8:
        return "".join(f"\n  device {r} {mesh.index(r)} called {fp[1]}" for r, fp in verdict)
    by_call: dict[str, list[int]] = {}
    for r, fp in verdict:
        by_call.setdefault(fp[1], []).append(r)
    lines = []
    for call, ranks in sorted(by_call.items(), key=lambda kv: (len(kv[1]), kv[1])):
        who = f"device {ranks[0]} {mesh.index(ranks[0])}" if len(ranks) == 1 else \
            f"{len(ranks)} devices ({_spans(ranks)})"
        lines.append(f"\n  {who} called {call}")
    return "".join(lines)


def _spans(ranks: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> '0-3, 5'."""
    out, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(f"device {r}" for r in ranks)
