"""The facade's collectives on buffers (``Bcast``, ``Reduce``, ``Gather``, ...): mpi4py's
upper-case calls, built on the communicator's pickle-based lower-case ones (virtualpar/mpi/facade.py).

``MPI.IN_PLACE`` works where MPI defines it: as the send buffer of ``Reduce`` and ``Allreduce``
(the input is the receive buffer), ``Gather(v)`` at the root and ``Allgather(v)`` (a rank's own
piece is already in the receive buffer, at its displacement), ``Alltoall(v)``,
``Reduce_scatter_block``, ``Scan`` and ``Exscan`` (the input is the receive buffer), and as the
root's receive buffer of ``Scatter(v)`` (it keeps its piece in the send buffer).  In a
``[buf, count, type]`` spec of a collective's gathered, scattered or exchanged buffer the count is
per rank, as MPI reads it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .facade_types import IN_PLACE, SUM, Op, _blocks, _buf, _layout, _place, _region

__all__ = ["BufferCollectives"]


class BufferCollectives:
    """Mixed into ``facade.Comm``, whose ``rank``, ``size`` and lower-case collectives these use."""

    rank: int
    size: int

    def Bcast(self, buf: Any, root: int = 0) -> None:
        arr = _buf(buf)
        np.copyto(arr, self.bcast(np.array(arr) if self.rank == root else None, root))

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM, root: int = 0) -> None:
        src = _buf(recvbuf) if sendbuf is IN_PLACE else _buf(sendbuf)
        out = self.reduce(np.array(src), op, root)
        if out is not None:
            np.copyto(_buf(recvbuf), out)

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:
        src = _buf(recvbuf) if sendbuf is IN_PLACE else _buf(sendbuf)
        np.copyto(_buf(recvbuf), self.allreduce(np.array(src), op))

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """``sendbuf=IN_PLACE`` at the root: its piece is already in ``recvbuf``, at its displacement."""
        mine = self._in_place(recvbuf, "Gather", root) if sendbuf is IN_PLACE else _buf(sendbuf)
        parts = self.gather(np.array(mine).reshape(-1, order="A"), root)
        if parts is not None:
            _place(parts, recvbuf, self.size)

    Gatherv = Gather

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        """``sendbuf=IN_PLACE``: every rank's piece is already in ``recvbuf``, at its displacement."""
        mine = self._in_place(recvbuf, "Allgather") if sendbuf is IN_PLACE else _buf(sendbuf)
        _place(self.allgather(np.array(mine).reshape(-1, order="A")), recvbuf, self.size)

    Allgatherv = Allgather

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        """``recvbuf=IN_PLACE`` at the root: it keeps its piece where it is in ``sendbuf``."""
        pieces = None
        if self.rank == root:
            flat = np.array(_region(sendbuf, self.size))
            counts, displs = _layout(sendbuf, self.size, flat.size)
            pieces = [flat[d:d + c] for c, d in zip(counts, displs)]
        elif recvbuf is IN_PLACE:
            self._in_place(None, "Scatter", root)
        piece = self.scatter(pieces, root)
        if recvbuf is not IN_PLACE:
            np.copyto(_buf(recvbuf).reshape(-1, order="A"), piece)

    Scatterv = Scatter

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        """``sendbuf=IN_PLACE``: the pieces to send are in ``recvbuf``, which the received ones replace."""
        source = _region(recvbuf if sendbuf is IN_PLACE else sendbuf, self.size)
        _blocks(source.size, self.size)
        pieces = np.split(np.array(source), self.size)
        np.copyto(_region(recvbuf, self.size), np.concatenate(self.alltoall(pieces)))

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        """Piece j of ``sendbuf`` (its counts and displacements) goes to rank j, and rank j's piece
        for this rank lands in ``recvbuf`` at displacement j; a piece longer than its receive count
        is an error (MPI_ERR_TRUNCATE), not an overwrite of the next.  ``sendbuf=IN_PLACE``: the
        pieces to send are in ``recvbuf``, at its counts and displacements."""
        spec = recvbuf if sendbuf is IN_PLACE else sendbuf
        flat = np.array(_region(spec, self.size))  # (a copy: the received pieces may overwrite it)
        counts, displs = _layout(spec, self.size, flat.size)
        got = self.alltoall([flat[d:d + c] for c, d in zip(counts, displs)])
        out = _region(recvbuf, self.size)
        room, where = _layout(recvbuf, self.size, out.size)
        for j, (piece, c, d) in enumerate(zip(got, room, where)):
            if piece.size > c:
                raise ValueError(f"Alltoallv: rank {j} sent {piece.size} elements for a receive count of {c} "
                                 "(MPI_ERR_TRUNCATE)")
            out[d:d + piece.size] = piece

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:
        """``sendbuf=IN_PLACE``: the input is ``recvbuf`` (every rank's block), and this rank's
        reduced block goes to its start."""
        flat = _region(recvbuf, self.size) if sendbuf is IN_PLACE else _buf(recvbuf).reshape(-1, order="A")
        source = flat if sendbuf is IN_PLACE else _region(sendbuf, self.size)
        _blocks(source.size, self.size)
        total = self.allreduce(np.array(source), op)
        mine = np.array_split(total, self.size)[self.rank]
        flat[:mine.size] = mine

    def Scan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:
        """``sendbuf=IN_PLACE``: the input is ``recvbuf``."""
        src = _buf(recvbuf) if sendbuf is IN_PLACE else _buf(sendbuf)
        np.copyto(_buf(recvbuf), self.scan(np.array(src), op))

    def Exscan(self, sendbuf: Any, recvbuf: Any, op: Op = SUM) -> None:
        """``sendbuf=IN_PLACE``: the input is ``recvbuf``; rank 0's ``recvbuf`` is left as it is."""
        src = _buf(recvbuf) if sendbuf is IN_PLACE else _buf(sendbuf)
        out = self.exscan(np.array(src), op)
        if out is not None:
            np.copyto(_buf(recvbuf), out)

    def _in_place(self, recvbuf: Any, call: str, root: int | None = None) -> np.ndarray:
        """This rank's own piece of ``recvbuf`` for an ``IN_PLACE`` send (its displacement and
        count in a v-spec, else an equal share); only the root may pass ``IN_PLACE`` to a rooted call."""
        if root is not None and self.rank != root:
            raise ValueError(f"{call}: MPI.IN_PLACE is the root's (rank {root}) alone; "
                             f"rank {self.rank} passes "
                             "its own buffer")
        flat = _region(recvbuf, self.size)
        counts, displs = _layout(recvbuf, self.size, flat.size)
        return flat[displs[self.rank]:displs[self.rank] + counts[self.rank]]
