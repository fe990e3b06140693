"""``VirtualChannel``: a single-producer, single-consumer byte ring in shared memory.

One channel per directed endpoint pair (device->device, host->device, device->host).  The producer
owns ``head`` (bytes ever written), the consumer owns ``tail`` (bytes ever read); each lives on its
own cache line and is written by exactly one process, so no lock is needed: ``head - tail`` bytes
are readable, ``capacity - (head - tail)`` are writable.  A writer copies its bytes first and
publishes the new ``head`` second; x86-64's total store order makes the bytes visible no later than
the counter (the semaphore post that follows is a full barrier on every architecture).

Messages are framed as ``[header][payload][pad to 8]``.  The 64-byte header (then one int64 per
dimension) carries everything a receiver and the cost model need: kind, tag, payload bytes, the
sender's modelled departure time, the message number on this channel, and dtype/shape::

    hdr_len u32 | kind u32 | tag i64 | nbytes u64 | stamp f64 | seq u64 | ndim u32 | pad u32 | dtype 16s | shape i64*ndim

A header is always written whole (the producer waits for room), so a consumer that sees any
unread byte at a message boundary can parse the full header at once.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from .shm import Layout, SharedArena

__all__ = ["VirtualChannel", "Header", "KIND_ARRAY", "KIND_PICKLE", "FLAG_CONTROL", "pack_header"]

KIND_ARRAY = 1  # raw bytes of a C-contiguous numpy array
KIND_PICKLE = 2  # a pickled Python object
FLAG_CONTROL = 0x100  # runtime control traffic: not counted as data, costs no modelled time

_FIXED = struct.Struct("<IIqQdQII16s")
assert _FIXED.size == 64


class Header(NamedTuple):
    kind: int
    tag: int
    nbytes: int
    stamp: float
    seq: int
    dtype: str
    shape: tuple[int, ...]
    length: int  # header bytes, incl. shape

    @property
    def control(self) -> bool:
        return bool(self.kind & FLAG_CONTROL)

    @property
    def padded(self) -> int:
        return (self.nbytes + 7) & ~7


def pack_header(kind: int, tag: int, nbytes: int, stamp: float, seq: int, dtype: str, shape: tuple[int, ...]) -> bytes:
    ndim = len(shape)
    length = 64 + 8 * ndim
    fixed = _FIXED.pack(length, kind, tag, nbytes, stamp, seq, ndim, 0, dtype.encode("ascii"))
    return fixed + struct.pack(f"<{ndim}q", *shape) if ndim else fixed


class VirtualChannel:
    """The ring from endpoint ``src`` to endpoint ``dst`` inside a cluster's shared arena."""

    __slots__ = ("src", "dst", "capacity", "_head", "_tail", "_data", "_local")

    def __init__(self, arena: SharedArena, layout: Layout, src: int, dst: int) -> None:
        self.src = src
        self.dst = dst
        self.capacity = layout.ring_bytes
        self._head = arena.view(layout.head_offset(src, dst), 1, np.uint64)
        self._tail = arena.view(layout.tail_offset(src, dst), 1, np.uint64)
        self._data = arena.view(layout.ring_offset(src, dst), layout.ring_bytes)
        self._local = 0  # this side's own counter (head for the producer, tail for the consumer)

    def __repr__(self) -> str:
        return f"VirtualChannel({self.src}->{self.dst}, {self.capacity} bytes)"

    # -- producer side ------------------------------------------------------------------------
    def writable(self) -> int:
        return self.capacity - (self._local - int(self._tail[0]))

    def write(self, src: np.ndarray, n: int) -> None:
        """Copy the first ``n`` bytes of the uint8 array ``src`` in and publish them."""
        pos = self._local % self.capacity
        first = min(n, self.capacity - pos)
        self._data[pos : pos + first] = src[:first]
        if n > first:
            self._data[: n - first] = src[first:n]
        self._local += n
        self._head[0] = self._local

    def skip_write(self, n: int) -> None:
        """Publish ``n`` padding bytes without writing them."""
        self._local += n
        self._head[0] = self._local

    # -- consumer side ------------------------------------------------------------------------
    def readable(self) -> int:
        return int(self._head[0]) - self._local

    def read_into(self, dst: np.ndarray, n: int) -> None:
        """Copy ``n`` unread bytes into the uint8 array ``dst`` and release them to the producer."""
        pos = self._local % self.capacity
        first = min(n, self.capacity - pos)
        dst[:first] = self._data[pos : pos + first]
        if n > first:
            dst[first:n] = self._data[: n - first]
        self.skip_read(n)

    def skip_read(self, n: int) -> None:
        self._local += n
        self._tail[0] = self._local

    def read_header(self) -> Header:
        """Parse (and consume) the header at the read position; the caller checked ``readable() > 0``."""
        buf = np.empty(64, np.uint8)
        self.read_into(buf, 64)
        length, kind, tag, nbytes, stamp, seq, ndim, _, dtype = _FIXED.unpack(buf.tobytes())
        shape: tuple[int, ...] = ()
        if ndim:
            rest = np.empty(8 * ndim, np.uint8)
            self.read_into(rest, 8 * ndim)
            shape = struct.unpack(f"<{ndim}q", rest.tobytes())
        return Header(kind, tag, nbytes, stamp, seq, dtype.rstrip(b"\0").decode("ascii"), shape, length)

    # -- both -----------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything in flight (only while neither side is using the channel)."""
        self._local = 0
        self._head[0] = 0
        self._tail[0] = 0

    def sync_local(self, producer: bool) -> None:
        """Re-read this side's counter from shared memory (after the driver reset the ring)."""
        self._local = int(self._head[0] if producer else self._tail[0])
