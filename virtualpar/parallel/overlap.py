"""DDP's bucket overlap on the modelled clock: each bucket's all-reduce runs beside the rest of the backward.

Real DDP (Li et al. 2020) all-reduces a bucket on a communication stream as soon as the autograd
hooks of its parameters have fired, while the compute stream goes on with the backward of the
earlier layers.  Here the one pipeline executor calls :func:`on_grads` after every backward that
accumulates a stage's gradients (its ``StepSpec.on_grads`` hook), with the modelled ``start`` and
``end`` of that backward's compute; after the step's *last* microbatch of stage s (zero=0,
dp·cp > 1) the stage's gradients are final, and this hook all-reduces them bucket by bucket on the
device's communication stream (``dev.comm_stream``, :mod:`virtualpar.sim.clock`).

Two streams.  The compute stream is not held back: the backward ends at ``end`` and whatever the
rank does next — send the input gradient to the previous stage, the next microbatch, another
stage's backward — starts there.  Unit u's gradient is final at

    r(u) = end − (end − start) · (backward FLOPs of the units still to run after u) / (all of them)

in the backward's order (head first, embeddings last; :func:`.zero.buckets` groups them), and the
communication stream runs the buckets in order, each when it is ready and the stream is free::

    c_k = max(r_k, c_{k−1}) + T_k            (r_k: its last unit's ready time; c_0: the stream's end
                                              before, e.g. another stage's buckets on this rank)

T_k is whatever the collective costs on the modelled links (2(n−1)·(α + B_k/(n·β)) for a ring of n
over uniform links).  The step's gradient reduction then waits for the stream
(``dev.wait_comm_stream``) before the optimizer: DDP's synchronisation before ``optimizer.step``.
Every member of the dp×cp group runs the same schedule, so the blocking collectives meet.

What this leaves out: the two streams do not contend for links (the clock keeps their busy-until
times apart), and SP's replicated gradients' tp all-reduce of a unit runs on the same stream just
before its bucket.
"""

from __future__ import annotations

from typing import Any

from .zero import all_reduce_bucket, buckets, sp_reduce

__all__ = ["on_grads", "reduce_overlapped"]


def reduce_overlapped(dev: Any, meta: dict, units: list, grads: dict, flops: dict[str, float],
                      start: float, end: float) -> None:
    """All-reduce a stage's final gradients (in place in ``grads``) bucket by bucket on the
    communication stream, bucket k from when its units' gradients are final in a backward computed
    from ``start`` to ``end`` whose FLOPs per unit are ``flops`` (by name; see the module doc)."""
    itemsize = next(iter(grads.values())).itemsize
    total = rest = sum(flops.get(u.name, 0.0) for u in units)
    for bucket in buckets(units, itemsize, meta["bucket_bytes"]):
        rest -= sum(flops.get(u.name, 0.0) for u in bucket)
        ready = end - (end - start) * rest / total if total > 0 else end
        with dev.comm_stream(since=ready):
            for u in bucket:
                grads[u.name] = sp_reduce(dev, meta, u, grads[u.name])
            all_reduce_bucket(dev, grads, bucket)


def on_grads(step: Any, kind: str, s: int, m: int, start: float, end: float) -> None:
    """The executor's hook (see the module doc): after the last microbatch's B (or W) of stage s,
    computed from ``start`` to ``end`` on the modelled clock, reduce its buckets beside the rest of
    the step."""
    st = step.st
    meta = st["meta"]
    if meta["zero"] != 0 or meta["dp"] * meta["cp"] == 1 or kind not in ("B", "W"):
        return
    seen = st.setdefault("seen", {})
    seen[s] = seen.get(s, 0) + 1
    if seen[s] < step.spec.microbatches:
        return
    per_row = st["flops"].get("units", {})
    units = st["units"][s]
    reduce_overlapped(step.dev, meta, units, step.grads[s], {u.name: per_row.get(u.name, 0.0) for u in units},
                      start, end)
    st.setdefault("summed", set()).add(s)
