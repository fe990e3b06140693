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

A stage whose input gradient leaves the rank (a B of stage s > 0 whose previous stage lives on
another rank: the lowering puts its send, ``SB``, right after it) is the exception.  One clock
cannot hold back a blocking collective for a send that is due in the middle of it, so reduced at
once its buckets would delay that send to c_last and the previous stage would idle (a gpipe
dp2×pp2 step took 12.75 µs against 8.5 µs with the reduction after the pipeline).  Real DDP sends
at once (its all-reduces run on another stream).  So the executor charges such a B's compute as
usual, sends the input gradient at the compute's end, and calls this hook (``charged=True``)
after the rank's last action: the stage's buckets then run back to back from there::

    send departs at t₀ + F_backward / peak;     end = (the rank's last action's end) + Σ_k T_k

The alternative, a second communication stream on the device clock, would also hide those
stages' buckets behind their backward, but it needs the runtime's clock and the device protocol to
carry a stream (every backend); this keeps the change in the executor.  Never slower than the
reduction after the pipeline: the sends depart as they would without overlap, the buckets of the
stages that send start no earlier, and those that overlap end no later (in gpipe and 1f1b, only
stage 0 overlaps; in zero-bubble schedules the last W has no send and every stage overlaps).

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


def on_grads(step: Any, kind: str, s: int, m: int, charged: bool = False) -> bool:
    """The executor's hook (see the module doc): after the last microbatch's B (or W) of stage s,
    reduce its buckets overlapped with that backward's compute; returns whether it charged it.
    ``charged``: the executor already charged the compute (a B whose input gradient left the rank,
    hooked after the rank's last action): the buckets then run back to back."""
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
    flops = {u.name: 0.0 if charged else factor * per_row.get(u.name, 0.0) * step.rows for u in units}
    reduce_overlapped(step.dev, meta, units, step.grads[s], flops, kind)
    st.setdefault("summed", set()).add(s)
    return True
