"""What a test may not leave behind: processes, threads, file descriptors, /dev/shm segments.

Read from /proc (Linux; psutil is not a dependency), scoped to this process so that pytest-xdist
workers never see each other's resources:

* a child process of this pid, zombie or not (a zombie was never reaped), or of its forkserver
  (the devices of a ``start_method="forkserver"`` cluster are the forkserver's children);
  multiprocessing's long-lived helpers themselves (resource_tracker, forkserver) are not leaks;
* a thread that was not running before;
* an open file descriptor that was not open before, except the helpers' pipes;
* a ``virtualpar-<pid>-…`` segment in /dev/shm that was not there before, unless ``<pid>`` is
  another live process that is not our child (a concurrent test run owns it).  A segment of ours,
  of a child of ours, or of a process that has died counts: a killed driver cannot unlink;
* a ``pymp-*`` directory in the temporary directory (multiprocessing's, holding a forkserver's
  listening socket) that was not there before and that no live process serves (its socket is not
  in /proc/net/unix), except this process's own, which multiprocessing removes at exit.
  (``tmp_leftovers(hydra=True)`` also lists MPICH's ``/tmp/hydra_hwloc_xmlfile_*``, which its
  launcher removes only when a job ends normally; the snapshot leaves them out: nothing tells one
  job's from another's, and a concurrent session's aborted job would fail our test.)

Resources take a moment to go (a killed child is reaped, a cycle is collected), so :func:`leaks`
polls for up to ``settle`` seconds, collecting garbage, before it reports anything.
"""

from __future__ import annotations

import gc
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass

__all__ = ["Snapshot", "leaks", "children", "process_alive", "segments", "own_segments", "tmp_leftovers"]

_HELPERS = ("resource_tracker", "forkserver")
_SEGMENT = re.compile(r"virtualpar-(\d+)-")


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
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def process_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie has stopped running for good)."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def children(pid: int | None = None) -> dict[int, str]:
    """Child processes of ``pid`` (default: this process) and of its forkserver, minus
    multiprocessing's helpers: pid -> "state command"."""
    pid = os.getpid() if pid is None else pid
    table = {int(e): st for e in os.listdir("/proc") if e.isdigit() and (st := _stat(int(e))) is not None}
    helpers = {p for p,
               (_, parent) in table.items() if parent == pid and any(h in _cmdline(p) for h in _HELPERS)}
    parents = {pid} | {p for p in helpers if "forkserver" in _cmdline(p)}
    return {p: f"{state} {_cmdline(p)[:80] or f'pid {p}'}" for p, (state, parent) in table.items()
            if parent in parents and p not in helpers}


def _fds() -> dict[int, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the fd of the listing itself, already closed
    return out


def _helper_fds() -> set[int]:
    """Fds multiprocessing's helpers keep for the life of the process: the first test that starts
    them must not be blamed for them."""
    try:
        from multiprocessing import forkserver, resource_tracker
    except ImportError:  # pragma: no cover - always there on Linux
        return set()
    fds = (getattr(resource_tracker._resource_tracker, "_fd", None),
           getattr(forkserver._forkserver, "_forkserver_alive_fd", None))
    return {fd for fd in fds if isinstance(fd, int)}


def segments() -> set[str]:
    """Every virtualpar segment in /dev/shm (each is named ``virtualpar-<creator pid>-…``)."""
    try:
        return {e for e in os.listdir("/dev/shm") if e.startswith("virtualpar-")}
    except OSError:
        return set()


def _foreign(entry: str) -> bool:
    """Is ``entry`` a segment of another live process that is not our child (a concurrent run)?"""
    m = _SEGMENT.match(entry)
    if not m:
        return False
    owner = int(m.group(1))
    st = None if owner == os.getpid() else _stat(owner)
    return st is not None and st[0] != "Z" and st[1] != os.getpid()


def own_segments() -> set[str]:
    """The virtualpar segments in /dev/shm that are not another live process's."""
    return {e for e in segments() if not _foreign(e)}


def _served_sockets() -> set[str]:
    """Paths of the Unix sockets some live process holds (the last column of /proc/net/unix)."""
    try:
        with open("/proc/net/unix") as f:
            next(f, None)
            return {parts[7] for line in f if len(parts := line.split()) >= 8}
    except OSError:
        return set()


def tmp_leftovers(hydra: bool = False) -> set[str]:
    """Stray ``pymp-*`` directories (no live process serves a socket in them; not this process's
    own), and with ``hydra`` every ``hydra_hwloc_xmlfile_*`` file, as paths."""
    from multiprocessing import process

    own = process.current_process()._config.get("tempdir")
    found: set[str] = set()
    served: set[str] | None = None
    for tmp in {tempfile.gettempdir(), "/tmp"}:
        try:
            entries = os.listdir(tmp)
        except OSError:
            continue
        for e in entries:
            path = os.path.join(tmp, e)
            if e.startswith("hydra_hwloc_xmlfile_"):
                if hydra:
                    found.add(path)
            elif e.startswith("pymp-") and path != own:
                served = _served_sockets() if served is None else served
                try:
                    inside = {os.path.join(path, x) for x in os.listdir(path)}
                except OSError:
                    continue  # gone, or not ours to read
                if not inside & served:
                    found.add(path)
    return found


@dataclass(frozen=True)
class Snapshot:
    """The resources of this process at one moment."""

    children: dict[int, str]
    fds: dict[int, str]
    threads: dict[int, str]  # ident -> name
    segments: frozenset[str]
    tmp: frozenset[str] = frozenset()  # stray pymp-* directories (``tmp_leftovers``)

    @classmethod
    def take(cls) -> "Snapshot":
        threads = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
        return cls(children(), _fds(), threads, frozenset(own_segments()), frozenset(tmp_leftovers()))

    def new_since(self, before: "Snapshot") -> list[str]:
        """Human-readable lines, one per resource here that ``before`` did not have."""
        out = [f"process {p} ({cmd}) still running" for p,
               cmd in self.children.items() if p not in before.children]
        out += [f"thread {name!r} still running" for ident,
                name in self.threads.items() if ident not in before.threads]
        out += [f"shared memory /dev/shm/{n} not unlinked" for n in sorted(self.segments - before.segments)]
        out += [f"temporary directory {p} not removed (no live process serves its socket)"
                for p in sorted(self.tmp - before.tmp)]
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
