"""One shared-memory segment per cluster, and the layout carved out of it.

Why one segment: creating a segment per message measured ~6.6x slower than copying into a warm one
(PERFORMANCE_NOTES.md), and every segment is a file in /dev/shm that can leak.  A cluster maps a
single file once; the driver unlinks it as soon as every device has mapped it (immediately for
``fork``, where children inherit the mapping; after the start-up handshake for ``spawn`` and
``forkserver``), so nothing is left in /dev/shm even if every process is later SIGKILLed.

Layout (all offsets 64-byte aligned so that counters written by different processes never share a
cache line)::

    [control: abort word | clock per endpoint]
    [counters: bytes, messages, control bytes — one int64 matrix each, endpoint x endpoint]
    [flight recorders: one per device]
    [ring control: head and tail per directed channel, each on its own cache line]
    [ring data: one ring of ``ring_bytes`` per directed channel]

Endpoints are the devices ``0..n-1`` and the host (the driver) at index ``n``.
"""

from __future__ import annotations

import mmap
import os
import secrets
from dataclasses import dataclass

import numpy as np

__all__ = ["Layout", "SharedArena", "RECORD_BYTES", "RECORD_SLOTS"]

_LINE = 64
RECORD_SLOTS = 64  # flight-recorder entries kept per device
RECORD_BYTES = 256  # bytes per flight-recorder entry


def _align(n: int, to: int = _LINE) -> int:
    return (n + to - 1) // to * to


@dataclass(frozen=True)
class Layout:
    """Byte offsets of every region for ``devices`` devices plus the host."""

    devices: int
    ring_bytes: int

    @property
    def endpoints(self) -> int:
        return self.devices + 1

    @property
    def host(self) -> int:
        return self.devices

    # -- control ----------------------------------------------------------------------------
    @property
    def abort_offset(self) -> int:
        return 0  # int64: 0 = running, else 1 + rank of the device that failed first (or host)

    @property
    def clocks_offset(self) -> int:
        return _LINE  # float64 per endpoint: its modelled clock, for the driver to read

    @property
    def counters_offset(self) -> int:
        return _align(self.clocks_offset + 8 * self.endpoints)

    @property
    def counters_bytes(self) -> int:
        return _align(3 * 8 * self.endpoints * self.endpoints)

    @property
    def recorders_offset(self) -> int:
        return self.counters_offset + self.counters_bytes

    def recorder_offset(self, rank: int) -> int:
        return self.recorders_offset + rank * (_LINE + RECORD_SLOTS * RECORD_BYTES)

    @property
    def ring_ctrl_offset(self) -> int:
        return self.recorder_offset(self.devices)

    def channel_index(self, src: int, dst: int) -> int:
        return src * self.endpoints + dst

    def head_offset(self, src: int, dst: int) -> int:
        return self.ring_ctrl_offset + self.channel_index(src, dst) * 2 * _LINE

    def tail_offset(self, src: int, dst: int) -> int:
        return self.head_offset(src, dst) + _LINE

    @property
    def ring_data_offset(self) -> int:
        return self.ring_ctrl_offset + self.endpoints * self.endpoints * 2 * _LINE

    def ring_offset(self, src: int, dst: int) -> int:
        return self.ring_data_offset + self.channel_index(src, dst) * self.ring_bytes

    @property
    def total_bytes(self) -> int:
        return self.ring_data_offset + self.endpoints * self.endpoints * self.ring_bytes


class SharedArena:
    """A file in /dev/shm mapped into every process of one cluster.

    ``SharedArena.create(nbytes)`` in the driver; ``SharedArena.attach(name, nbytes)`` in a spawned
    child (a forked child simply inherits the mapping).  ``u8`` is a numpy uint8 view of the whole
    segment.  ``unlink()`` removes the name; the memory lives on until the last mapping goes.
    """

    def __init__(self, name: str, nbytes: int, fd: int, create: bool) -> None:
        self.name = name
        self.nbytes = nbytes
        try:
            if create:
                os.ftruncate(fd, nbytes)
            self._mmap = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.u8 = np.frombuffer(self._mmap, dtype=np.uint8)
        self._linked = create

    @classmethod
    def create(cls, nbytes: int, prefix: str = "virtualpar") -> "SharedArena":
        name = f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(os.path.join("/dev/shm", name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        return cls(name, nbytes, fd, create=True)

    @classmethod
    def attach(cls, name: str, nbytes: int) -> "SharedArena":
        fd = os.open(os.path.join("/dev/shm", name), os.O_RDWR)
        arena = cls(name, nbytes, fd, create=False)
        arena._linked = False  # only the creator unlinks
        return arena

    def view(self, offset: int, count: int, dtype: type = np.uint8) -> np.ndarray:
        """A numpy view of ``count`` items of ``dtype`` at byte ``offset``."""
        return np.frombuffer(self._mmap, dtype=dtype, count=count, offset=offset)

    def unlink(self) -> None:
        """Remove the /dev/shm name (idempotent); mapped memory stays valid."""
        if self._linked:
            self._linked = False
            try:
                os.unlink(os.path.join("/dev/shm", self.name))
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Unlink and drop the mapping (views still alive keep it mapped until collected)."""
        self.unlink()
        self.u8 = None  # type: ignore[assignment]
        try:
            self._mmap.close()
        except (BufferError, ValueError):
            pass  # numpy views are still alive; the mapping goes when they do
