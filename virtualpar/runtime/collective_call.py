"""One collective call on one device: count and record it, check the contract, run the algorithm
(the call was validated before, in :mod:`.collective_spec`).

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
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from ..collectives.ops import premultiply
from ..errors import CollectiveMismatch, CollectiveTimeout, NonFiniteError
from .collective_spec import CollectiveSpec, GroupInfo
from .config import TAG_FINGERPRINT, TAG_VERDICT
from .fingerprint import _differences
from .group_comm import GroupComm
from .recorder import format_records

if TYPE_CHECKING:  # pragma: no cover
    from .core import DeviceCore

__all__ = ["CollectiveSpec", "GroupInfo", "run_collective"]  # (the spec's names, for their old importers)


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
