"""The tiny point-to-point protocol every collective algorithm is written over.

Collective algorithms know nothing of processes, shared memory or meshes: they see a ``Comm``,
i.e. their own position ``rank`` in a group of ``size`` members and four point-to-point calls
addressed by group position.  The runtime adapts a device and a mesh group to this protocol; tests
adapt threads and queues to it.  Messages between a pair of positions are FIFO.

Every byte an algorithm moves goes through ``send``/``isend`` and is therefore counted.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Comm", "SharedComm", "Request", "sendrecv"]


@runtime_checkable
class Request(Protocol):
    """A pending non-blocking operation; ``wait()`` completes it (an irecv returns its array)."""

    def wait(self) -> Any: ...


@runtime_checkable
class Comm(Protocol):
    """Point-to-point messaging among ``size`` group members, addressed by position ``0..size-1``.

    ``send`` may return before the peer receives (messages are buffered); ``recv`` blocks until the
    next message from ``peer`` arrives and returns a new array (or fills ``out`` and returns it).
    """

    rank: int
    size: int

    def send(self, x: np.ndarray, peer: int) -> None: ...

    def recv(self, peer: int, out: np.ndarray | None = None) -> np.ndarray: ...

    def isend(self, x: np.ndarray, peer: int) -> Request: ...

    def irecv(self, peer: int, out: np.ndarray | None = None) -> Request: ...


@runtime_checkable
class SharedComm(Comm, Protocol):
    """A ``Comm`` whose members can also read each other's memory: what shared-memory algorithms need.

    * ``scratch(member)``: a uint8 array of ``scratch_bytes`` — ``member``'s scratch region.  A
      member writes its own, and a region the algorithm hands to it in another member's between
      two fences that member is inside too (the all_reduce's reduced slice r, in the first
      member's scratch); it may read any member's between two fences that bracket the writes.
      ``scratch_rows()``: every member's region as the rows of one (n, ``scratch_bytes``) uint8
      view, in group order, when they lie at one stride in memory (a group whose ranks are evenly
      spaced), so that one numpy call reads all of them; else None.
    * ``empty(shape, dtype)``: a fresh array for a result (the runtime hands out recycled, already
      faulted-in memory: a fresh large ``np.empty`` pays a page fault per 4 KiB on first touch).
    * ``fence()``: returns once every member has called it as often as this one (a barrier that
      carries no data and costs no modelled time).  A runtime may make its check that the members
      called the same collective at an algorithm's first fence (``registry.FENCE_FIRST``), so
      before it such an algorithm writes only its own scratch and reads nothing of its peers'.
    * ``release(owner)``: the call's last fence, when after its previous fence the members read
      only member ``owner``'s scratch: a runtime may let every member go on at once and make the
      owner wait for the others only before it next writes its scratch — when it next asks for
      ``scratch(owner)`` or ``scratch_rows()``, so an algorithm takes its views before writing.
    * ``call_stamp(op, root)``: a 63-bit stamp of this call — the op's code, its root, the number
      of its first fence and the group — the same on every member of the same call and, but for a
      hash collision, different for any other (it stamps a header, so a reader can tell a header
      another call left).
    * ``fence_exchange(x)``: a fence that carries ``x`` (at most ``fence_payload_bytes``, which
      may be 0) from every member: returns an (n, x.size) array whose row j is member j's ``x``
      flattened in C order, valid until this member's next fence.
    * ``model_tree_all_reduce(nbytes)``: likewise, as the recursive-doubling all_reduce
      (``tree.all_reduce``) of ``nbytes`` would — what runs for small messages.
    * ``model_barrier()``: advance every member's modelled clock as the dissemination barrier
      (``direct.barrier``) would.
    * ``account(peer, nbytes, messages)``: record that ``nbytes`` of this member's memory were
      read by ``peer`` (the traffic counters see them as sent from this member to ``peer``);
      ``account_all(nbytes, messages)`` the same for every other member at once (``nbytes`` an
      int, or one count per member in group order, this member's ignored).
    * ``model_ring_all_reduce(chunk_nbytes)``: advance every member's modelled clock as the ring
      all_reduce over chunks of these sizes would (the algorithm real hardware runs; no message
      carries modelled time in a shared-memory algorithm); ``model_ring_all_gather(piece_nbytes)``
      as the ring all_gather of pieces of these sizes would, ``model_ring_reduce_scatter(piece_nbytes)``
      as the ring reduce_scatter, ``model_tree_broadcast(root, nbytes)`` as the binomial-tree
      broadcast of ``nbytes`` from ``root``, ``model_pairwise_all_to_all(piece_nbytes)`` as the
      pairwise exchange of pieces of these sizes (``direct.all_to_all``).
    """

    scratch_bytes: int

    def scratch(self, member: int) -> np.ndarray: ...

    def scratch_rows(self) -> np.ndarray | None: ...

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray: ...

    def fence(self) -> None: ...

    def release(self, owner: int) -> None: ...

    def call_stamp(self, op: int, root: int) -> int: ...

    fence_payload_bytes: int

    def fence_exchange(self, x: np.ndarray) -> np.ndarray: ...

    def account(self, peer: int, nbytes: int, messages: int = 1) -> None: ...

    def account_all(self, nbytes: Any, messages: int = 1) -> None: ...

    def model_ring_all_reduce(self, chunk_nbytes: list[int]) -> None: ...

    def model_barrier(self) -> None: ...

    def model_tree_all_reduce(self, nbytes: int) -> None: ...

    def model_ring_all_gather(self, piece_nbytes: list[int]) -> None: ...

    def model_ring_reduce_scatter(self, piece_nbytes: list[int]) -> None: ...

    def model_pairwise_all_to_all(self, piece_nbytes: list[int]) -> None: ...

    def model_tree_broadcast(self, root: int, nbytes: int) -> None: ...


def call_stamp(op: int, root: int, fence: int, group: tuple[int, ...]) -> int:
    """``SharedComm.call_stamp`` for any implementation: a 63-bit hash of the call.  A tuple of ints
    hashes alike in every process (only str and bytes hashes are salted per process)."""
    return hash((op, root, fence, group)) & ((1 << 63) - 1)


def sendrecv(comm: Comm, x: np.ndarray, dst: int, src: int, out: np.ndarray | None = None) -> np.ndarray:
    """Send ``x`` to ``dst`` while receiving from ``src``; returns the received array.

    Posting the receive first and the send second lets both directions progress at once, so a ring
    step never deadlocks however large the message.
    """
    incoming = comm.irecv(src, out=out)
    outgoing = comm.isend(x, dst)
    result = incoming.wait()
    outgoing.wait()
    return result
