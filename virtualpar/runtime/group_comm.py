"""The ``Comm`` and ``SharedComm`` a collective algorithm runs on: one device, one mesh group.

Positions in the group map to device ranks; messages go over the device's channels with the
collective tag (so they never match a user's ``recv``); shared-memory algorithms get every member's
scratch region, result buffers from the receive pool, fences made of arrival counters in the arena
(``transport/arrivals.py``: a word store and a read of the group's words per member, n−1 semaphore
posts by the last to arrive, no messages; a fence may carry a small array from each member), byte
accounting as if each read of a peer's memory were a message, and the modelled clock charged as
the ring all_reduce real hardware would run (``sim/schedules.py``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..collectives.comm import call_stamp
from ..errors import UsageError
from .config import TAG_COLLECTIVE
from .requests import Request

if TYPE_CHECKING:  # pragma: no cover
    from .collective_spec import CollectiveSpec
    from .core import DeviceCore

__all__ = ["GroupComm"]


class GroupComm:
    """Adapts one device (its :class:`~.core.DeviceCore`) and one mesh group to the ``Comm`` and
    ``SharedComm`` protocols the algorithms use."""

    def __init__(self, core: "DeviceCore", spec: CollectiveSpec, deadline: float, on_timeout: Any,
                 check: Callable[[], None] | None = None) -> None:
        self.rank = spec.position
        # the contract check, made at the first fence: the call's digest, and what to do if they differ
        self._check = (spec.digest, check) if check is not None and len(spec.ranks) > 1 else None
        self.size = len(spec.ranks)
        self._core = core
        self._ranks = spec.ranks
        self._deadline = deadline
        self._on_timeout = on_timeout
        self._entry: list[float] | None = None  # members' clocks at the first fence()
        self._carried = False  # did our last fence carry a digest, clock or payload (see release())
        self._fences = core.arrivals.group(spec.kind, spec.ranks) if self.size > 1 else None
        self.moved = 0  # bytes sent and read by peers in this call (for its trace event)

    def isend(self, x: np.ndarray, peer: int) -> Request:
        dst = self._ranks[peer]
        core = self._core
        wall0 = time.monotonic() if core.trace else 0.0  # the send starts before it is posted
        inner, flow = core.post_send(x, dst, TAG_COLLECTIVE)
        self.moved += inner.nbytes
        return Request(core, inner, "send", dst, TAG_COLLECTIVE, self._deadline, self._on_timeout, None, flow,
                       wall0=wall0)

    def irecv(self, peer: int, out: np.ndarray | None = None) -> Request:
        src = self._ranks[peer]
        core = self._core
        inner = core.endpoint.irecv(src, TAG_COLLECTIVE, out)
        return Request(core, inner, "recv", src, TAG_COLLECTIVE, self._deadline, self._on_timeout)

    def send(self, x: np.ndarray, peer: int) -> None:
        self.isend(x, peer).wait()

    def recv(self, peer: int, out: np.ndarray | None = None) -> np.ndarray:
        return self.irecv(peer, out).wait()

    # -- SharedComm: what shared-memory algorithms need besides messages --------------------------
    @property
    def scratch_bytes(self) -> int:
        return self._core.scratch_bytes

    def scratch(self, member: int) -> np.ndarray:
        if member == self.rank and self._core.arrivals.unreleased:
            self._settle()
        return self._core.scratch[self._ranks[member]]

    def scratch_rows(self) -> np.ndarray | None:
        span = self._fences.span if self._fences is not None else None
        if span is None:
            return None
        if self._core.arrivals.unreleased:
            self._settle()
        return self._core.scratch_table[span, : self.scratch_bytes]

    def _settle(self) -> None:
        """Before this device writes its scratch again: wait until every member of each call that
        ended in a ``release`` of which it was the owner has arrived there (stopped reading it)."""
        arrivals = self._core.arrivals
        for grp, c in arrivals.unreleased.values():
            if not arrivals.arrived(grp, c):
                self._core.endpoint.wait(lambda: arrivals.arrived(grp, c), self._deadline - time.monotonic(),
                                         self._on_timeout, arrivals.waiting_for(grp, c))
        arrivals.unreleased.clear()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return self._core.pool.array(shape, np.dtype(dtype))

    def fence(self) -> None:
        """Every member has reached this point: arrival counters in shared memory (see
        transport/arrivals.py), no messages, no bytes counted, no modelled time.  At the first fence
        of a call every member also publishes its clock in the fence's slots and reads the
        others': the entry clocks that shared-memory algorithms price themselves from; and, with
        the contract check on, its call's 64-bit digest: if any member's differs, every member
        runs ``check`` (which compares the full calls and raises)."""
        core = self._core
        first = self._entry is None
        self._carried = first
        digest = self._check[0] if first and self._check is not None else None
        if first:
            core.publish_clock()  # for the driver; the peers read it from the fence's slots
        if self._fences is None:  # a group of one
            self._entry = [core.clock.now]
            return
        arrivals, grp = core.arrivals, self._fences
        c = arrivals.arrive(grp, digest, core.clock.now if first else None)  # the last one wakes the rest
        if not arrivals.arrived(grp, c):
            core.endpoint.wait(lambda: arrivals.arrived(grp, c), self._deadline - time.monotonic(),
                               self._on_timeout, arrivals.waiting_for(grp, c))
        if first:
            self._entry = arrivals.clocks(grp, c)
        if digest is not None and arrivals.differing(grp, c, digest):
            self._check[1]()

    def release(self, owner: int) -> None:
        """The call's last fence, when after its previous one the members read only ``owner``'s
        scratch (transport/arrivals.py): every member counts it and goes on; the owner waits for
        them before it next writes its scratch (``scratch``, ``scratch_rows``)."""
        if self._fences is None:
            return
        if self._carried or self._entry is None:  # its slots' readers might not have read them yet
            raise RuntimeError("release() must follow a fence that carries nothing (not a call's first)")
        self._core.arrivals.release(self._fences, owner, owner == self.rank)

    def call_stamp(self, op: int, root: int) -> int:
        c = self._core.arrivals.next_fence(self._fences) if self._fences is not None else 1
        return call_stamp(op, root, c, self._ranks)

    @property
    def fence_payload_bytes(self) -> int:
        return self._core.arrivals.payload_bytes if self._fences is not None else 0

    def fence_exchange(self, x: np.ndarray) -> np.ndarray:
        """``fence()`` carrying ``x`` (at most ``fence_payload_bytes``) in this member's fence slot
        (transport/arrivals.py): returns every member's ``x``, flattened in C order, as rows of an
        (n, x.size) array in group order, valid until this member's next fence."""
        arrivals, grp = self._core.arrivals, self._fences
        if x.nbytes > self.fence_payload_bytes:
            raise UsageError(f"{self._core.name}: a fence carries at most {self.fence_payload_bytes} bytes "
                             f"per member, not {x.nbytes}", rank=self._core.rank)
        c = arrivals.next_fence(grp)
        mine, rows = arrivals.payload_views(grp, c, x.dtype, x.size)
        mine[...] = x.reshape(-1)
        self.fence()
        self._carried = True
        return rows if rows is not None else arrivals.payloads(grp, c, x.dtype, x.size)

    def account(self, peer: int, nbytes: int, messages: int = 1) -> None:
        self.moved += nbytes
        self._core.endpoint.account(self._ranks[peer], nbytes, messages)

    def account_all(self, nbytes: Any, messages: int = 1) -> None:
        """Owed to the traffic counters until the command ends (transport/traffic.py)."""
        if self._fences is not None:
            if type(nbytes) is int:
                self.moved += nbytes * (self.size - 1)
            else:  # one count per member, in group order: ours is not counted
                self.moved += int(nbytes.sum()) - int(nbytes[self.rank])
            self._core.endpoint.traffic.add(self._fences, nbytes, messages)

    def model_tree_all_reduce(self, nbytes: int) -> None:
        self._charge("model_tree_all_reduce", self._core.clock.tree_all_reduce, nbytes)

    def model_barrier(self) -> None:
        self._charge("model_barrier", self._core.clock.dissemination_barrier)

    def model_ring_all_reduce(self, chunk_nbytes: list[int]) -> None:
        self._charge("model_ring_all_reduce", self._core.clock.ring_all_reduce, chunk_nbytes)

    def model_tree_broadcast(self, root: int, nbytes: int) -> None:
        self._charge("model_tree_broadcast", self._core.clock.tree_broadcast, root, nbytes)

    def model_ring_all_gather(self, piece_nbytes: list[int]) -> None:
        self._charge("model_ring_all_gather", self._core.clock.ring_half, piece_nbytes, "all_gather")

    def model_ring_reduce_scatter(self, piece_nbytes: list[int]) -> None:
        self._charge("model_ring_reduce_scatter", self._core.clock.ring_half, piece_nbytes, "reduce_scatter")

    def model_pairwise_all_to_all(self, piece_nbytes: list[int]) -> None:
        self._charge("model_pairwise_all_to_all", self._core.clock.pairwise_exchange, piece_nbytes)

    def _charge(self, what: str, schedule: Callable[..., float], *args: Any) -> None:
        """Advance this device's modelled clock by ``schedule(ranks, entry clocks, *args)`` and publish it."""
        if self._entry is None:
            raise RuntimeError(f"{what} needs the entry clocks of a first fence()")
        schedule(self._ranks, self._entry, *args)
        self._core.publish_clock()
