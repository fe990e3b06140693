"""``mpi4py.MPI`` on the emulator: the common subset, so an unmodified mpi4py script runs on devices.

``virtualpar run --mpi -n 4 prog.py`` runs ``prog.py`` on every device with ``mpi4py`` and
``mpi4py.MPI`` resolving to a module of the device's (:func:`.script.module_for`), whose communicators
are this module's. Point-to-point calls become the device's own (arrays raw, other objects pickled;
``ANY_SOURCE``/``ANY_TAG``; ``Status``; ``ssend`` waits for its receive, as MPI's); collectives are
built (:mod:`.facade_objects`, :mod:`.facade_buffers`) from point-to-point messages in a fixed order
(the root gathers in rank order, reduces left to right, and sends the result back), so every rank gets
the same bits. A communicator's messages carry its own tag range (a context hashed from its parent's and
its Split), so collectives and other communicators never mix with user messages, even with ``ANY_TAG``:
it is received as any tag *within* the communicator's range. Anything outside the subset raises
``NotImplementedError`` naming the call (an ``OutsideSubset``, which is also an ``AttributeError``:
``hasattr(comm, "Iallreduce")`` is False, as for any name an object lacks). ``Comm.Abort(errorcode)``
ends the whole job with that exit code, as ``mpiexec`` does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import VirtualParError
from ..runtime.status import ANY_SOURCE as _DEV_ANY_SOURCE, ANY_TAG, Status as _DevStatus
from .facade_buffers import BufferCollectives
from .facade_objects import ObjectCollectives
from .facade_requests import Request
from .facade_types import (ANY_SOURCE, PROC_NULL, TAG_UB, TAG_UB_VALUE, WTIME_IS_GLOBAL, AbortJob, Status,
                           _buf, _COLL, _fill, _SPAN, _wire, context_of)

__all__ = ["Comm", "Cartcomm", "MPIAbort", "OutsideSubset"]


class OutsideSubset(AttributeError, NotImplementedError):
    """A name of mpi4py the facade does not emulate: the error says so when the name is used, and,
    being an ``AttributeError`` too, ``hasattr`` and ``getattr(obj, name, default)`` see it missing."""


class MPIAbort(VirtualParError):
    """``comm.Abort(errorcode)`` was called on a rank (details ``rank``, ``errorcode``): the other
    ranks are stopped and the job exits with ``errorcode``, as under ``mpiexec``."""


class Comm(ObjectCollectives, BufferCollectives):
    """A communicator: ``ranks`` (device ranks, in this communicator's order) and a tag range."""

    def __init__(self, dev: Any, ranks: tuple[int, ...], ctx: int) -> None:
        self._dev, self._ranks, self._ctx = dev, tuple(ranks), ctx
        self.rank, self.size = self._ranks.index(dev.rank), len(self._ranks)
        self._splits = 0

    # -- identity ---------------------------------------------------------------------------------
    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def Get_attr(self, keyval: int) -> Any:
        """``TAG_UB``: the largest tag, MPICH's; ``WTIME_IS_GLOBAL``: 0 (each rank's ``Wtime`` counts from
        its own start, as MPICH's does); any other key: None, as for an attribute never set."""
        return {TAG_UB: TAG_UB_VALUE, WTIME_IS_GLOBAL: 0}.get(keyval)

    def _tag(self, tag: int) -> int | range:
        if tag == ANY_TAG:  # any of this communicator's own tags: never another's, nor its collectives'
            return range(self._ctx * _SPAN, self._ctx * _SPAN + _COLL)
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or not 0 <= tag <= TAG_UB_VALUE:
            raise ValueError(f"MPI tag {tag!r} is out of range 0..{TAG_UB_VALUE} "
                             "(Get_attr(MPI.TAG_UB)): MPI_ERR_TAG")
        return self._ctx * _SPAN + tag

    def _peer(self, r: int, source: bool = False) -> int:
        """Rank ``r`` of this communicator as a device rank (a receive's ``source`` may be ANY_SOURCE).
        A rank out of range is an error, as MPI's MPI_ERR_RANK (a negative one must not count
        from the end)."""
        if source and r == ANY_SOURCE:
            return _DEV_ANY_SOURCE
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or not 0 <= r < self.size:
            raise ValueError(f"MPI rank {r!r} is not a rank of this communicator of size {self.size} "
                             f"(0..{self.size - 1}{', ANY_SOURCE' if source else ''} or "
                             "PROC_NULL): MPI_ERR_RANK")
        return self._ranks[r]

    def _local(self, device_rank: int) -> int:
        return self._ranks.index(device_rank)

    # -- point to point (pickled objects) ---------------------------------------------------------
    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        if dest != PROC_NULL:
            self._dev.send(obj, self._peer(dest), tag=self._tag(tag))

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None) -> Any:
        if source == PROC_NULL:
            if status is not None:
                status._from_nowhere()
            return None
        st = _DevStatus()
        value = self._dev.recv(self._peer(source, True), tag=self._tag(tag), status=st)
        if status is not None:
            status.source, status.tag, status.count = self._local(st.source), st.tag % _SPAN, st.nbytes
        return value

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        if isinstance(obj, np.ndarray):  # mpi4py pickles at once: the array may change before the wait
            obj = obj.copy()
        return Request(None if dest == PROC_NULL else self._dev.isend(obj, self._peer(dest),
                                                                      tag=self._tag(tag)), self)

    def ssend(self, obj: Any, dest: int, tag: int = 0) -> None:
        """Returns once the matching receive has taken ``obj`` (MPI's synchronous send)."""
        if dest != PROC_NULL:
            self._dev.ssend(obj, self._peer(dest), tag=self._tag(tag))

    def issend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        if isinstance(obj, np.ndarray):
            obj = obj.copy()
        return Request(None if dest == PROC_NULL else self._dev.issend(obj, self._peer(dest),
                                                                       tag=self._tag(tag)), self)

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        return Request(None if source == PROC_NULL else self._dev.irecv(self._peer(source, True),
                                                                        tag=self._tag(tag)), self)

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Has a message that ``Recv(source, tag)`` would take arrived?  ``status`` says its source,
        tag and size (``Get_count``), and the message stays for that receive.  From ``PROC_NULL``:
        True at once, with MPI's empty status from nowhere."""
        if source == PROC_NULL:
            if status is not None:
                status._from_nowhere()
            return True
        st = self._dev.iprobe(self._peer(source, True), self._tag(tag))
        if st is not None and status is not None:
            status.source, status.tag, status.count = self._local(st.source), st.tag % _SPAN, st.nbytes
        return st is not None

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:
        """Wait until ``Iprobe`` would be True (the device sleeps meanwhile); True, as mpi4py's."""
        if source == PROC_NULL:
            return self.Iprobe(source, tag, status)
        st = self._dev.probe(self._peer(source, True), self._tag(tag))
        if status is not None:
            status.source, status.tag, status.count = self._local(st.source), st.tag % _SPAN, st.nbytes
        return True

    iprobe, probe = Iprobe, Probe  # (mpi4py's lower-case ones are the same calls)

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Status | None = None) -> Any:
        req = self.irecv(source=source, tag=recvtag)
        self.send(sendobj, dest, sendtag)
        return req.wait(status)

    # -- point to point (buffers) -------------------------------------------------------------------
    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        if dest == PROC_NULL:
            return
        self._dev.send(_wire(buf), self._peer(dest), tag=self._tag(tag))

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Status | None = None) -> None:
        if source == PROC_NULL:
            if status is not None:
                status._from_nowhere()
            return
        _fill(_buf(buf), self.recv(source=source, tag=tag, status=status))

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        return Request(None if dest == PROC_NULL else self._dev.isend(np.array(_wire(buf)), self._peer(dest),
                                                                     tag=self._tag(tag)), self)

    def Ssend(self, buf: Any, dest: int, tag: int = 0) -> None:
        if dest != PROC_NULL:
            self._dev.ssend(_wire(buf), self._peer(dest), tag=self._tag(tag))

    def Issend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        return Request(None if dest == PROC_NULL else self._dev.issend(np.array(_wire(buf)), self._peer(dest),
                                                                      tag=self._tag(tag)), self)

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        out = _buf(buf)  # (checked before the receive is posted: a refused buffer must not leave one behind)
        return Request(None if source == PROC_NULL else self._dev.irecv(self._peer(source, True),
                                                                        tag=self._tag(tag)), self,
                       out=out)

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        req = self.Irecv(recvbuf, source, recvtag)  # (from PROC_NULL: complete at once, its status says so)
        self.Send(sendbuf, dest, sendtag)
        req.wait(status)

    def Sendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                         recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        """``Sendrecv`` with one buffer: its contents go to ``dest``, and the message from ``source``
        replaces them (sent from a copy, so the receive may land first)."""
        outgoing = np.array(_wire(buf))
        req = self.Irecv(buf, source, recvtag)
        self.Send(outgoing, dest, sendtag)
        req.wait(status)

    # -- new communicators --------------------------------------------------------------------------
    def Split(self, color: int = 0, key: int = 0) -> "Comm":
        self._splits += 1
        everyone = self.allgather((color, key, self.rank))
        mine = sorted((k, r) for c, k, r in everyone if c == color)
        ranks = tuple(self._ranks[r] for _, r in mine)
        return Comm(self._dev, ranks, context_of(self._ctx, self._splits, int(color)))

    def Dup(self) -> "Comm":
        return self.Split(0, self.rank)

    def Free(self) -> None:
        """Release a communicator made by ``Split``, ``Dup`` or ``Create_cart``: nothing to release
        here (it owns no resource but its tags).  Freeing ``COMM_WORLD`` or ``COMM_SELF`` is an
        error in MPI, and here."""
        if self._ctx in (0, 1):
            raise ValueError(f"rank {self.rank}: MPI_Comm_free of "
                             f"{'COMM_SELF' if self._ctx == 0 else 'COMM_WORLD'} "
                             "is erroneous (MPI_ERR_COMM): only communicators the program created are freed")

    def Create_cart(self, dims: list[int], periods: Any = None, reorder: bool = False) -> "Cartcomm":
        self._splits += 1
        return Cartcomm(self._dev, self._ranks, context_of(self._ctx, self._splits, -1), list(dims), periods)

    def Abort(self, errorcode: int = 0) -> None:
        """End the whole job with exit code ``errorcode`` (the other ranks are stopped wherever they are)."""
        raise AbortJob(MPIAbort(f"rank {self.rank} called MPI_Abort(comm, {int(errorcode)})",
                                rank=self._dev.rank, errorcode=int(errorcode)))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise OutsideSubset(f"MPI.Comm.{name} is outside the subset virtualpar emulates; run this program "
                            "under real MPI (mpiexec) for it")


