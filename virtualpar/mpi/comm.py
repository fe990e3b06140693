"""``MPIComm``: the collectives' tiny ``Comm`` protocol over an MPI communicator, so that
``dev.all_reduce(x, algorithm="ring")`` under ``mpiexec`` runs virtualpar's own ring over MPI
point-to-point messages, exactly as the emulator runs it over its channels.

Each message is a small pickled header (shape, dtype, departure stamp on the modelled clock) and
the array itself by ``Isend``/``Recv`` on a communicator of its own (a ``Dup`` of the group's), so
an algorithm's messages never meet the user's.  The protocol promises buffered sends: here a send
posts ``Isend`` on a private copy and returns; MPI completes it when the peer receives, and
:meth:`MPIComm.flush` waits for every send of the call before the collective returns.  The
modelled clock is charged as on the emulator: the sender ``α + M/β`` when it waits on its send
(at once for a blocking ``send``), the receiver at the arrival computed from the stamp.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..transport.payload import byte_view

__all__ = ["MPIComm"]

_TAG = 7  # every algorithm message; FIFO per pair on the private communicator keeps them in order


class _SendDone:
    """The modelled completion of one send (the MPI-level completion waits for ``flush``)."""

    def __init__(self, clock: Any, dst: int, nbytes: int, stamp: float) -> None:
        self._clock, self._dst, self._nbytes, self._stamp, self._done = clock, dst, nbytes, stamp, False

    def wait(self) -> None:
        if not self._done:
            self._clock.on_send_done(self._dst, self._nbytes, self._stamp)
            self._done = True


class _Deferred:
    """A receive performed on ``wait()``: every send is already posted, so deferring cannot deadlock."""

    def __init__(self, comm: "MPIComm", peer: int, out: np.ndarray | None) -> None:
        self._comm, self._peer, self._out = comm, peer, out

    def wait(self) -> np.ndarray:
        return self._comm.recv(self._peer, self._out)


class MPIComm:
    """Group positions ``0..size-1`` of ``ranks`` (world ranks) over the MPI communicator ``sub``;
    ``clock`` is the device's modelled clock, ``count(dst, nbytes)`` its traffic counter."""

    def __init__(self, clock: Any, count: Callable[[int, int], None], sub: Any,
                 ranks: tuple[int, ...]) -> None:
        self._clock, self._count, self._sub, self._ranks = clock, count, sub, ranks
        self.rank, self.size = sub.Get_rank(), sub.Get_size()
        self._in_flight: list[Any] = []  # MPI requests and the buffers they read

    def isend(self, x: np.ndarray, peer: int) -> _SendDone:
        x = np.array(x, copy=True, order="C")  # buffered: the caller may reuse its array at once
        dst = self._ranks[peer]
        stamp = self._clock.on_send(dst, x.nbytes)
        self._in_flight.append(self._sub.isend((x.shape, x.dtype.str, stamp), dest=peer, tag=_TAG))
        # bytes: MPI has no type for 'U', 'M'
        self._in_flight.append((self._sub.Isend(byte_view(x), dest=peer, tag=_TAG), x))
        self._count(dst, x.nbytes)
        return _SendDone(self._clock, dst, x.nbytes, stamp)

    def send(self, x: np.ndarray, peer: int) -> None:
        self.isend(x, peer).wait()

    def recv(self, peer: int, out: np.ndarray | None = None) -> np.ndarray:
        shape, dtype, stamp = self._sub.recv(source=peer, tag=_TAG)
        fits = (
            out is not None
            and out.shape == tuple(shape)
            and out.dtype == np.dtype(dtype)
            and out.flags.c_contiguous
        )
        buf = out if fits else np.empty(shape, np.dtype(dtype))
        self._sub.Recv(byte_view(buf), source=peer, tag=_TAG)
        self._clock.on_recv(self._ranks[peer], buf.nbytes, stamp)
        return buf

    def irecv(self, peer: int, out: np.ndarray | None = None) -> _Deferred:
        return _Deferred(self, peer, out)

    def flush(self) -> None:
        """Wait until MPI has delivered every send of this call (the peers have received them)."""
        for item in self._in_flight:
            (item[0] if isinstance(item, tuple) else item).Wait()
        self._in_flight.clear()
