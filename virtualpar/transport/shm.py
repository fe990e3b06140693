"""One shared-memory segment per cluster, and direct reads of another process's memory.

Why one segment: creating a segment per message measured ~6.6x slower than copying into a warm one
(PERFORMANCE_NOTES.md), and every segment is a file in /dev/shm that can leak.  A cluster maps a
single file once, and unlinks its name the moment it is open: forked children inherit the mapping,
spawned ones receive the descriptor (see ``SharedArena``), so nothing is left in /dev/shm whenever
any process is SIGKILLed, start-up included.

Where each region sits in the segment is :class:`~virtualpar.transport.layout.Layout`'s business
(``layout.py``).

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
from typing import Any

import numpy as np

from ..errors import ResourceLimitError
from .layout import FENCE_PAYLOAD_MAX, FENCE_PLANES, RECORD_BYTES, RECORD_SLOTS, Layout

__all__ = ["Layout", "SharedArena", "FENCE_PLANES", "FENCE_PAYLOAD_MAX", "ring_control", "RECORD_BYTES",
           "RECORD_SLOTS", "read_remote", "CROSS_MEMORY", "PERMANENT_ERRORS"]

SHM_DIR = "/dev/shm"


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
