"""The collectives of :class:`~virtualpar.mpi.device.MPIDevice`: MPI's own by default, virtualpar's
algorithms over MPI point-to-point when the caller names one (``algorithm="ring"``, ``"tree"``,
``"direct"``; ``"shm"`` needs the emulator's shared memory).

Results follow the emulator's semantics (gathers concatenate along ``dim`` in group order,
``reduce_scatter`` and ``scatter`` split like ``numpy.array_split``, ``avg`` divides the sum).

The modelled clock.  Every member first learns the members' entry clocks (one ``allgather`` of a
float on the group's communicator), then charges what the emulator's default would on the mesh's
hardware:

* ``all_reduce``: the recursive-doubling tree below 64 KiB, the ring from there, as the max-plus
  schedules of :mod:`virtualpar.sim.schedules` — the same charge as the emulator's default;
* ``barrier``: the dissemination barrier, the same as the emulator's;
* the others: ``max(entry) + steps × T_worst(piece)``, with the default algorithm's step count
  (ring n−1, tree ⌈log2 n⌉, all_to_all's pairwise exchange n−1, gather and scatter 1, the
  root's messages travelling at once) and ``T_worst`` the slowest route between group neighbours
  (the root and the others for gather and scatter).  This closed form equals the emulator's
  charge on uniform links when the members enter together, except that every member is charged
  the whole tree (on the emulator a tree's leaves leave early).

With ``algorithm=`` the messages themselves carry the modelled time, exactly as on the emulator.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from ..collectives.ops import REDUCE_OPS, check_op, premultiplies, premultiply
from ..collectives.registry import ALGORITHMS
from ..collectives.shm import RING_MIN_BYTES, split_bounds
from ..errors import CollectiveMismatch, CollectiveTimeout, UsageError
from .comm import MPIComm

__all__ = ["MPICollectives"]

_CALLS: dict[tuple, tuple[str, int]] = {}  # a call's key -> (its description, its digest)
_PIECES = {"all_gather": 1, "gather": 2, "all_to_all": 1}  # the position of the dim whose size may differ


def _describe(name: str, ours: tuple, algorithm: str | None) -> str:
    """The call as its members must agree on it: the input's dtype and shape (but a dim along
    which pieces may differ, and the root's payload only), and every parameter."""
    parts = []
    for i, a in enumerate(ours):
        if i == 0 and name in ("broadcast", "scatter"):
            continue  # only the root's counts
        if i == 0 and not isinstance(a, np.ndarray):
            a = np.asarray(a)  # the data by its dtype and shape, never its value (ranks hold different ones)
        if isinstance(a, np.ndarray):
            shape = list(a.shape)
            dim = ours[_PIECES[name]] if name in _PIECES else None
            if dim is not None and -len(shape) <= dim < len(shape):
                shape[dim] = "*"
            a = f"{a.dtype}{shape}"
        parts.append(str(a))
    return f"{name}({', '.join(parts)}{'' if algorithm is None else f', algorithm={algorithm}'})"

_STEPS = {"all_gather": "ring", "reduce_scatter": "ring", "broadcast": "tree", "reduce": "tree",
          "gather": "direct", "scatter": "direct", "all_to_all": "direct"}


