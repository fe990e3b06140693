"""Warm receive buffers: arrays the transport allocates come back when the user drops them.

Receives without ``out=`` and the results of shared-memory collectives are built on buffers from
this pool, so a loop that receives the same sizes over and over lands in memory that is already
faulted in (a fresh large ``np.empty`` pays a page fault per 4 KiB on first touch).  A *reserve*,
faulted in by the cluster's warm-up, serves the first request of a size the pool has no buffer
for, so that the first call of a size lands in warm memory too.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

__all__ = ["BufferPool", "mid_page"]

_PAGE = 4096


def mid_page(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` that starts half a page (2 KiB) past a 4 KiB boundary.

    Why: a copy runs ~3x slower when its destination starts a few bytes *after* its source modulo
    4 KiB and the source is not in cache (each load waits on a recent store to an address 4 KiB
    away, "4K aliasing") — and a plain ``np.empty`` of 64 KiB or more starts 16 bytes past a page
    (glibc's header on an ``mmap``-ed chunk), while the scratch regions it is filled from are page
    aligned.  Measured at 16 devices, the 512 KiB all_reduce's copy out of its peers' scratch:
    destination at page + 16: ~340 µs; + 0 or + 2048: ~110 µs; + 64: ~130 µs.  Half a page keeps
    the same distance from page-aligned sources and from the page + 16 arrays a user combines the
    result with."""
    raw = np.empty(nbytes + _PAGE, np.uint8)
    skip = (_PAGE // 2 - raw.ctypes.data) % _PAGE
    return raw[skip : skip + nbytes]


class BufferPool:
    """Receive buffers that come back when the arrays built on them die, so the next receive of the
    same size lands in memory that is already faulted in.

    Why: a fresh 32 MiB ``np.empty`` costs its page faults and zeroing during the copy into it
    (warm copy ~15 GB/s here, into fresh memory ~7–9 GB/s, and ~0.4 GB/s when the VM has to back
    never-touched guest memory), and collective loops receive the same sizes over and over.

    ``array(shape, dtype)`` returns an ordinary writable ndarray whose base is a memoryview of a
    pooled raw buffer; a ``weakref.finalize`` on that array returns the raw buffer when the array
    and every view of it are gone (numpy views keep their base array alive, and the base chain
    stops at the memoryview, so no view can outlive the lease).  At most ``max_bytes`` are kept
    idle, at most ``per_size`` buffers of one size; arrays under ``min_bytes`` are plain ``np.empty``.

    The reserve (:meth:`reserve`) is one warm buffer, a prefix of which is lent to a request of any
    size up to its own that no idle buffer fits, one lease at a time.  Why: a fresh buffer's page
    faults were half of a cluster's first 512 KiB all_reduce — at 16 devices on 2 cores 130 faults,
    ~0.5 ms of CPU per device, the call 9–11 ms against 5 ms with the result's buffer warm (later
    calls of that size reuse the first one's buffer).
    """

    def __init__(self, max_bytes: int = 256 << 20, per_size: int = 2, min_bytes: int = 64 << 10) -> None:
        self.max_bytes = max_bytes
        self.per_size = per_size
        self.min_bytes = min_bytes
        self._idle: dict[int, list[np.ndarray]] = {}
        self.idle_bytes = 0
        self._reserve: np.ndarray | None = None
        self._lent: np.ndarray | None = None  # the reserve's prefix now in use, if any

    def reserve(self, nbytes: int) -> None:
        """Keep a buffer of ``nbytes``, its pages faulted in now, for requests of a size no idle
        buffer fits (none below ``min_bytes``: those never come to the pool).  A lease of the
        previous reserve still out comes back as an ordinary buffer (the warm-up sets the reserve
        once, before any lease)."""
        self._reserve = self._lent = None
        if nbytes >= self.min_bytes:
            self._reserve = mid_page(nbytes)
            self._reserve.fill(0)  # every page faulted in here, not in a collective

    @property
    def reserve_bytes(self) -> int:
        return 0 if self._reserve is None else self._reserve.size

    def raw(self, nbytes: int) -> np.ndarray:
        """A uint8 buffer of ``nbytes`` (warm if one is idle); hand it back with :meth:`give_back`."""
        free = self._idle.get(nbytes)
        if free:
            self.idle_bytes -= nbytes
            return free.pop()
        spare = self._reserve
        if spare is not None and self._lent is None and nbytes <= spare.size:
            self._lent = spare[:nbytes]
            return self._lent
        return mid_page(nbytes)

    def give_back(self, raw: np.ndarray) -> None:
        if raw is self._lent:
            self._lent = None  # the reserve is free again
            return
        free = self._idle.setdefault(raw.size, [])
        if len(free) < self.per_size and self.idle_bytes + raw.size <= self.max_bytes:
            free.append(raw)
            self.idle_bytes += raw.size

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype)
        raw = self.raw(nbytes)
        lease = np.frombuffer(memoryview(raw), dtype=dtype)
        weakref.finalize(lease, self.give_back, raw)
        return lease.reshape(shape)

    def clear(self) -> None:
        self._idle.clear()
        self.idle_bytes = 0
