"""Shared-memory all_gather and broadcast: every member copies what it needs straight out of its
owner's scratch region, with two fences and no messages.

The all_reduce (``shm.py``) reduces in place; these two only move bytes, so each is a write into
the owner's own scratch, a fence, reads by everybody else, and a fence that keeps the scratch
until the last reader is done (which is also why the first write may come before any fence, and
why the runtime's contract check rides on the first fence, ``registry.FENCE_FIRST``).  A header at
the head of the owner's scratch says what the bytes are (count, shape, and for a broadcast the
dtype, which members other than the root do not know): the readers need no size exchange, and
check shapes, dtypes and that every member is in the same call even with the contract check off.

In groups of ``STRIDED_MIN_MEMBERS`` or more whose members are evenly spaced, every member's
scratch is one strided view (``SharedComm.scratch_rows``): two compares check that every header
is like ours, and one strided copy then gathers all n pieces (a header and a copy per member cost
~3–5 µs of Python each).  512 KiB gathered, CPU per member, member by member → strided: 2 members
120–156 → 127–177 µs, 8: 145–229 → 135–147, 16: 379–423 → 225–329, 64: 560–587 → 318–335
(13.9 instead of 21.6–21.9 ms), 128: 920–954 → 383–471.  Headers that differ take the member by
member path, which names the member.

Both are charged to the modelled clock as the message algorithm real hardware would run (the ring
all_gather, the binomial-tree broadcast) — exactly when the links are idle at entry, which they
always are on a fully connected topology; where routes share links (ring, torus, hierarchical),
traffic of earlier calls that the messages would have queued behind is not seen, as for the shm
all_reduce (sim/schedules.py).
"""

from __future__ import annotations

import numpy as np

from virtualpar.collectives.comm import SharedComm
from virtualpar.errors import UsageError

__all__ = ["all_gather", "broadcast", "usable", "GATHER_HEADER", "COPY_MIN_ROOM"]


GATHER_HEADER = 1024  # head of the owner's scratch: the call's stamp, byte count, shape, dtype (_header)
STRIDED_MIN_MEMBERS = 8  # from here evenly spaced members' headers and pieces are read as strided rows
COPY_MIN_ROOM = 64 << 10  # the default takes these only with this much scratch beyond the header
_DTYPE_AT = GATHER_HEADER - 32  # the header ends with the dtype's ``str`` (a broadcast's non-roots: no array)
_MAX_DIMS = _DTYPE_AT // 8 - 3
_ALL_GATHER, _BROADCAST = 1, 2  # op codes in a call's stamp


