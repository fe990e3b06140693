"""The facade's collectives on Python objects (``bcast``, ``reduce``, ``scan``, ...): mpi4py's
lower-case calls, built from the device's point-to-point messages through rank 0 or the root, in
rank order, so every rank gets the same bits (virtualpar/mpi/facade.py).  They use the
communicator's own collective tag, never a user's."""

from __future__ import annotations

from typing import Any

import numpy as np

from .facade_types import _COLL, _SPAN, SUM, Op

__all__ = ["ObjectCollectives"]


class ObjectCollectives:
    """Mixed into ``facade.Comm``, whose device, ranks, rank, size and context these use."""

    _dev: Any
    _ranks: tuple[int, ...]
    _ctx: int
    rank: int
    size: int

    def _check_root(self, root: Any) -> None:
        """A root out of range is an error, as MPI's MPI_ERR_ROOT (a negative one must not count from the
        end)."""
        if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise ValueError(f"MPI root {root!r} is not a rank of this communicator of size {self.size} "
                             f"(0..{self.size - 1}): MPI_ERR_ROOT")

    def _to_root(self, obj: Any, root: int) -> list[Any] | None:
        self._check_root(root)
        tag = self._ctx * _SPAN + _COLL
        if self.rank != root:
            self._dev.send(obj, self._ranks[root], tag=tag)
            return None
        return [obj if r == root else self._dev.recv(self._ranks[r], tag=tag) for r in range(self.size)]

    def _from_root(self, obj: Any, root: int, per_rank: bool = False) -> Any:
        self._check_root(root)
        tag = self._ctx * _SPAN + _COLL
        if self.rank == root:
            for r in range(self.size):
                if r != root:
                    self._dev.send(obj[r] if per_rank else obj, self._ranks[r], tag=tag)
            return obj[root] if per_rank else obj
        return self._dev.recv(self._ranks[root], tag=tag)

    def barrier(self) -> None:
        self._from_root(self._to_root(None, 0), 0)

    Barrier = barrier

    # (parameter names as mpi4py's: a call by keyword, ``scatter(sendobj=...)``, works on both)
    def bcast(self, obj: Any, root: int = 0) -> Any:
        return self._from_root(obj, root)

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        return self._to_root(sendobj, root)

    def allgather(self, sendobj: Any) -> list[Any]:
        return self._from_root(self._to_root(sendobj, 0), 0)

    def scatter(self, sendobj: Any, root: int = 0) -> Any:
        return self._from_root(list(sendobj) if self.rank == root else None, root, per_rank=True)

    def reduce(self, sendobj: Any, op: Op = SUM, root: int = 0) -> Any:
        parts = self._to_root(sendobj, root)
        if parts is None:
            return None
        acc = parts[0]
        for p in parts[1:]:
            acc = op.fn(acc, p)
        return acc

    def allreduce(self, sendobj: Any, op: Op = SUM) -> Any:
        return self._from_root(self.reduce(sendobj, op, 0), 0)

    def alltoall(self, sendobj: Any) -> list[Any]:
        everything = self.allgather(list(sendobj))
        return [everything[r][self.rank] for r in range(self.size)]

    def scan(self, sendobj: Any, op: Op = SUM) -> Any:
        """Rank i gets ``x_0 op x_1 op … op x_i`` (reduced left to right at rank 0)."""
        return self._from_root(self._prefixes(sendobj, op, inclusive=True), 0, per_rank=True)

    def exscan(self, sendobj: Any, op: Op = SUM) -> Any:
        """Rank i gets ``x_0 op … op x_{i−1}``; rank 0 gets None (MPI leaves it undefined)."""
        return self._from_root(self._prefixes(sendobj, op, inclusive=False), 0, per_rank=True)

    def _prefixes(self, sendobj: Any, op: Op, inclusive: bool) -> list[Any] | None:
        """At rank 0: every rank's prefix reduction, in rank order (None elsewhere)."""
        parts = self._to_root(sendobj, 0)
        if parts is None:
            return None
        running, acc = [], None
        for i, part in enumerate(parts):
            acc = part if i == 0 else op.fn(acc, part)
            running.append(acc)
        return running if inclusive else [None] + running[:-1]
