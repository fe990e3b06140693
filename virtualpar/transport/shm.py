"""One shared-memory segment per cluster, and the layout carved out of it.

Why one segment: creating a segment per message measured ~6.6x slower than copying into a warm one
(PERFORMANCE_NOTES.md), and every segment is a file in /dev/shm that can leak.  A cluster maps a
single file once, and unlinks its name the moment it is open: forked children inherit the mapping,
spawned ones receive the descriptor (see ``SharedArena``), so nothing is left in /dev/shm whenever
any process is SIGKILLed, start-up included.

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

Large messages do not cross the arena at all: :func:`read_remote` copies them straight out of the
sender's own memory with Linux's ``process_vm_readv`` (cross-memory attach, the single-copy path
MPICH and Open MPI use for large shared-memory messages); see ``rendezvous.py`` for the protocol.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import secrets
import sys
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..errors import ResourceLimitError

__all__ = ["Layout", "SharedArena", "FENCE_PLANES", "FENCE_PAYLOAD_MAX", "ring_control", "RECORD_BYTES",
           "RECORD_SLOTS", "read_remote", "CROSS_MEMORY", "PERMANENT_ERRORS"]

SHM_DIR = "/dev/shm"
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


class SharedArena:
    """A file in /dev/shm mapped into every process of one cluster, its name removed at once.

    ``SharedArena.create(nbytes)`` in the driver.  The name is unlinked the moment the file is
    open, before it is even sized: a process killed at any later moment leaves nothing in /dev/shm
    (the memory goes with the last mapping or descriptor).  A forked child inherits the mapping; a
    spawned one receives the open descriptor with its other handles (pickling a ``SharedArena``
    for a child being started sends the descriptor, as ``multiprocessing`` does with its own heap)
    and maps it again.  The creator keeps the descriptor until :meth:`shared` (every child has it).
    ``u8`` is a numpy uint8 view of the whole segment.
    """

    def __init__(self, name: str, nbytes: int, fd: int, keep_fd: bool = False) -> None:
        """Map ``nbytes`` of the open file ``fd`` (closed here unless ``keep_fd``)."""
        self.name = name
        self.nbytes = nbytes
        self._fd = -1
        try:
            self._mmap = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        if keep_fd:
            self._fd = fd
        else:
            os.close(fd)
        self.u8 = np.frombuffer(self._mmap, dtype=np.uint8)

    @classmethod
    def create(cls, nbytes: int, prefix: str = "virtualpar") -> "SharedArena":
        """A new zeroed segment of ``nbytes``; ``ResourceLimitError`` (with the size asked and the
        space /dev/shm has) if it cannot be sized or mapped, and then nothing is left behind."""
        name = f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.unlink(path)  # nobody needs the name: children inherit the mapping or receive the fd
            os.ftruncate(fd, nbytes)
        except BaseException as exc:
            os.close(fd)
            _unlink_quietly(path)
            if isinstance(exc, OSError):
                raise _no_room(nbytes, exc) from exc
            raise
        try:
            return cls(name, nbytes, fd, keep_fd=True)  # closes fd if the mapping fails
        except OSError as exc:
            raise _no_room(nbytes, exc) from exc

    def __reduce__(self):
        """For a child being started (spawn, forkserver): send the descriptor, not the name."""
        if self._fd < 0:
            raise TypeError(f"SharedArena {self.name} can be sent to a child only while its creator holds "
                            "the descriptor (during start-up)")
        from multiprocessing.reduction import DupFd

        return (_rebuild, (self.name, self.nbytes, DupFd(self._fd)))

    def shared(self) -> None:
        """Every child has the segment now: close the creator's descriptor (the mapping stays)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def view(self, offset: int, count: int, dtype: type = np.uint8) -> np.ndarray:
        """A numpy view of ``count`` items of ``dtype`` at byte ``offset``."""
        return np.frombuffer(self._mmap, dtype=dtype, count=count, offset=offset)

    def bytes_at(self, offset: int, nbytes: int) -> memoryview:
        """A byte memoryview of ``nbytes`` at ``offset`` (slicing and copying it costs far less than
        numpy)."""
        return memoryview(self._mmap)[offset : offset + nbytes]

    def word_at(self, offset: int) -> memoryview:
        """The aligned uint64 at ``offset`` as a one-item memoryview: ``w[0]`` reads, ``w[0] = v`` writes.

        An aligned 8-byte load or store is a single instruction on x86-64 and AArch64, so the
        other side never sees a torn value.
        """
        if offset % 8:
            raise ValueError(f"word offset {offset} is not 8-byte aligned")
        return memoryview(self._mmap)[offset : offset + 8].cast("Q")

    def unlink(self) -> None:
        """Nothing to do: the name was removed when the segment was created (kept for callers)."""

    def close(self) -> None:
        """Drop the descriptor and the mapping (views still alive keep it mapped until collected)."""
        self.shared()
        self.u8 = None  # type: ignore[assignment]
        try:
            self._mmap.close()
        except (BufferError, ValueError):
            pass  # numpy views are still alive; the mapping goes when they do


