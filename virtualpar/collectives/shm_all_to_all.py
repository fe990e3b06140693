"""Shared-memory all_to_all: every member copies its piece of every peer's array straight out of
the peer's scratch.

Member j's array is split as ``numpy.array_split(x_j, n, axis=split_dim)``; piece r goes to member
r, which concatenates the pieces it receives along ``concat_dim`` in rank order (``direct.py``'s
contract).  Here each member copies into its own scratch the pieces its peers need (all but its
own); after a fence member r copies piece r out of every member's scratch; a second fence keeps
each scratch until the last reader is done.  With M the bytes of the array, per member::

    copy in     (n−1)/n·M        copy out   (n−1)/n·M       fences   2, n−1 wake-ups each

where the pairwise exchange makes n−1 steps, each a message copied into a channel and out of it
and a wake-up per member: at 128 devices and 64 KiB the exchange took 0.7–1.1 s.

Along ``split_dim`` ≠ 0 the pieces are not contiguous: the array is laid out with ``split_dim``
first (one copy), so that piece c is one block of the flattened array.  Arrays larger than the
scratch go in rounds of scratch/n items of every piece, two fences each (``shm_pieces.py``);
those of at most ``fence_payload_bytes`` ride in one fence (``SharedComm.fence_exchange``), each
member taking its piece of the n rows.  Groups of ``shm.STRIDED_MIN_MEMBERS`` or more evenly
spaced members read every member's scratch as one strided view: one numpy copy takes piece r of
all n members.  Every member's array must have the
same shape and dtype (the contract check, on by default, names a member whose call differs).

Bytes are counted as if each read were a message: member j "sends" each peer r piece r of its
array — the pairwise exchange's figures.  The modelled clock is charged as that exchange (n−1
``sendrecv`` steps, ``sim.exchange``): what runs where no memory is shared.
"""

from __future__ import annotations

import numpy as np

from virtualpar.collectives import shm
from virtualpar.collectives.comm import SharedComm
from virtualpar.collectives.shm_pieces import piece_rounds, round_count

__all__ = ["all_to_all"]


def all_to_all(comm: SharedComm, x: np.ndarray, split_dim: int = 0, concat_dim: int = 0) -> np.ndarray:
    """All_to_all through shared scratch memory; see the module docstring for the protocol and cost."""
    n, r = comm.size, comm.rank
    x = np.asarray(x)
    if n == 1:
        return np.concatenate([x], axis=concat_dim)
    front = np.moveaxis(x, split_dim, 0)  # piece c: items [e[c], e[c+1]) of the flattened array
    source = np.ascontiguousarray(front).reshape(-1)
    inner = int(np.prod(front.shape[1:], dtype=np.int64))
    b = shm.split_bounds(front.shape[0], n)
    e = [k * inner for k in b]
    got = comm.empty((n, e[r + 1] - e[r]), x.dtype)  # row j: piece r of member j, flattened
    if 0 < source.nbytes <= comm.fence_payload_bytes:  # one fence carries every member's array
        got[...], rounds = comm.fence_exchange(source)[:, e[r] : e[r + 1]], 1
    else:
        rounds = round_count(comm, e, source.dtype.itemsize)
        for lo, hi, terms in piece_rounds(comm, source, e, "all_to_all", "direct"):
            if type(terms) is list:
                for j, term in enumerate(terms):
                    got[j, lo:hi] = term
            else:
                got[:, lo:hi] = terms
    blocks = got.reshape((n, b[r + 1] - b[r]) + front.shape[1:])  # block j, split_dim first
    if split_dim == concat_dim == 0:  # the blocks one after the other are the result
        result = blocks.reshape((n * (b[r + 1] - b[r]),) + front.shape[1:])
    else:
        pieces = [np.moveaxis(block, 0, split_dim) for block in blocks]
        shape = list(pieces[0].shape)
        shape[concat_dim] *= n
        result = np.concatenate(pieces, axis=concat_dim, out=comm.empty(tuple(shape), x.dtype))
    itemsize = x.dtype.itemsize
    piece_nbytes = [int(k) * itemsize for k in np.diff(e)]
    comm.account_all(np.asarray(piece_nbytes, np.int64), messages=rounds)  # peer j read piece j of ours
    comm.model_pairwise_all_to_all(piece_nbytes)
    return result