class Cartcomm(Comm):
    def __init__(self, dev: Any, ranks: tuple[int, ...], ctx: int, dims: list[int], periods: Any) -> None:
        super().__init__(dev, ranks, ctx)
        self.dims = dims
        # one for every dimension
        if periods is None or isinstance(periods, (bool, int, np.bool_, np.integer)):
            periods = [bool(periods)] * len(dims)
        self.periods = [int(bool(p)) for p in periods]  # as mpi4py's Get_topo gives them: 1 or 0

    def Get_coords(self, rank: int) -> list[int]:
        return [int(c) for c in np.unravel_index(rank, self.dims)]

    def Get_cart_rank(self, coords: list[int]) -> int:
        return int(np.ravel_multi_index(coords, self.dims))

    def Shift(self, direction: int, disp: int) -> tuple[int, int]:
        here = self.Get_coords(self.rank)

        def moved(step: int) -> int:
            c = list(here)
            c[direction] += step
            if self.periods[direction]:
                c[direction] %= self.dims[direction]
            elif not 0 <= c[direction] < self.dims[direction]:
                return PROC_NULL
            return self.Get_cart_rank(c)

        return moved(-disp), moved(disp)

    def Sub(self, remain_dims: list[bool]) -> "Cartcomm":
        """The cartesian communicator of the kept dimensions through this rank (its Shift works too)."""
        here = self.Get_coords(self.rank)
        color = sum(c * 1000 ** i for i, (c, keep) in enumerate(zip(here, remain_dims)) if not keep)
        sub = self.Split(color, self.rank)
        kept = [i for i, keep in enumerate(remain_dims) if keep]
        return Cartcomm(self._dev, sub._ranks, sub._ctx, [self.dims[i] for i in kept],
                        [self.periods[i] for i in kept])
