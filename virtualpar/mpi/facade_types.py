"""The facade's value types (``Op``, ``Datatype``, ``Status``, ``IN_PLACE``; ``Request`` is in
:mod:`.facade_requests`), the buffer specs
(``[buf, counts, displs, MPI.DOUBLE]``: :func:`_layout`, :func:`_place`) and the
tag layout a communicator uses (user tags below ``_COLL``, the facade's collectives at ``_COLL``,
each communicator in its own span of ``_SPAN`` device tags)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.status import ANY_TAG

__all__ = ["Op", "Datatype", "Status", "IN_PLACE", "SUM", "PROD", "MAX", "MIN",
           "DOUBLE", "FLOAT", "INT", "LONG", "ANY_SOURCE", "PROC_NULL", "TAG_UB", "WTIME_IS_GLOBAL"]

# MPICH's values, as mpi4py on the project's reference MPI (the mpich wheel) shows them: a script
# that prints a rank from ``Shift`` or a status prints what it prints under mpiexec.  (Open MPI
# swaps the two.)  The facade maps ANY_SOURCE to the device's (runtime.status.ANY_SOURCE, -1).
ANY_SOURCE, PROC_NULL = -2, -1
TAG_UB_VALUE = (1 << 29) - 1  # MPICH's largest tag (Get_attr(TAG_UB)); a larger one is MPI_ERR_TAG
TAG_UB, WTIME_IS_GLOBAL = 1681915905, 1681915911  # MPICH's attribute keys, as mpi4py shows them

# device tags per communicator: user tags below _COLL (MPICH's TAG_UB: 2**29 - 1), collectives at _COLL
_SPAN = 1 << 30
_COLL = _SPAN - 1
IN_PLACE = type("InPlace", (), {"__repr__": lambda self: "MPI.IN_PLACE"})()


class Op:
    def __init__(self, name: str, fn: Any) -> None:
        self.name, self.fn = name, fn

    def __repr__(self) -> str:
        return f"MPI.{self.name}"


SUM = Op("SUM", lambda a, b: a + b)
PROD = Op("PROD", lambda a, b: a * b)
MAX = Op("MAX", lambda a, b: np.maximum(a, b) if isinstance(a, np.ndarray) else max(a, b))
MIN = Op("MIN", lambda a, b: np.minimum(a, b) if isinstance(a, np.ndarray) else min(a, b))


class Datatype:
    def __init__(self, name: str, dtype: Any) -> None:
        self.name, self.dtype = name, np.dtype(dtype)

    def __repr__(self) -> str:
        return f"MPI.{self.name}"


DOUBLE, FLOAT, INT, LONG = Datatype("DOUBLE", np.float64), Datatype("FLOAT",
                                                                    np.float32), Datatype("INT", np.int32), \
    Datatype("LONG", np.int64)


def _buf(spec: Any) -> np.ndarray:
    """The array of a buffer spec: ``arr``, ``[arr, MPI.DOUBLE]``, or ``[arr, count, MPI.DOUBLE]``
    (the first ``count`` elements, as mpi4py takes them)."""
    count = _per_rank(spec)
    if count is not None:
        return _flat(spec)[:count]
    return _contiguous(spec[0] if isinstance(spec, (list, tuple)) else spec)


def _region(spec: Any, size: int) -> np.ndarray:
    """The elements a collective spans in the buffer of ``spec``, flat: with ``[buf, count, type]``
    the first ``count·size`` (a collective's count is per rank, as MPI reads it; ``_buf`` reads a
    point-to-point count, of the whole message), otherwise the whole buffer."""
    count = _per_rank(spec)
    return _flat(spec) if count is None else _flat(spec)[: count * size]


def _flat(spec: Any) -> np.ndarray:
    """The whole array of ``spec`` as a flat view in memory order (as MPI moves its bytes)."""
    return np.asarray(_contiguous(spec[0] if isinstance(spec,
                                                        (list, tuple)) else spec)).reshape(-1, order="A")


def _wire(buf: Any) -> np.ndarray:
    """What a buffer send puts on the wire, as MPI sends bytes in memory order: a C-ordered array as
    it is, a Fortran-ordered one flattened in memory order (every flattening here uses ``order="A"``)."""
    arr = np.asarray(_buf(buf))
    return arr if arr.flags.c_contiguous else arr.reshape(-1, order="A")


def _contiguous(buf: Any) -> Any:
    """``buf``, refused as mpi4py refuses it unless it is contiguous (a flattened copy of a strided
    view would take the data, and the view would never see it), or ``IN_PLACE`` where MPI does not
    define it (facade_buffers.py takes it where it does)."""
    if buf is IN_PLACE:
        raise ValueError("MPI.IN_PLACE is not a buffer here: it stands for a send buffer (Reduce, Allreduce, "
                         "Gather(v), Allgather(v), Alltoall, Reduce_scatter_block) or the root's receive "
                         "buffer of Scatter(v)")
    if isinstance(buf, np.ndarray) and not (buf.flags.c_contiguous or buf.flags.f_contiguous):
        raise BufferError("ndarray is not contiguous")
    return buf


def _blocks(entries: int, size: int) -> None:
    """Refuse ``entries`` that do not split into ``size`` equal blocks, with mpi4py's message."""
    if entries % size:
        raise ValueError(f"message: cannot infer count, number of entries {entries} is not a multiple of "
                         f"required number of blocks {size}")


