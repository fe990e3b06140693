"""Chrome trace JSON (the "Trace Event Format") that Perfetto and chrome://tracing load.

Layout::

    process  pid = rank        named "device 3 (dp=1, tp=1)", sorted by rank
      thread tid 0 "compute"   compute (and any compute overlapping it, on tid 2, 4, ...)
      thread tid 1 "comm"      collectives with their send/recv nested inside; wait
      thread tid 3, 5, ...     "comm 2", "comm 3": comm events that overlap without nesting

Slices are complete events (``ph: "X"``, ``ts``/``dur`` in microseconds, ``cat`` "compute",
"p2p" for send and recv, "collective" or "wait"; ``args.kind`` has the exact kind).  The viewers require the
slices of one thread to nest properly; a ring step's send and recv overlap without nesting, so
such an event moves to the next lane of its track whose open slices it nests in (greedy interval
colouring).  A send and the recv that share a ``flow`` id are joined by an arrow: a flow start
``ph: "s"`` at the send's start and a flow end ``ph: "f", bp: "e"`` inside the recv (at the later of
the recv's start and the send's start, so the arrow does not point back in time when the recv
was posted early).  Both carry ``cat: "p2p"``, the flow id as ``name`` and a small integer ``id``.
A send or recv without its partner gets no arrow.  Within a timestamp, slices come before flow
events in the file, so that importers processing events in order (Perfetto) bind a flow start to
the send slice that begins at the same instant.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from virtualpar.trace.event import Event, check_clock, jsonable

if TYPE_CHECKING:  # the views take a Trace; events.Trace's methods call the views
    from virtualpar.trace.events import Trace

__all__ = ["to_chrome", "write_chrome", "COMPUTE_TID", "COMM_TID"]

COMPUTE_TID = 0
COMM_TID = 1
_US = 1e6  # seconds -> microseconds
_FLOW_CAT = "p2p"
# The slice category: send and recv share the flow's so that viewers binding a flow event to the
# slice with equal (pid, tid, ts, cat) -- Chrome DevTools does -- find them.
_CAT = {"compute": "compute", "send": _FLOW_CAT, "recv": _FLOW_CAT, "collective": "collective",
        "wait": "wait"}
_TRACK = {"compute": COMPUTE_TID, "send": COMM_TID, "recv": COMM_TID, "collective": COMM_TID,
          "wait": COMM_TID}


def _lanes(events: list[Event], clock: str) -> list[int]:
    """Lane index per event (events sorted by start, outer first) so each lane nests properly."""
    stacks: list[list[float]] = []  # per lane: the end times of its open slices, innermost last
    out: list[int] = []
    for e in events:
        start, end = e.start(clock), e.end(clock)
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()  # that slice ended before this one began
            if not stack or end <= stack[-1]:
                stack.append(end)
                out.append(lane)
                break
        else:
            stacks.append([end])
            out.append(len(stacks) - 1)
    return out


def _slice_args(e: Event, clock: str) -> dict[str, Any]:
    args: dict[str, Any] = {"op": e.name, "kind": e.kind}
    if e.nbytes:
        args["bytes"] = int(e.nbytes)
    for key in ("peer", "seq", "group", "shape", "dtype", "flow"):
        value = getattr(e, key)
        if value is not None:
            args[key] = jsonable(value)
    other = "wall" if clock == "model" else "model"
    args[f"{other}_dur_us"] = float(e.duration(other)) * _US
    for key, value in e.args:
        args.setdefault(str(key), jsonable(value))
    return args


def to_chrome(trace: Trace, clock: str = "model") -> dict[str, Any]:
    """The Chrome trace JSON object of ``trace`` on ``clock`` ("model" or "wall").

    Returns ``{"traceEvents": [...], "displayTimeUnit": "ns" | "ms", "otherData": {...}}``; all
    values are plain Python types, and the order is deterministic (metadata, then slices by
    ``(pid, ts, -dur, tid)``, then flow events by id).  ``displayTimeUnit`` is ``"ns"`` when the
    span is under a millisecond (modelled runs often are), else ``"ms"``.
    """
    check_clock(clock, "to_chrome")
    meta: list[dict[str, Any]] = []
    slices: list[dict[str, Any]] = []
    where: dict[int, tuple[int, float, float]] = {}  # id(event) -> (tid, ts, end ts)
    for rank, events in trace.by_rank().items():
        pid = int(rank)
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                     "args": {"name": trace.device_name(rank)}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                     "args": {"sort_index": pid}})
        tids: set[int] = {COMPUTE_TID, COMM_TID}
        for base in (COMPUTE_TID, COMM_TID):
            # stable sort: equal intervals keep the trace's outer-before-nested order
            track = sorted((e for e in events if _TRACK[e.kind] == base),
                           key=lambda e: (e.start(clock), -e.end(clock)))
            for e, lane in zip(track, _lanes(track, clock)):
                tid = base + 2 * lane
                tids.add(tid)
                ts, end = float(e.start(clock)) * _US, float(e.end(clock)) * _US
                where[id(e)] = (tid, ts, end)
                slices.append({"ph": "X", "name": e.name, "cat": _CAT[e.kind], "pid": pid, "tid": tid,
                               "ts": ts, "dur": max(0.0, end - ts), "args": _slice_args(e, clock)})
        for tid in sorted(tids):
            kind = "compute" if tid % 2 == COMPUTE_TID else "comm"
            label = kind if tid < 2 else f"{kind} {tid // 2 + 1}"
            meta.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}})
            # every compute lane above every comm lane, each in lane order
            meta.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                         "args": {"sort_index": (tid % 2) * 1000 + tid // 2}})
    slices.sort(key=lambda s: (s["pid"], s["ts"], -s["dur"], s["tid"], s["name"]))

    flows: list[dict[str, Any]] = []
    sends = {e.flow: e for e in trace.events if e.kind == "send" and e.flow is not None}
    recvs = {e.flow: e for e in trace.events if e.kind == "recv" and e.flow is not None}
    for n, flow in enumerate(sorted(set(sends) & set(recvs)), start=1):
        s, r = sends[flow], recvs[flow]
        s_tid, s_ts, _ = where[id(s)]
        r_tid, r_ts, r_end = where[id(r)]
        f_ts = min(max(r_ts, s_ts), r_end)  # inside the recv slice, not before the send if possible
        common = {"name": flow, "cat": _FLOW_CAT, "id": n}
        flows.append({"ph": "s", **common, "pid": int(s.rank), "tid": s_tid, "ts": s_ts})
        flows.append({"ph": "f", "bp": "e", **common, "pid": int(r.rank), "tid": r_tid, "ts": f_ts})

    lo, hi = trace.bounds(clock)
    return {
        "traceEvents": meta + slices + flows,
        "displayTimeUnit": "ns" if hi - lo < 1e-3 else "ms",
        "otherData": {
            "generator": "virtualpar",
            "clock": clock,
            "clock_meaning": "modelled time on the virtual hardware" if clock == "model"
            else "wall time on this machine since the cluster started",
            "devices": len(trace.ranks),
            "events": len(trace),
            "span_us": (hi - lo) * _US,
        },
    }


def write_chrome(trace: Trace, path: str | os.PathLike[str], clock: str = "model") -> str:
    """Write :func:`to_chrome` of ``trace`` to ``path``; returns the path as a string."""
    doc = to_chrome(trace, clock=clock)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return os.fspath(path)