def _rebuild(name: str, nbytes: int, dupfd: Any) -> SharedArena:
    return SharedArena(name, nbytes, dupfd.detach())


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _no_room(nbytes: int, exc: OSError) -> ResourceLimitError:
    """The error of a segment that could not be sized or mapped: what was asked, what there is."""
    from ..sysmem import gib, physical_available, shm_free

    free, avail = shm_free(), physical_available()
    return ResourceLimitError(
        f"cannot allocate a shared-memory segment of {gib(nbytes)} ({nbytes} bytes): {exc.strerror or exc}; "
        f"{SHM_DIR} has {gib(free)} free and this machine {gib(avail)} of memory available (a mapping "
        "also needs that much address space); use fewer devices or smaller ring_bytes / scratch_bytes",
        requested=nbytes, shm_free=free, available=avail, errno=exc.errno)


def ring_control(arena: SharedArena, layout: Layout) -> np.ndarray:
    """Every channel's two control lines as one uint64 array ``[src, dst, word]``: word 0 is the
    head, 1 the want-room flag, 8 the tail, 9-15 the answers to rendezvous offers (see
    ``Layout.head_offset``)."""
    E = layout.endpoints
    return arena.view(layout.ring_ctrl_offset, E * E * 16, np.uint64).reshape(E, E, 16)


# -- cross-memory attach ---------------------------------------------------------------------------
class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load_process_vm_readv():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                   ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    return fn


_READV = _load_process_vm_readv()
CROSS_MEMORY = _READV is not None  # False: every message goes through the rings
PERMANENT_ERRORS = (errno.EPERM, errno.EACCES, errno.ENOSYS)  # no use trying again
_LOCAL, _REMOTE = _IoVec(), _IoVec()


def read_remote(pid: int, addr: int, dst: np.ndarray, nbytes: int) -> int:
    """Copy ``nbytes`` from address ``addr`` of process ``pid`` into the C-contiguous array ``dst``.

    One kernel copy, no intermediate buffer: ``process_vm_readv(2)``.  Returns 0 on success, else
    the errno (``ENOSYS`` when there is no such call here): EPERM when a ptrace policy forbids it
    (Yama scope >= 2, a seccomp filter, a non-dumpable sender), ESRCH when the sender is gone.  The
    caller falls back to the rings.  Not thread-safe (one static pair of iovecs).
    """
    if _READV is None:
        return errno.ENOSYS
    base = dst.ctypes.data
    done = 0
    while done < nbytes:
        _LOCAL.base, _LOCAL.len = base + done, nbytes - done
        _REMOTE.base, _REMOTE.len = addr + done, nbytes - done
        got = _READV(pid, _LOCAL, 1, _REMOTE, 1, 0)
        if got <= 0:
            return ctypes.get_errno() or errno.EIO
        done += got
    return 0
