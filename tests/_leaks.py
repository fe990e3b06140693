"""Leak checks for the ``no_leaks`` fixture, read from /proc (psutil is not a dependency).

What counts as a leak:

- a child process of this pid (or of multiprocessing's forkserver) that is still there, zombie or
  not; multiprocessing's own long-lived helpers (resource_tracker, forkserver) are ignored;
- an open file descriptor that was not open before, except the helpers' pipes;
- a thread that was not running before;
- a /dev/shm entry that was not there before (``sem.*`` entries are ignored, and so are the segments
  of clusters that belong to other live processes, e.g. a second pytest running on this machine).

Resources can take a moment to go (a killed child is reaped, a cycle is collected), so the check
polls for a short while, with ``gc.collect()``, before it fails.
"""

from __future__ import annotations

import gc
import os
import re
import threading
import time
from dataclasses import dataclass

_HELPERS = ("resource_tracker", "forkserver")
_SETTLE = 3.0
_SHM_NAME = re.compile(r"virtualpar-(\d+)-")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and parens
    return fields[0], int(fields[1])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def process_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie has stopped running for good)."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def children(pid: int | None = None) -> dict[int, str]:
    """Child processes of ``pid`` (default: this process) and of its forkserver, minus helpers."""
    pid = os.getpid() if pid is None else pid
    table: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                table[int(entry)] = st
    parents = {pid}
    helpers = {p for p, (_, pp) in table.items() if pp == pid and any(h in _cmdline(p) for h in _HELPERS)}
    parents |= {p for p in helpers if "forkserver" in _cmdline(p)}  # devices of forkserver clusters
    return {p: f"{st} {_cmdline(p)[:80]}" for p, (st, pp) in table.items() if pp in parents and p not in helpers}


def _helper_fds() -> set[int]:
    """Fds that multiprocessing's helpers keep open for the life of this process."""
    fds: set[int] = set()
    try:
        from multiprocessing import forkserver, resource_tracker

        fds.add(getattr(resource_tracker._resource_tracker, "_fd", None))
        fds.add(getattr(forkserver._forkserver, "_forkserver_alive_fd", None))
    except Exception:  # private attributes: be tolerant of other Python versions
        pass
    return {fd for fd in fds if isinstance(fd, int)}


def open_fds() -> dict[int, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the fd listdir itself used
    return out


def shm_entries() -> set[str]:
    """virtualpar's segments in /dev/shm (every segment it creates is named ``virtualpar-*``;
    other programs' segments, e.g. an MPI benchmark running meanwhile, are not ours to judge)."""
    return {e for e in os.listdir("/dev/shm") if e.startswith("virtualpar-")}


def own_shm_entries() -> set[str]:
    """/dev/shm entries, minus the segments of clusters that other live processes own."""
    return {e for e in shm_entries() if not _owned_by_someone_else(e)}


@dataclass
class Snapshot:
    children: dict[int, str]
    fds: dict[int, str]
    threads: int
    shm: set[str]

    @classmethod
    def take(cls) -> "Snapshot":
        return cls(children(), open_fds(), threading.active_count(), shm_entries())

    def leaks_since(self, before: "Snapshot") -> list[str]:
        helper = _helper_fds()
        problems = []
        new_children = {p: d for p, d in self.children.items() if p not in before.children}
        if new_children:
            problems.append(f"child processes left: {new_children}")
        new_fds = {fd: t for fd, t in self.fds.items() if fd not in helper and before.fds.get(fd) != t}
        if new_fds:
            problems.append(f"file descriptors left open: {new_fds}")
        if self.threads > before.threads:
            problems.append(f"threads: {before.threads} before, {self.threads} after: {threading.enumerate()}")
        new_shm = {e for e in self.shm - before.shm if not _owned_by_someone_else(e)}
        if new_shm:
            problems.append(f"/dev/shm entries left: {sorted(new_shm)}")
        return problems


def _owned_by_someone_else(entry: str) -> bool:
    """A cluster segment of another live process that is not ours (a concurrent test run)."""
    m = _SHM_NAME.match(entry)
    if not m:
        return False
    owner = int(m.group(1))
    if owner == os.getpid() or not process_alive(owner):
        return False
    st = _stat(owner)
    return st is not None and st[1] != os.getpid()


def wait_for_no_leaks(before: Snapshot, settle: float = _SETTLE) -> list[str]:
    """Poll until nothing leaked since ``before``; the problems still there after ``settle`` s."""
    deadline = time.monotonic() + settle
    while True:
        problems = Snapshot.take().leaks_since(before)
        if not problems or time.monotonic() > deadline:
            return problems
        gc.collect()
        time.sleep(0.05)


