"""Charging a whole collective's schedule to a device's modelled clock, from kept columns.

A shared-memory collective does not send the messages real hardware would; every member instead
charges itself what that schedule would have cost it: with ``D`` the schedule's max-plus delay
matrix (``D[q][me]``: the longest chain of messages from member q's entry to this member's exit,
:mod:`virtualpar.sim.schedules`), this member leaves at ``max_q(entry[q] + D[q][me])`` where
``entry`` are the members' clocks on entering (read from the fence's slots).  A clock keeps its
column of ``D`` per (group, schedule, sizes) — at most ``_SCHEDULES_KEPT`` of them — so a repeated
call costs n additions, and a uniform column (:meth:`ScheduleCharges._exit`) n comparisons.

:class:`ScheduleCharges` is the part of :class:`~virtualpar.sim.clock.DeviceClock` that does this;
it uses the clock's ``rank``, ``topology``, ``_schedules`` and ``advance_to``.
"""

from __future__ import annotations

from typing import Any

from virtualpar.sim.exchange import pairwise_exchange_column
from virtualpar.sim.max_plus import RingLinks
from virtualpar.sim.schedules import (apply_delays, dissemination_column, ring_all_reduce_column,
                                      ring_half_column,
                                     tree_all_reduce_column, tree_all_reduce_links, tree_broadcast_column)

__all__ = ["ScheduleCharges"]

_SCHEDULES_KEPT = 256  # delay columns a clock keeps (distinct groups x chunk sizes of shm collectives)