def _per_rank(spec: Any) -> int | None:
    """The count of a ``[buf, count, type]`` spec, else None."""
    if isinstance(spec, (list, tuple)) and len(spec) == 3 and isinstance(spec[1], (int, np.integer)) \
            and not isinstance(spec[1], bool):
        return int(spec[1])
    return None


def _fill(target: np.ndarray, value: Any) -> None:
    """A received message into a receive buffer: MPI lets the buffer be larger (``Get_count``
    says how much came) and calls a longer message an error (truncation), never a reshape."""
    flat, got = target.reshape(-1, order="A"), np.asarray(value).reshape(-1, order="A")  # (memory order)
    if got.size > flat.size:
        raise ValueError(f"message truncated: {got.size} elements arrived for a buffer of "
                         f"{flat.size} (MPI_ERR_TRUNCATE)")
    flat[: got.size] = got


class Status:
    def __init__(self) -> None:
        self.source, self.tag, self.count = ANY_SOURCE, ANY_TAG, 0

    def _empty(self) -> None:
        """MPI's empty status (of a request already completed): any source, any tag, nothing."""
        self.source, self.tag, self.count = ANY_SOURCE, ANY_TAG, 0

    def _from_nowhere(self) -> None:
        """What MPI reports for a receive from ``PROC_NULL``: source PROC_NULL, any tag, nothing."""
        self.source, self.tag, self.count = PROC_NULL, ANY_TAG, 0

    def Get_source(self) -> int:
        return self.source

    def Get_tag(self) -> int:
        return self.tag

    def Get_count(self, datatype: Any = None) -> int:
        return self.count // (datatype.dtype.itemsize if isinstance(datatype, Datatype) else 1)


def _layout(spec: Any, size: int, total: int) -> tuple[list[int], list[int]]:
    """(counts, displacements) of a v-buffer spec: ``[buf, counts]``, ``[buf, counts, displs]``,
    ``[buf, (counts, displs), type]`` or ``[buf, counts, displs, type]``; equal pieces otherwise
    (``[buf, count, type]``: ``count`` each)."""
    extra = [a for a in spec[1:] if not isinstance(a, Datatype)] if isinstance(spec, (list, tuple)) else []
    if not extra or _per_rank(spec) is not None:  # equal pieces: of the count per rank, if given
        count = _per_rank(spec)
        if count is None:
            _blocks(total, size)
        counts = [total // size if count is None else count] * size
        return counts, [sum(counts[:i]) for i in range(size)]
    if len(extra) == 1 and isinstance(extra[0],
                                      tuple) and len(extra[0]) == 2 and not np.isscalar(extra[0][0]):
        extra = list(extra[0])
    counts = [int(c) for c in extra[0]]
    displs = [int(d) for d in extra[1]] if len(extra) > 1 and extra[1] is not None else \
        [sum(counts[:i]) for i in range(size)]
    return counts, displs


def _place(parts: list[np.ndarray], recvbuf: Any, size: int) -> None:
    """Write the ranks' flat ``parts`` into ``recvbuf`` at the displacements its spec gives."""
    flat = _region(recvbuf, size)
    _, displs = _layout(recvbuf, size, flat.size)
    if not isinstance(recvbuf,
                      (list, tuple)) or len([a for a in recvbuf[1:] if not isinstance(a, Datatype)]) == 0:
        displs = [sum(p.size for p in parts[:i]) for i in range(size)]  # plain Gather: back to back
    for part, d in zip(parts, displs):
        flat[d:d + part.size] = part


class AbortJob(BaseException):
    """``Comm.Abort``'s signal through the script: a ``BaseException``, as ``SystemExit`` is, so
    that ``except Exception`` in the script cannot swallow it (MPI_Abort does not return)."""

    def __init__(self, error: Any) -> None:
        super().__init__(str(error))
        self.error = error


def context_of(parent: int, splits: int, color: int) -> int:
    """A new communicator's tag context, the same on every member (they agree on all three) and
    distinct from its siblings' (a hash over 32 bits, so that context · ``_SPAN`` + tag stays below
    the device's 2**63; ``(ctx*131 + splits*17 + color) % 4000`` gave Split(color=17) and a later
    Dup the same context, so their messages crossed)."""
    import hashlib

    digest = hashlib.blake2b(f"{parent}/{splits}/{color}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") + 1
