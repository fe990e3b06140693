"""Where everything sits in a cluster's shared-memory segment (:mod:`virtualpar.transport.shm`).

Layout (all offsets 64-byte aligned so that counters written by different processes never share a
cache line)::

    [control: abort word | clock per endpoint]
    [counters: bytes, messages, control bytes — one int64 matrix each, endpoint x endpoint]
    [arrival words (fences of shared-memory collectives): per group kind and device, see Layout]
    [flight recorders: one per device]
    [ring control: a producer line (head, want-room flag) and a consumer line (tail, seven
     rendezvous answers) per channel]
    [ring data: one ring of ``ring_bytes`` per directed channel src != dst]
    [scratch: ``scratch_bytes`` per device, page aligned, for shared-memory collectives]
    [fence payloads: a small slot per (fence parity, group kind, device), see Layout]

Endpoints are the devices ``0..n-1`` and the host (the driver) at index ``n``.  Control lines exist
for every (src, dst) pair, the diagonal included, so the driver can zero all heads and tails with
one strided view; ring *data* exists only for src != dst (an endpoint never sends to itself), which
saves ``E * ring_bytes`` of the segment.

A device's scratch region is written only by that device and read by its peers between fences
(see ``collectives/shm.py``); it is how an all_reduce reduces straight out of its peers' memory.
Pages of the segment are backed only when first touched, so an unused scratch costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

__all__ = ["Layout", "FENCE_PLANES", "FENCE_PAYLOAD_MAX", "FENCE_PAYLOAD_BUDGET", "RECORD_BYTES",
           "RECORD_SLOTS"]

_LINE = 64
_PAGE = 4096
RECORD_SLOTS = 64  # flight-recorder entries kept per device
RECORD_BYTES = 256  # bytes per flight-recorder entry

FENCE_PLANES = 7  # arrival words per (group kind, device), see transport/arrivals.py
# bytes a member's fence may carry (the one-fence all_reduce, collectives/shm.py) ...
FENCE_PAYLOAD_MAX = 8 << 10
FENCE_PAYLOAD_BUDGET = 16 << 20  # ... and the bytes of all the slots together, at most, whatever the mesh


def _align(n: int, to: int = _LINE) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class Layout:
    """Byte offsets of every region for ``devices`` devices plus the host (each worked out once:
    a device's first shared-memory collective at 128 devices asked for 128 scratch offsets)."""

    devices: int
    ring_bytes: int
    scratch_bytes: int = 0
    fence_kinds: int = 1  # kinds of groups that fence: one per set of the mesh's axes longer than 1

    @cached_property
    def endpoints(self) -> int:
        return self.devices + 1

    @cached_property
    def host(self) -> int:
        return self.devices

    # -- control ----------------------------------------------------------------------------
    @cached_property
    def abort_offset(self) -> int:
        return 0  # int64: 0 = running, else 1 + rank of the device that failed first (or host)

    @cached_property
    def clocks_offset(self) -> int:
        return _LINE  # float64 per endpoint: its modelled clock, for the driver to read

    @cached_property
    def counters_offset(self) -> int:
        return _align(self.clocks_offset + 8 * self.endpoints)

    @cached_property
    def counters_bytes(self) -> int:
        return _align(3 * 8 * self.endpoints * self.endpoints)

    @cached_property
    def arrivals_offset(self) -> int:
        """The arrival words of fences: ``FENCE_PLANES`` planes of 8-byte words, each ``fence_kinds``
        x ``devices`` (what each plane holds: ``COUNT`` ... ``STAMP`` in transport/arrivals.py)."""
        return self.counters_offset + self.counters_bytes

    @cached_property
    def arrivals_bytes(self) -> int:
        return _align(FENCE_PLANES * 8 * self.fence_kinds * self.devices)

    @cached_property
    def recorders_offset(self) -> int:
        return self.arrivals_offset + self.arrivals_bytes

    def recorder_offset(self, rank: int) -> int:
        return self.recorders_offset + rank * (_LINE + RECORD_SLOTS * RECORD_BYTES)

    @cached_property
    def ring_ctrl_offset(self) -> int:
        return self.recorder_offset(self.devices)

    def channel_index(self, src: int, dst: int) -> int:
        return src * self.endpoints + dst

    def head_offset(self, src: int, dst: int) -> int:
        return self.ring_ctrl_offset + self.channel_index(src, dst) * 2 * _LINE

    def tail_offset(self, src: int, dst: int) -> int:
        return self.head_offset(src, dst) + _LINE

    def want_offset(self, src: int, dst: int) -> int:
        """uint64 in the producer's line: 1 while it waits for room (see want_room.py)."""
        return self.head_offset(src, dst) + 8

    def reply_offset(self, src: int, dst: int) -> int:
        """The consumer's line after its tail: seven uint64, its answers to the rendezvous offers in
        each of the channel's offer slots (see rendezvous.py)."""
        return self.tail_offset(src, dst) + 8

    @cached_property
    def ring_data_offset(self) -> int:
        return self.ring_ctrl_offset + self.endpoints * self.endpoints * 2 * _LINE

    def ring_offset(self, src: int, dst: int) -> int:
        if src == dst:
            raise ValueError(f"endpoint {src} has no ring to itself")
        compact = src * (self.endpoints - 1) + (dst if dst < src else dst - 1)
        return self.ring_data_offset + compact * self.ring_bytes

    @cached_property
    def scratch_data_offset(self) -> int:
        return _align(self.ring_data_offset + self.endpoints * (self.endpoints - 1) * self.ring_bytes, _PAGE)

    @cached_property
    def scratch_stride(self) -> int:
        return _align(self.scratch_bytes, _PAGE)

    def scratch_offset(self, rank: int) -> int:
        """Byte offset of device ``rank``'s scratch region (``scratch_bytes`` long, page aligned)."""
        if not 0 <= rank < self.devices:
            raise ValueError(f"device {rank} has no scratch region; devices are 0..{self.devices - 1}")
        return self.scratch_data_offset + rank * self.scratch_stride

    @cached_property
    def fence_payload_bytes(self) -> int:
        """Bytes a member's fence can carry: its slot in each of 2 parities x ``fence_kinds`` x
        ``devices`` (the parity of the fence's number, as for the digest words; pages are backed
        only once written, so slots of unused kinds cost nothing)."""
        per_slot = FENCE_PAYLOAD_BUDGET // (2 * self.fence_kinds * self.devices)
        return min(FENCE_PAYLOAD_MAX, per_slot // _LINE * _LINE)

    @cached_property
    def payloads_offset(self) -> int:
        return self.scratch_data_offset + self.devices * self.scratch_stride

    @cached_property
    def total_bytes(self) -> int:
        return self.payloads_offset + 2 * self.fence_kinds * self.devices * self.fence_payload_bytes
