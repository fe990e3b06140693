"""DDP's bucket overlap on the modelled clock: each bucket's all-reduce runs beside the rest of the backward.

Real DDP (Li et al. 2020) all-reduces a bucket on a communication stream as soon as the autograd
hooks of its parameters have fired, while the compute stream goes on with the backward of the
earlier layers.  Here the one pipeline executor calls :func:`on_grads` after every backward that
accumulates a stage's gradients (its ``StepSpec.on_grads`` hook); after the step's *last*
microbatch of stage s (zero=0, dp·cp > 1) the stage's gradients are final, and this hook charges
that backward's compute itself, interleaved with the buckets' all-reduces in time order.

Two streams, one device clock.  The backward's compute does not wait for communication, so its
stream is fixed: it starts at t₀ (the clock when the hook runs) and unit u's gradient is final at
``r(u) = t₀ + (backward FLOPs of the units after u and of u) / peak``, in the backward's order
(head first, embeddings last; :func:`.zero.buckets` groups them).  Communication is serial on its
stream, a bucket k starting when it is ready and the previous one is done::

    c_k = max(r_k, c_{k−1}) + T_k                      (r_k: its last unit's ready time)
    end = max(t₀ + F_backward / peak, c_last)

The hook realises exactly this with the device protocol's blocking collectives, sweeping in time
order: before bucket k it charges the compute the clock has not yet covered up to r_k (none if the
previous all-reduce already ran past it), then runs the all-reduce (the clock moves to c_k; every
member of the dp×cp group reaches it at the same point of the same schedule), and at the end the
compute still uncovered.  Time hidden under communication is not charged twice: that is the
overlap.  T_k is whatever the collective costs on the modelled links (2(n−1)·(α + B_k/(n·β)) for a
ring of n over uniform links); the seconds per FLOP are learnt from the first charge (the head's or
the last block's backward, never empty).

What this leaves out: the SP gradients' tp all-reduce of a bucket (if any) runs on the same stream
just before it, and the all-reduces of earlier stages of an interleaved rank are not overlapped
with later stages' compute (each stage overlaps its own last backward only).
"""

from __future__ import annotations

from typing import Any

from .zero import all_reduce_bucket, buckets, sp_reduce

__all__ = ["on_grads", "reduce_overlapped"]


def reduce_overlapped(dev: Any, meta: dict, units: list, grads: dict, flops: dict[str, float],
                      name: str = "B") -> None:
    """All-reduce a stage's final gradients (in place in ``grads``) bucket by bucket, charging the
    backward's ``flops`` per unit (by name) so that each bucket overlaps the compute after it."""
    t0 = dev.clock
    rate: list[float] = []  # seconds per FLOP, from the first charge

    def catch_up(target: float) -> None:
        """Charge what the compute stream has done by ``target`` FLOPs and the clock has not covered."""
        if not rate:
            if target > 0:
                rate.append(dev.compute(flops=target, name=name) / target)
            return
        if rate[0] == 0.0:
            return
        behind = target - (dev.clock - t0) / rate[0]
        if behind > 0:
            dev.compute(flops=behind, name=name)

    itemsize = next(iter(grads.values())).itemsize
    done = 0.0
    for bucket in buckets(units, itemsize, meta["bucket_bytes"]):
        done += sum(flops.get(u.name, 0.0) for u in bucket)
        catch_up(done)
        for u in bucket:
            grads[u.name] = sp_reduce(dev, meta, u, grads[u.name])
        all_reduce_bucket(dev, grads, bucket)
    catch_up(done)


def on_grads(step: Any, kind: str, s: int, m: int) -> bool:
    """The executor's hook (see the module doc): after the last microbatch's B (or W) of stage s,
    reduce its buckets overlapped with that backward's compute; returns whether it charged it."""
    st = step.st
    meta = st["meta"]
    if meta["zero"] != 0 or meta["dp"] * meta["cp"] == 1 or kind not in ("B", "W"):
        return False
    seen = st.setdefault("seen", {})
    seen[s] = seen.get(s, 0) + 1
    if seen[s] < step.spec.microbatches:
        return False
    per_row = st["flops"].get("units", {})
    factor = 2.0 if kind == "B" else 1.0  # the executor's charges: B = 2 forwards, W = 1
    units = st["units"][s]
    flops = {u.name: factor * per_row.get(u.name, 0.0) * step.rows for u in units}
    reduce_overlapped(step.dev, meta, units, step.grads[s], flops, kind)
    st.setdefault("summed", set()).add(s)
    return True