class ScheduleCharges:
    """Collective schedules charged from kept delay columns (mixed into ``DeviceClock``)."""

    def _kept(self, key: tuple, compute: Any) -> Any:
        """What is kept under ``key``, else ``compute()``'s, kept."""
        value = self._schedules.get(key)
        return self._store(key, compute()) if value is None else value

    def _keep(self, key: tuple, column: Any) -> Any:
        """Keep the delay ``column`` under ``key`` — as one float if its entries are all the same
        (see :meth:`_exit`) — and return what was kept."""
        return self._store(key, float(column[0]) if len({float(d).hex() for d in column}) == 1 else column)

    def _store(self, key: tuple, value: Any) -> Any:
        """Keep ``value`` under ``key``, at most ``_SCHEDULES_KEPT`` things in all; returns it."""
        if len(self._schedules) >= _SCHEDULES_KEPT:
            self._schedules.clear()
        self._schedules[key] = value
        return value

    def _exit(self, column: Any, entry: Any) -> float:
        """``now = max(now, max_q(entry[q] + column[q]))``; returns the new ``now``.  A uniform column
        (every member's longest chain to this one equally long: the barrier, the power-of-two tree,
        the ring on a flat topology) is kept as its one value c, and max_q(entry[q] + c) is
        max(entry) + c to the bit, rounding being monotone: no n additions and n new floats, which
        at 64 devices on two cores cost a woken device ~5 µs of cold-cache CPU per call."""
        t = max(entry) + column if type(column) is float else apply_delays(column, entry)
        if t > self.now:  # (advance_to without its checks: t is a float, from clocks that are never NaN)
            self.now = t
        return self.now

    def ring_all_reduce(self, ranks: tuple[int, ...], entry: list[float], chunk_nbytes: list[int]) -> float:
        """Charge the ring all_reduce over ``ranks`` entered at clocks ``entry`` without running it:
        ``now = max(now, max_q(entry[q] + D[q][me]))`` with ``D`` the schedule's max-plus delay matrix
        (:func:`~virtualpar.sim.schedules.ring_all_reduce_column` computes this device's column in
        O(n²)); the column is kept per (group, chunk sizes), at most ``_SCHEDULES_KEPT`` of them, so a
        repeated call costs n additions.  Returns the new ``now``."""
        key = (ranks, tuple(chunk_nbytes))
        column = self._schedules.get(key)
        if column is None:
            column = self._keep(key,
                                ring_all_reduce_column(self.topology, ranks, chunk_nbytes,
                                                       ranks.index(self.rank), self._ring_links(ranks)))
        return self._exit(column, entry)

    def tree_all_reduce(self, ranks: tuple[int, ...], entry: list[float], nbytes: int) -> float:
        """Charge the recursive-doubling all_reduce of ``nbytes`` over ``ranks`` entered at
        ``entry`` without running it (:func:`~virtualpar.sim.schedules.tree_all_reduce_column`, kept
        per group and size like :meth:`ring_all_reduce`: O(n) per call; the replay of every
        member's messages cost ~1 ms of CPU per call per device at 64 devices; the route figures
        it needs are kept per group, so a new size costs no route lookups).  Returns the new
        ``now``."""
        key = (ranks, "tree", nbytes)
        column = self._schedules.get(key)
        if column is None:  # the kept column costs no lookup of the links
            links = self._kept((ranks, "tree links"), lambda: tree_all_reduce_links(self.topology, ranks))
            column = self._keep(key,
                                tree_all_reduce_column(self.topology, ranks, ranks.index(self.rank), nbytes,
                                                       links))
        return self._exit(column, entry)

    def ring_half(self, ranks: tuple[int, ...], entry: list[float], piece_nbytes: list[int],
                  half: str) -> float:
        """Charge the ring all_gather (``half="all_gather"``) or reduce_scatter (``"reduce_scatter"``)
        of pieces of ``piece_nbytes`` over ``ranks`` entered at ``entry`` without running it
        (:func:`~virtualpar.sim.schedules.ring_half_column`, kept like :meth:`ring_all_reduce`'s).
        Returns the new ``now``."""
        key = (ranks, half, tuple(piece_nbytes))
        column = self._schedules.get(key)
        if column is None:
            column = self._keep(key,
                                ring_half_column(self.topology, ranks, piece_nbytes, ranks.index(self.rank),
                                                 half, self._ring_links(ranks)))
        return self._exit(column, entry)

    def _ring_links(self, ranks: tuple[int, ...]) -> RingLinks:
        """The route figures of the ring over ``ranks``, kept per group: a new size's column looks up none."""
        return self._kept((ranks, "ring links"), lambda: RingLinks(self.topology, ranks))

    def pairwise_exchange(self, ranks: tuple[int, ...], entry: list[float], piece_nbytes: list[int]) -> float:
        """Charge the pairwise exchange (all_to_all) of pieces of ``piece_nbytes`` over ``ranks``
        entered at ``entry`` without running it (:func:`~virtualpar.sim.exchange.pairwise_exchange_column`,
        kept like :meth:`ring_all_reduce`'s).  Returns the new ``now``."""
        key = (ranks, "exchange", tuple(piece_nbytes))
        column = self._schedules.get(key)
        if column is None:
            column = self._keep(key,
                                pairwise_exchange_column(self.topology, ranks, piece_nbytes,
                                                         ranks.index(self.rank)))
        return self._exit(column, entry)

    def tree_broadcast(self, ranks: tuple[int, ...], entry: list[float], root: int, nbytes: int) -> float:
        """Charge the binomial-tree broadcast of ``nbytes`` from position ``root`` over ``ranks``
        entered at ``entry`` without running it (:func:`~virtualpar.sim.schedules.tree_broadcast_column`,
        kept like :meth:`ring_all_reduce`'s: O(log n) per call).  Returns the new ``now``."""
        key = (ranks, "bcast", root, nbytes)
        column = self._kept(key,
                            lambda: tree_broadcast_column(self.topology, ranks, root, ranks.index(self.rank),
                                                          nbytes))
        return self.advance_to(max(entry[q] + d for q, d in column))

    def dissemination_barrier(self, ranks: tuple[int, ...], entry: list[float]) -> float:
        """Charge the dissemination barrier over ``ranks`` entered at clocks ``entry`` without
        sending its messages (:func:`~virtualpar.sim.schedules.dissemination_column`; kept per
        group like :meth:`ring_all_reduce`).  Returns the new ``now``."""
        key = (ranks, "barrier")
        column = self._schedules.get(key)
        if column is None:
            column = self._keep(key, dissemination_column(self.topology, ranks, ranks.index(self.rank)))
        return self._exit(column, entry)
