"""How much memory this machine can still give: physical memory and the /dev/shm file system.

Pure and cheap (one read of /proc/meminfo, one ``statvfs``), importable by every layer, so that
sizes are refused *before* anything is allocated, with the figures that decide it.  Tests replace
:func:`physical_available` and :func:`shm_free` to check the refusals without allocating.
"""

from __future__ import annotations

import os

__all__ = ["physical_available", "shm_free", "SHM_DIR", "gib"]

SHM_DIR = "/dev/shm"


def physical_available() -> int:
    """Bytes of memory available to new work without swapping: Linux's ``MemAvailable`` (free
    memory plus the page cache it can drop), else free pages times the page size."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 1 << 62  # unknown: do not refuse on a guess


def shm_free(path: str = SHM_DIR) -> int:
    """Bytes free in the file system of ``path`` (a tmpfs: the shared memory segments can still
    take), from ``os.statvfs``; a huge number if it cannot be read (do not refuse on a guess)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 1 << 62
    return st.f_bavail * st.f_frsize


def gib(nbytes: float) -> str:
    """``nbytes`` for a message: "1.5 GiB", "20 MiB", "3.2 TiB", "512 B"."""
    units = (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
    for unit, scale in units:
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"
