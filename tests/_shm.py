"""Which /dev/shm segments a test left behind (an MPICH job's, or a run's), for tests that start
their own processes and cannot use ``virtualpar.testing.leaks`` (which knows only virtualpar's)."""

from __future__ import annotations

import os

SHM = "/dev/shm"


def left_behind(before: set[str]) -> list[str]:
    """Segments that were not in ``before`` and that no live process maps: one still mapped belongs
    to a job that is running (another test session's ``mpiexec`` on a shared machine), not to us."""
    new = set(os.listdir(SHM)) - before
    if not new:
        return []
    mapped: set[str] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                text = f.read()
        except OSError:  # gone, or not ours to read
            continue
        mapped.update(name for name in new if f"{SHM}/{name}" in text)
    return sorted(new - mapped)