def all_gather(comm: SharedComm, x: np.ndarray, dim: int = 0) -> np.ndarray:
    """All_gather through shared scratch memory: pieces may differ in size along ``dim``.

    Member r writes a header (see :func:`_write_header`) and its piece into its own scratch; after
    a fence every member reads the headers and copies every peer's piece straight out of the
    peer's scratch into its result (``numpy.concatenate`` along ``dim``); a second fence keeps each
    scratch until nobody reads it.  With M the gathered bytes, per member::

        copy in    |x_r|          copy out   M − |x_r|          fences   2, n−1 wake-ups each

    where the ring all_gather makes n−1 steps, each a message copied into a channel and out of it.
    A piece larger than the scratch goes ``scratch_bytes − GATHER_HEADER`` bytes at a time, two
    fences per round.  Bytes are counted as if each peer's read of a piece were a message from its
    owner; the modelled clock is charged as the ring all_gather of these pieces would cost (what
    real hardware runs).  The headers let every member check the others' pieces even with the
    contract check off: another dtype, a shape that differs other than along ``dim``, or a member
    in another call is refused, not reinterpreted.
    """
    n, r = comm.size, comm.rank
    x = np.asarray(x, order="C")
    if n == 1:
        return np.concatenate([x], axis=dim)
    cap = _room(comm, x, "all_gather", "ring")
    own = x.reshape(-1).view(np.uint8)
    mine = comm.scratch(r)
    stamp = comm.call_stamp(_ALL_GATHER, -1)
    _write_header(mine, stamp, x)
    first = min(own.size, cap)
    mine[GATHER_HEADER : GATHER_HEADER + first] = own[:first]
    comm.fence()  # every header and first chunk is published (the contract check rides on this fence)

    table = comm.scratch_rows() if n >= STRIDED_MIN_MEMBERS and own.size <= cap else None
    if table is not None and _headers_alike(table, r, x.ndim):  # every piece like ours, whole in its scratch
        result = comm.empty(x.shape[:dim] + (n * x.shape[dim],) + x.shape[dim + 1 :], x.dtype)
        if x.size:  # one strided copy: row j of the table is piece j, the result (pre, n, rest) in blocks
            pre = int(np.prod(x.shape[:dim], dtype=np.int64))
            rows = table[:, GATHER_HEADER : GATHER_HEADER + own.size].view(x.dtype)
            result.reshape(pre, n, -1)[...] = rows.reshape(n, pre, -1).transpose(1, 0, 2)
        comm.account_all(x.nbytes)
        comm.model_ring_all_gather([x.nbytes] * n)
        comm.fence()  # nobody reads our scratch any more: it may be reused
        return result

    scratch = [comm.scratch(j) for j in range(n)]
    shapes, sizes = [], []
    for j in range(n):
        size, shape, dtype = (x.nbytes, x.shape, x.dtype) if j == r else \
            _read_header(scratch[j], stamp, "all_gather", j)
        if dtype != x.dtype or len(shape) != x.ndim or \
                shape[:dim] + shape[dim + 1 :] != x.shape[:dim] + x.shape[dim + 1 :]:
            raise UsageError(f"all_gather: member {j} of the group contributes a piece of shape "
                             f"{shape}, {dtype}; member {r} one of shape {x.shape}, {x.dtype}: pieces may "
                             f"differ only in their length along dim {dim}")
        shapes.append(shape)
        sizes.append(size)
    out_shape = x.shape[:dim] + (sum(s[dim] for s in shapes),) + x.shape[dim + 1 :]
    result = comm.empty(out_shape, x.dtype)
    rounds = max(1, -(-max(sizes) // cap))
    if rounds == 1:  # every piece is whole in its owner's scratch: one copy, straight into the result
        pieces = [x if j == r else
                  scratch[j][GATHER_HEADER : GATHER_HEADER + sizes[j]].view(x.dtype).reshape(shapes[j])
                  for j in range(n)]
        np.concatenate(pieces, axis=dim, out=result)
    else:
        _gather_in_rounds(comm, scratch, x, own, dim, shapes, sizes, cap, rounds, result)
    comm.account_all(x.nbytes)  # every peer read our piece
    comm.model_ring_all_gather(sizes)
    comm.fence()  # nobody reads our scratch any more: it may be reused
    return result


def _gather_in_rounds(comm: SharedComm, scratch: list[np.ndarray], x: np.ndarray, own: np.ndarray, dim: int,
                      shapes: list[tuple[int, ...]], sizes: list[int], cap: int, rounds: int,
                      result: np.ndarray) -> None:
    """A piece larger than the scratch: ``cap`` bytes of every piece per round, each round
    published by a fence and read before the next (the caller's last fence ends the last round)."""
    n, r = comm.size, comm.rank
    if dim == 0:  # pieces are consecutive byte ranges of the result
        flat = result.reshape(-1).view(np.uint8)
        offsets = np.cumsum([0] + sizes).tolist()
        dst = [flat[offsets[j] : offsets[j + 1]] for j in range(n)]
        dst[r][:] = own
    else:  # gathered whole, then concatenated along dim
        staged = [x if j == r else np.empty(shapes[j], x.dtype) for j in range(n)]
        dst = [p.reshape(-1).view(np.uint8) for p in staged]
    for k in range(rounds):
        lo = k * cap
        if k > 0:
            comm.fence()  # everybody read the last round: our scratch may take the next
            chunk = own[lo : lo + cap]
            scratch[r][GATHER_HEADER : GATHER_HEADER + chunk.size] = chunk
            comm.fence()  # this round's chunks are published
        for j in range(n):
            hi = min(sizes[j], lo + cap)
            if j != r and hi > lo:
                dst[j][lo:hi] = scratch[j][GATHER_HEADER : GATHER_HEADER + hi - lo]
    if dim != 0:
        np.concatenate(staged, axis=dim, out=result)


def broadcast(comm: SharedComm, x: np.ndarray | None, root: int = 0) -> np.ndarray:
    """Broadcast through the root's scratch: the root writes a header (see :func:`_write_header`)
    and its array into its own scratch; after a fence every other member copies it out; a second
    fence keeps the scratch until nobody reads it.  Per member: the root copies M in, each other
    member M out; 2 fences, against the binomial tree's ⌈log2 n⌉ rounds of messages, each copied
    into a channel and out of it.  An array larger than the scratch goes in rounds, two fences
    each.  ``x`` is read on the root only (others may pass None): shape and dtype come from the
    root's header.  Bytes are counted as if each member's read were a message from the root (the
    tree's total, (n−1)·M); the modelled clock is charged as the binomial tree would cost.  Every
    other member also stamps its own scratch, for the root to check that all are in its call."""
    n, r = comm.size, comm.rank
    if n == 1:
        return np.array(x, copy=True)
    scratch = comm.scratch(root)
    stamp = comm.call_stamp(_BROADCAST, root)
    if r == root:
        x = np.asarray(x, order="C")
        cap = _room(comm, x, "broadcast", "tree")
        own = x.reshape(-1).view(np.uint8)
        _write_header(scratch, stamp, x)
        scratch[GATHER_HEADER : GATHER_HEADER + min(own.size, cap)] = own[:cap]
    else:
        cap = comm.scratch_bytes - GATHER_HEADER
        comm.scratch(r)[:8].view(np.int64)[0] = stamp  # for the root to check that we are in its call
    comm.fence()  # the root's header and first chunk are published (the contract check rides on this fence)
    if r == root:  # a member that names another root (or is in another call) never reads ours: ask it
        table = comm.scratch_rows() if n >= STRIDED_MIN_MEMBERS else None
        stamps = table[:, :8].view(np.int64)[:, 0] if table is not None else \
            [int(comm.scratch(j)[:8].view(np.int64)[0]) for j in range(n)]
        for j in np.flatnonzero(np.asarray(stamps) != stamp).tolist():
            if j != root:
                raise UsageError(f"broadcast: member {j} of the group is not in this call with root {root}: "
                                 "the members called different collectives, roots or groups, or in different "
                                 "orders, which the contract check (off here) would have named")

    nbytes, shape, dtype = (x.nbytes, x.shape, x.dtype) if r == root else \
        _read_header(scratch, stamp, "broadcast", root)
    result = comm.empty(shape, dtype)
    flat = result.reshape(-1).view(np.uint8)
    if r == root:
        flat[:] = own
    for k in range(max(1, -(-nbytes // cap))):
        lo = k * cap
        if k > 0:
            comm.fence()  # everybody read the last round: the root's scratch may take the next
            if r == root:
                chunk = own[lo : lo + cap]
                scratch[GATHER_HEADER : GATHER_HEADER + chunk.size] = chunk
            comm.fence()  # this round's chunk is published
        if r != root:
            hi = min(nbytes, lo + cap)
            flat[lo:hi] = scratch[GATHER_HEADER : GATHER_HEADER + hi - lo]
    if r == root:
        comm.account_all(nbytes)  # every member read the root's array
    comm.model_tree_broadcast(root, nbytes)
    comm.fence()  # nobody reads the root's scratch any more: it may be reused
    return result


def _room(comm: SharedComm, x: np.ndarray, name: str, other: str) -> int:
    """Bytes of payload the owner's scratch takes per round; a clear error if the header does not fit."""
    cap = comm.scratch_bytes - GATHER_HEADER
    if cap < 1 or x.ndim > _MAX_DIMS or len(x.dtype.str) > GATHER_HEADER - _DTYPE_AT:
        raise UsageError(
            f"{name} algorithm 'shm' needs scratch memory of more than {GATHER_HEADER} bytes per device and "
            f"arrays of at most {_MAX_DIMS} dims, but the cluster has scratch_bytes={comm.scratch_bytes} and "
            f"the array {x.ndim} dims; start it with a larger scratch_bytes or choose algorithm='{other}'")
    return cap


def _write_header(scratch: np.ndarray, stamp: int, x: np.ndarray) -> None:
    """The owner's header, in int64 words: the call's stamp (``SharedComm.call_stamp``: op, root,
    first fence and group, the same on every member of the call), the payload's byte count, ndim
    and shape; then, at the end, its dtype's ``str``."""
    head = scratch[:_DTYPE_AT].view(np.int64)
    head[0], head[1], head[2], head[3 : 3 + x.ndim] = stamp, x.nbytes, x.ndim, x.shape
    kind = x.dtype.str.encode()
    scratch[_DTYPE_AT:GATHER_HEADER] = 0
    scratch[_DTYPE_AT : _DTYPE_AT + len(kind)] = np.frombuffer(kind, np.uint8)


def _read_header(scratch: np.ndarray, stamp: int, name: str, j: int) -> tuple[int, tuple[int, ...], np.dtype]:
    """Member j's header: (byte count, shape, dtype); refused if it is not this call's."""
    head = scratch[:_DTYPE_AT].view(np.int64)
    ndim = int(head[2])
    if int(head[0]) != stamp or not 0 <= ndim <= _MAX_DIMS:
        raise UsageError(f"{name}: member {j} of the group is not in this call (its scratch holds another "
                         "call's data): the members called different collectives, roots or groups, or in "
                         "different orders, which the contract check (off here) would have named")
    kind = scratch[_DTYPE_AT:GATHER_HEADER].tobytes().rstrip(b"\0").decode()
    return int(head[1]), tuple(int(v) for v in head[3 : 3 + ndim]), np.dtype(kind)


def _headers_alike(table: np.ndarray, r: int, ndim: int) -> bool:
    """Do every member's header's stamp, byte count, shape and dtype equal member r's?  Two
    compares over the strided rows of the members' scratch (the words between the shape and the
    dtype are never written, so they are left out)."""
    used = 8 * (3 + ndim)
    return bool((table[:, :used] == table[r, :used]).all()) and \
        bool((table[:, _DTYPE_AT:GATHER_HEADER] == table[r, _DTYPE_AT:GATHER_HEADER]).all())


def usable(collective: str, scratch_bytes: int, itemsize: int, members: int) -> bool:
    """Does the default take ``collective``'s shared-memory algorithm with this much scratch per
    device, items of ``itemsize`` bytes and a group of ``members``?  Only with ``COPY_MIN_ROOM``
    of it (beyond the header, for the all_gather and the broadcast): with a few bytes, rounds of
    two or three fences each took seconds where the messages took a millisecond (a 64 KiB
    all_to_all on 4 devices with 64 bytes of scratch: 128 against 1.9 ms).  And with what the
    algorithm needs: one item for the all_reduce, one per member for the reduce_scatter and the
    all_to_all (``shm_pieces.py``; 8 members exchanging items of 9000 bytes, say, need 72 KB)."""
    if collective in ("all_gather", "broadcast"):
        return scratch_bytes >= GATHER_HEADER + COPY_MIN_ROOM
    need = itemsize * (members if collective in ("reduce_scatter", "all_to_all") else 1)
    return scratch_bytes >= max(need, COPY_MIN_ROOM)
