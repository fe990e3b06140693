"""Shared-memory all_reduce: every member reduces its 1/n slice straight out of its peers' memory.

On one machine the fastest way to combine n arrays is not to pass messages at all.  Each member
copies the slices its peers need (all but its own slice r) into its own *scratch* region of the
shared segment; after a fence member r reduces slice r of every member's array — in fixed rank
order, ``x_0 ⊕ x_1 ⊕ … ⊕ x_{n−1}``, its own term read in place — and publishes it in slice r of
the *first* member's scratch (which held that member's term for slice r, read by member r alone);
after a second fence everybody copies the whole reduced array out of that one region.  One
contiguous copy instead of n slices from n regions: at n = 16 one numpy call instead of 16, and
on a cluster's first call a peer's pages are mapped 16 at a time (the kernel's fault-around)
instead of one fault per member read — 255 fewer faults per device at 256 devices.  Every element
is computed by exactly one member in one fixed order, so every member gets the same bits, from
run to run (the ring's order differs, so the two algorithms may differ in the last bit of a
float sum).

With M the bytes of the array, per member and per call::

    copy in          (n−1)/n·M    (own array but slice r → own scratch)
    reduce           M read, M/n written      (slice r of n arrays → the first member's scratch)
    copy out         M            (the first member's scratch → result)
    fences           3 per chunk: a word store and a read of the group's words each, n−1 wake-ups
                     (the call's last: one wake-up, of the first member, if it waits at all)

about 3M of memory traffic, no per-step handshakes, and no message headers; a ring moves the same
bytes through 2(n−1) messages, each copied in and out of a channel.

The members' terms are read one member at a time (a ufunc call and a copy per member: ~1 µs of
Python each, several times that once the caches are cold between wake-ups), except in groups of
``STRIDED_MIN_MEMBERS`` or more whose scratch regions lie at one stride (evenly spaced ranks:
every group of one mesh axis).  There every member's scratch is one strided (n, k) view
(``SharedComm.scratch_rows``): one ``ufunc.reduce`` over its rows adds slice r of all n members in
rank order.  That path copies our own slice into our scratch too (the reduction reads it in place)
and reduces into the result, then publishes it: M/n more copying.  CPU per member for 512 KiB,
member by member → strided: 8 members 189–239 → 224–273 µs, 32: ~500 both, 64: 594–710 → 527–576,
128: ~990 → ~705 (measured when the reduced slices were still copied out of n regions).  Both
paths in one cluster, swapped in paired blocks (2026-11-26), the strided one took of the time, at
16 members: 0.97, 0.99, 0.96, 0.93 and 0.89 for 512 KiB, 0.84–0.97 for 16 and 64 KiB, 0.99 for
4 MiB (and the reduce_scatter 0.93–0.95, the all_to_all 0.94–0.97, which share the threshold);
at 12 members 1.01 and 1.01; at 8, 1.02–1.04: so it starts at 16.

Small arrays (at most ``fence_payload_bytes``, 8 KiB on most meshes) skip the scratch: each member
carries its whole array into a single fence (``fence_exchange``) and reduces all n of them itself,
in the same rank order — one fence instead of three, so one wake-up per member, at the price of
nM read and (n−1)M "received" per member, which for small M is cheaper than two more wake-ups
(at 64 devices on two cores a wake-up costs ~0.1 ms of CPU per member).  Every member computes
every element in the same order, so all get the same bits, the same as the scratch path's.  One
float64 per member is reduced as Python floats (``ops.reduce_floats``, the same bits), without
numpy's calls, each ~5–12 µs of a woken device's CPU with cold caches.

Arrays larger than the scratch go ``scratch_bytes`` at a time.  The third fence keeps the first
member from overwriting its scratch (in the next chunk or the next collective, possibly in another
group) while a peer still copies the result out of it (after the second fence nobody reads any
other member's) — which is also why the first copy in may come before any fence, and why the
runtime's contract check can ride on the first fence (``registry.FENCE_FIRST``) instead of costing
a fence of its own.  Only the first member needs it, so the call's last one is a
``SharedComm.release(0)``: the others count it and return at once, and the first member waits for
them only before it next writes its scratch (transport/arrivals.py).  Each member but the first
then sleeps twice per call instead of three times: in paired blocks of 512 KiB all_reduces in
one cluster (2026-11-26, benchmarks/README.md) the release took 0.93 of the fence's time at 8
devices, 0.90–0.94 at 16, 0.91 at 32, 0.84–0.88 at 64 (64 KiB at 16: 0.86).

Bytes moved are counted as if each read of a peer's slice were a message from that peer:
member j "sends" each peer r slice r of its input and its own reduced slice j, i.e.
(M − |s_j|) + (n−1)|s_j| = 2(n−1)/n·M bytes when the slices are equal — the ring's figure.  The
modelled clock charges what the ring all_reduce would cost on the modelled topology (real
accelerators do not share memory; the ring is what they would run) — or,
below ``RING_MIN_BYTES``, what the recursive-doubling tree would cost, as that is what runs then.

Source: the "reduce out of shared memory" scheme measured in PERFORMANCE_NOTES.md (7.3 GB/s bus
bandwidth at 2 processes with the arrays already in shared memory, vs ~1 GB/s for MPI).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from virtualpar.collectives.comm import SharedComm
from virtualpar.collectives.ops import REDUCE_OPS, finalize, reduce_floats
from virtualpar.errors import UsageError

__all__ = ["all_reduce", "barrier", "split_bounds", "reduce_rows", "RING_MIN_BYTES"]

RING_MIN_BYTES = 64 << 10  # from here a message all_reduce is bandwidth-bound (ring); below, the tree
STRIDED_MIN_MEMBERS = 16  # from here evenly spaced members' scratch is reduced and copied out as strided rows
_FLOAT64 = np.dtype(np.float64)  # (a singleton: every native float64 array's dtype is this object)


def split_bounds(m: int, n: int) -> list[int]:
    """Boundaries of ``numpy.array_split`` of ``m`` items into ``n`` pieces: piece i is [b[i], b[i+1])."""
    q, rem = divmod(m, n)
    return [i * q + min(i, rem) for i in range(n + 1)]


def all_reduce(comm: SharedComm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """All_reduce through shared scratch memory; see the module docstring for the protocol and cost."""
    n, r = comm.size, comm.rank
    if n == 1:
        return finalize(op, np.array(x, copy=True, order="C"), 1)
    if 0 < x.nbytes <= comm.fence_payload_bytes:
        return _all_reduce_in_fence(comm, x, op)
    itemsize = x.dtype.itemsize
    capacity = comm.scratch_bytes // itemsize  # elements per chunk
    if capacity < 1:
        raise UsageError(
            f"all_reduce algorithm 'shm' needs scratch memory of at least one {x.dtype} element per device, "
            f"but the cluster has scratch_bytes={comm.scratch_bytes}; start it with a larger scratch_bytes "
            "or choose algorithm='ring'"
        )
    ufunc = REDUCE_OPS[op].ufunc
    source = np.ascontiguousarray(x).reshape(-1)
    result = comm.empty(x.shape, x.dtype)
    flat = result.reshape(-1)
    table = comm.scratch_rows() if n >= STRIDED_MIN_MEMBERS else None
    if table is not None:  # every member's scratch as rows of one strided view: one numpy call reads them all
        rows: Any = table[:, : capacity * itemsize].view(x.dtype)
    else:
        rows = [comm.scratch(j)[: capacity * itemsize].view(x.dtype) for j in range(n)]
    mine = rows[r]
    total = source.size
    for start in range(0, max(total, 1), capacity):  # an empty array still takes one (empty) round
        m = min(capacity, total - start)
        chunk = source[start : start + m]
        b = split_bounds(m, n)
        lo, hi = b[r], b[r + 1]
        if table is not None:
            mine[:m] = chunk  # our own slice too: the strided reduction reads it in place
        else:  # the slices the peers reduce; our own is read in place, never copied
            mine[:lo] = chunk[:lo]
            mine[hi:m] = chunk[hi:]
        comm.fence()  # every member's chunk is in its scratch

        if hi > lo and table is not None:  # (fewer items than members leave some slices empty)
            out = flat[start + lo : start + hi]  # (not our scratch's slice r: it is one of the terms)
            reduce_rows(ufunc, rows[:, lo:hi], out)
            finalize(op, out, n)
            rows[0][lo:hi] = out  # published where the first member's term was (only we read it)
        elif hi > lo:  # into the first member's slice r: its term, reduced first, in place (ours if us)
            acc = rows[0][lo:hi]
            reduce_rows(ufunc, [chunk[lo:hi] if j == r else rows[j][lo:hi] for j in range(n)], acc)
            finalize(op, acc, n)
        comm.fence()  # every reduced slice is published

        flat[start : start + m] = rows[0][:m]
        if start + m < total:
            comm.fence()  # nobody reads the first member's scratch any more: the next chunk may fill it
    comm.release(0)  # likewise, but only the first member waits, and only before it next writes its scratch
    sent, messages, ring = _charges(total, n, r, capacity, itemsize)
    comm.account_all(sent, messages=messages)
    if ring is None:  # small: real hardware would run the tree (latency-bound)
        comm.model_tree_all_reduce(total * itemsize)
    else:
        comm.model_ring_all_reduce(ring)
    return result


@functools.lru_cache(maxsize=64)
def _charges(total: int, n: int, r: int, capacity: int,
             itemsize: int) -> tuple[np.ndarray, int, list[int] | None]:
    """What a call of ``total`` items costs member ``r`` besides its copies, worked out once per
    shape (a loop of all_reduces repeats it; at 16 devices it was ~10 numpy calls per call, each a
    few µs with the caches cold): the bytes each member read of ours — per chunk, peer j's slice j
    and our reduced slice — the messages counted, and the ring's chunk sizes to charge the modelled
    clock with (None below ``RING_MIN_BYTES``: the tree's)."""
    sent = np.zeros(n, np.int64)
    for start in range(0, max(total, 1), capacity):
        b = split_bounds(min(capacity, total - start), n)
        sent += np.diff(b)
        sent += b[r + 1] - b[r]
    sent *= itemsize
    sent.flags.writeable = False
    messages = 2 * ((total - 1) // capacity + 1 if total else 1)
    if total * itemsize < RING_MIN_BYTES:
        return sent, messages, None
    ring = split_bounds(total, n)  # the chunks the ring algorithm would send
    return sent, messages, [(ring[i + 1] - ring[i]) * itemsize for i in range(n)]


def _all_reduce_in_fence(comm: SharedComm, x: np.ndarray, op: str) -> np.ndarray:
    """The one-fence all_reduce of an array small enough to ride in a fence (module docstring)."""
    ufunc, n, nbytes = REDUCE_OPS[op].ufunc, comm.size, x.nbytes
    rows = comm.fence_exchange(x)
    if x.size == 1 and x.dtype is _FLOAT64:  # one float64 per member (a loss, a norm, a time): no numpy calls
        value = reduce_floats(op, [v for (v,) in rows.tolist()], n)
        result = np.array([value]) if x.shape == (1,) else np.array(value).reshape(x.shape)
    else:
        result = comm.empty(x.shape, x.dtype)
        acc = result.reshape(-1)
        reduce_rows(ufunc, rows, acc)
        finalize(op, acc, n)
    comm.account_all(nbytes)  # every peer read our whole array
    comm.model_tree_all_reduce(nbytes)
    return result


def barrier(comm: SharedComm) -> None:
    """Barrier as one fence over the arrival counters: a word store and a read of the group's
    words per member, n−1 wake-ups in all (the last member to arrive wakes the rest), no messages;
    the dissemination barrier sends n⌈log2 n⌉ messages and wakes every member ⌈log2 n⌉ times.  The
    runtime's contract check rides on this fence (``registry.FENCE_FIRST``).  Charged to the modelled
    clock as the dissemination barrier, which is what real hardware would run."""
    if comm.size == 1:
        return
    comm.fence()
    comm.model_barrier()


def reduce_rows(ufunc: np.ufunc, rows: Any, out: np.ndarray) -> None:
    """``out = rows[0] ⊕ rows[1] ⊕ … ⊕ rows[n−1]``, strictly in row (rank) order, whatever n: the
    same bits on every path.  ``rows``: an (n, k) array, or a list of n arrays of k items."""
    if type(rows) is list:
        ufunc(rows[0], rows[1], out=out)
        for row in rows[2:]:
            ufunc(out, row, out=out)
    elif out.size > 1:  # over the outer axis numpy reduces row after row: rank order
        ufunc.reduce(rows, axis=0, out=out)
    else:  # one column is an inner axis, which numpy sums pairwise; accumulate is sequential by definition
        # (in the array's own dtype: numpy would accumulate int8 or bool sums in int64, and the
        # total would then not fit back, where every other path wraps around as MPI and torch do)
        out[0] = ufunc.accumulate(rows[:, 0], dtype=None if rows.dtype.kind in "mM" else rows.dtype)[-1]