class MPICollectives:
    """Mixin: needs ``_comm(group)``, ``_mpi``, ``group(group)``, ``rank``, ``_clock``, ``_record``."""

    def _ours(self, name: str, algorithm: str, group: Any, *args: Any) -> Any:
        table = ALGORITHMS[name]
        if algorithm not in table or algorithm == "shm":
            usable = sorted(a for a in table if a != "shm")
            raise UsageError(f"device {self.rank}: {name}(algorithm={algorithm!r}) is "
                             "not available under MPI; "
                             f"choose from {usable} or leave it to MPI (algorithm=None)", rank=self.rank,
                             op=name)
        sub, ranks = self._comm(group, private=True), self.group(group)
        comm = MPIComm(self._clock, self._count, sub, ranks)
        try:
            return table[algorithm](comm, *args)
        finally:
            comm.flush()

    def _enter(self, name: str, group: Any, ranks: tuple[int, ...], ours: tuple, algorithm: str | None,
               timeout: float | None) -> list[float]:
        """Every member's entry clock, exchanged with a 32-bit digest of its call (a non-blocking
        allgather, waited on with a deadline): members calling different collectives raise
        ``CollectiveMismatch`` naming each call, and one that never comes ``CollectiveTimeout`` —
        under plain MPI both wait forever."""
        if len(ranks) == 1:
            return [self._clock.now]
        x = ours[0] if ours else None
        key = (name, algorithm, *(ours[1:]),
               *((x.dtype, x.shape) if isinstance(x, np.ndarray) else (type(x),)))
        try:
            call, digest = _CALLS[key]
        except (KeyError, TypeError):  # a repeated call costs a dict lookup, not a description and a crc
            call = _describe(name, ours, algorithm)
            digest = zlib.crc32(call.encode())
            if len(_CALLS) < 4096:
                try:
                    _CALLS[key] = (call, digest)
                except TypeError:  # an unhashable parameter: describe it each time
                    pass
        mine = np.array([self._clock.now, 0.0])
        mine[1:].view(np.int64)[0] = digest
        got = np.empty((len(ranks), 2))
        req = self._comm(group).Iallgather(mine, got)
        budget, deadline = self._deadline(timeout)
        self._wait(req.Test, deadline, lambda: CollectiveTimeout(
            f"{self.name}: {call} on group {ranks} did not complete within {budget:g} s: a "
            "member of the group has "
            "not entered it (under MPI the others cannot be read; on the emulator the error names them)",
            rank=self.rank, op=name))
        digests = got[:, 1].copy().view(np.int64)
        if (digests != digests[0]).any():
            calls = self._comm(group).allgather(call)  # every member got here: this cannot hang
            raise CollectiveMismatch(f"{self.name}: the devices of group {ranks} "
                                     "called different collectives: "
                                     + "; ".join(f"device {r}: {c}" for r, c in zip(ranks, calls)),
                                     rank=self.rank)
        return got[:, 0].tolist()

    def _collective(self, name: str, group: Any, algorithm: str | None, native: Any, ours: tuple,
                    nbytes: Any, itemsize: int = 1, timeout: float | None = None) -> Any:
        """Run one collective (``native()`` or our ``algorithm`` on ``ours``), time it on both clocks
        and record it; ``nbytes(result)`` gives the per-member size the modelled charge uses."""
        ranks = self.group(group)
        _check_args(self, name, ranks, ours)
        wall0, model0 = self.wall, self._clock.now
        entry = self._enter(name, group, ranks, ours, algorithm, timeout)
        if algorithm is not None:
            result = self._ours(name, algorithm, group, *ours)
        else:
            result = native()
            self._charge(name, ranks, entry, nbytes(result), itemsize)
        self._record("collective", name, wall0, model0, nbytes(result), group=ranks)
        return result

    def _charge(self, name: str, ranks: tuple[int, ...], entry: list[float], nbytes: int,
                itemsize: int) -> None:
        n, clock = len(ranks), self._clock
        if n == 1:
            return
        if name == "barrier":
            clock.dissemination_barrier(ranks, entry)
        elif name == "all_reduce":
            if nbytes < RING_MIN_BYTES:
                clock.tree_all_reduce(ranks, entry, nbytes)
            else:
                bounds = split_bounds(nbytes // itemsize, n)
                clock.ring_all_reduce(ranks, entry,
                                      [(bounds[i + 1] - bounds[i]) * itemsize for i in range(n)])
        else:
            steps = {"ring": n - 1, "tree": math.ceil(math.log2(n)), "direct": n - 1}[_STEPS[name]]
            piece = nbytes // n if name in ("reduce_scatter", "scatter", "all_to_all") else nbytes
            route = clock.topology.route
            if name in ("gather", "scatter"):  # the root's n−1 messages travel at once, one per link
                steps, pairs = 1, [(ranks[0], r) for r in ranks[1:]]
            else:
                pairs = [(ranks[i], ranks[(i + 1) % n]) for i in range(n)]
            worst = max(max(route(a, b).time(piece), route(b, a).time(piece)) for a, b in pairs)
            clock.advance_to(max(entry) + steps * worst)

    # -- the collectives of the device protocol ------------------------------------------------------
    def all_reduce(self, x: np.ndarray, op: str = "sum", group: Any = None, algorithm: str | None = None,
                   timeout: float | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x)
        check_op(op, x.dtype)  # an unknown op, or avg on integers, raises here naming what is wrong

        def native() -> np.ndarray:
            out, n = np.empty_like(x), len(self.group(group))
            src, divide = _averaged(x, op, n)
            self._comm(group).Allreduce(src, out, op=self._mpi_op(op, x.dtype))
            return out / n if divide else out

        return self._collective("all_reduce", group, algorithm, native, (x, op), lambda _: x.nbytes,
                                x.itemsize, timeout=timeout)

    def all_gather(self, x: np.ndarray, dim: int = 0, group: Any = None, algorithm: str | None = None,
                   timeout: float | None = None) -> np.ndarray:
        native = lambda: np.concatenate(self._comm(group).allgather(np.asarray(x)), axis=dim)  # noqa: E731
        return self._collective("all_gather", group, algorithm, native, (x, dim),
                                lambda _: np.asarray(x).nbytes, timeout=timeout)

    def reduce_scatter(self, x: np.ndarray, dim: int = 0, op: str = "sum", group: Any = None,
                       algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        check_op(op, np.asarray(x).dtype)  # an unknown op was a KeyError; avg on integers a float result
        def native() -> np.ndarray:
            x_, n = np.ascontiguousarray(x), len(self.group(group))
            full = np.empty_like(x_)
            src, divide = _averaged(x_, op, n)
            self._comm(group).Allreduce(src, full, op=self._mpi_op(op, x_.dtype))
            return np.array_split(full / n if divide else full, n, axis=dim)[self.group_rank(group)]

        return self._collective("reduce_scatter", group, algorithm, native, (x, dim, op),
                                lambda _: np.asarray(x).nbytes, timeout=timeout)

    def broadcast(self, x: Any, root: int = 0, group: Any = None, algorithm: str | None = None,
                  timeout: float | None = None) -> np.ndarray:
        native = lambda: self._comm(group).bcast(x, root=root)  # noqa: E731
        return self._collective("broadcast", group, algorithm, native, (x, root),
                                lambda out: np.asarray(out).nbytes, timeout=timeout)

    def reduce(self, x: np.ndarray, root: int = 0, op: str = "sum", group: Any = None,
               algorithm: str | None = None, timeout: float | None = None) -> np.ndarray | None:
        check_op(op, np.asarray(x).dtype)
        def native() -> np.ndarray | None:
            src, divide = _averaged(np.asarray(x), op, len(self.group(group)))
            parts = self._comm(group).gather(src, root=root)
            if parts is None:
                return None
            acc = np.array(parts[0], copy=True)
            # left to right in group order (the emulator's tree may differ in the last bit)
            for p in parts[1:]:
                REDUCE_OPS["sum" if op == "avg" else op].ufunc(acc, p, out=acc)
            return acc / len(parts) if divide else acc

        return self._collective("reduce", group, algorithm, native, (x, root, op),
                                lambda _: np.asarray(x).nbytes, timeout=timeout)

    def gather(self, x: np.ndarray, root: int = 0, dim: int = 0, group: Any = None,
               algorithm: str | None = None, timeout: float | None = None) -> np.ndarray | None:
        def native() -> np.ndarray | None:
            parts = self._comm(group).gather(np.asarray(x), root=root)
            return None if parts is None else np.concatenate(parts, axis=dim)

        return self._collective("gather", group, algorithm, native, (x, root, dim),
                                lambda _: np.asarray(x).nbytes, timeout=timeout)

    def scatter(self, x: Any, root: int = 0, dim: int = 0, group: Any = None, algorithm: str | None = None,
                timeout: float | None = None) -> np.ndarray:
        n = len(self.group(group))
        mine = self.group_rank(group) == root

        def native() -> np.ndarray:
            pieces = np.array_split(np.asarray(x), n, axis=dim) if mine else None
            return self._comm(group).scatter(pieces, root=root)

        return self._collective("scatter", group, algorithm, native, (x if mine else None, root, dim),
                                lambda out: out.nbytes * n, timeout=timeout)

    def all_to_all(self, x: np.ndarray, split_dim: int = 0, concat_dim: int = 0, group: Any = None,
                   algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        n = len(self.group(group))

        def native() -> np.ndarray:
            got = self._comm(group).alltoall(np.array_split(np.asarray(x), n, axis=split_dim))
            return np.concatenate(got, axis=concat_dim)

        return self._collective("all_to_all", group, algorithm, native, (x, split_dim, concat_dim),
                                lambda _: np.asarray(x).nbytes, timeout=timeout)

    def barrier(self, group: Any = None, algorithm: str | None = None, timeout: float | None = None) -> None:
        self._collective("barrier", group, algorithm, lambda: self._comm(group).Barrier(), (), lambda _: 0,
                         timeout=timeout)
        return None


def _averaged(x: np.ndarray, op: str, n: int) -> tuple[np.ndarray, bool]:
    """(the input to sum, whether the sum is still to be divided by n): an ``avg`` of float16 is
    summed as x/n, as the emulator runs it (collectives.ops.premultiplies)."""
    if premultiplies(op, x.dtype, n):
        return premultiply(x, n), False
    return x, op == "avg"


_ROOT_AT = {"broadcast": 1, "reduce": 1, "gather": 1, "scatter": 1}  # where ``ours`` holds root and dim
_DIM_AT = {"all_gather": 1, "reduce_scatter": 1, "gather": 2, "scatter": 2}


def _check_args(dev: Any, name: str, ranks: tuple[int, ...], ours: tuple) -> None:
    """Root and dim checked as the emulator checks them (a root out of range was MPI's raw
    'Invalid root', a dim numpy's AxisError)."""
    where = f"{dev.name}: {name} on group {ranks}"
    if name in _ROOT_AT:
        root = ours[_ROOT_AT[name]]
        is_int = isinstance(root, (int, np.integer)) and not isinstance(root, (bool, np.bool_))
        if not is_int or not 0 <= root < len(ranks):
            raise UsageError(f"{where}: root={root!r} is out of range; root is a position in the group, "
                             f"0..{len(ranks) - 1}", rank=dev.rank)
    x = ours[0] if ours else None
    if name in _DIM_AT and isinstance(x, np.ndarray):
        dim = ours[_DIM_AT[name]]
        if (
            isinstance(dim, (bool, np.bool_))
            or not isinstance(dim, (int, np.integer))
            or not -x.ndim <= dim < max(x.ndim, 1)
        ):
            raise UsageError(f"{where}: dim={dim!r} is out of range for an input of {x.ndim} dims",
                             rank=dev.rank)
