"""What a test may not leave behind: child processes, /dev/shm segments of this process, fds.

Read from /proc (Linux), scoped to this process, so that pytest-xdist workers never see each
other's resources: children are this pid's (multiprocessing's resource_tracker and forkserver
helpers excepted), segments are those named ``virtualpar-<this pid>-``, fds are this process's.
Multiprocessing's own helpers and their fds live as long as the process and are not leaks.
Resources take a moment to go (a killed child is reaped, a cycle is collected), so :func:`leaks`
polls for up to ``settle`` seconds, collecting garbage, before it reports anything.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass

__all__ = ["Snapshot", "leaks"]

_HELPERS = ("resource_tracker", "forkserver")


def _children(pid: int) -> dict[int, str]:
    """Live (non-zombie are still counted: a zombie was never reaped) children of ``pid``, minus helpers."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if int(fields[1]) == pid and not any(h in cmd for h in _HELPERS):
            out[int(entry)] = cmd.strip() or f"pid {entry}"
    return out


def _fds() -> dict[int, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the fd of the listing itself, already closed
    return out


def _helper_fds() -> set[int]:
    """Fds multiprocessing's helpers (resource tracker, forkserver) keep for the life of the process:
    the first test that starts them must not be blamed for them."""
    fds: set[int] = set()
    try:
        from multiprocessing import forkserver, resource_tracker
    except ImportError:  # pragma: no cover - always there on Linux
        return fds
    for fd in (getattr(resource_tracker._resource_tracker, "_fd", None),
               getattr(forkserver._forkserver, "_forkserver_alive_fd", None)):
        if isinstance(fd, int):
            fds.add(fd)
    return fds


def _segments(pid: int) -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"virtualpar-{pid}-")}
    except OSError:
        return set()


@dataclass(frozen=True)
class Snapshot:
    """The resources of this process at one moment."""

    children: dict[int, str]
    fds: dict[int, str]
    segments: frozenset[str]

    @classmethod
    def take(cls) -> "Snapshot":
        pid = os.getpid()
        return cls(_children(pid), _fds(), frozenset(_segments(pid)))

    def new_since(self, before: "Snapshot") -> list[str]:
        """Human-readable lines, one per resource here that ``before`` did not have."""
        out = [f"process {p} ({cmd}) still running" for p, cmd in self.children.items() if p not in before.children]
        out += [f"shared memory /dev/shm/{n} not unlinked" for n in sorted(self.segments - before.segments)]
        helpers = _helper_fds()
        out += [f"file descriptor {fd} -> {target} left open" for fd, target in sorted(self.fds.items())
                if before.fds.get(fd) != target and fd not in helpers and not target.startswith("/proc/")]
        return out


def leaks(before: Snapshot, settle: float = 2.0) -> list[str]:
    """What was opened since ``before`` and is still there after up to ``settle`` seconds."""
    deadline = time.monotonic() + settle
    while True:
        gc.collect()
        found = Snapshot.take().new_since(before)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.05)
