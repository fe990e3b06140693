"""Names in the file system that a cluster's start-up makes, and who removes them if the driver dies.

A driver can be SIGKILLed at any moment; whatever it named must then be removed by a process that
survives it.  Three kinds of names exist:

- the shared arena: none at all (transport/shm.py unlinks it the moment it is open);
- the doorbells' POSIX semaphores (``/dev/shm/sem.mp-*``), named only under ``spawn`` and
  ``forkserver`` so that the devices can open them: :func:`unlink_semaphores` removes the names once
  every device has opened them (the start-up handshake).  Before that, multiprocessing's resource
  tracker holds them: it is a separate process that removes every semaphore still registered once
  the driver and its children are gone;
- the forkserver's listening socket, in a ``/tmp/pymp-*`` directory that only the driver's exit
  handlers remove.  Imported into the forkserver as its first preload module, this module has the
  forkserver remove that directory when it exits, which it does as soon as the driver dies.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import sys
from typing import Any

__all__ = ["unlink_semaphores", "forkserver_listener_dir"]


def unlink_semaphores(bells: list[Any]) -> None:
    """Remove the names of ``bells`` (multiprocessing semaphores) now; they keep working for every
    process that has them open.  Runs each one's own clean-up (``sem_unlink``, then unregister from
    the resource tracker) through the finalizer multiprocessing registered for it, so that it does
    not run again later; a semaphore without a name (``fork``) has nothing to remove."""
    from multiprocessing import util
    from multiprocessing.synchronize import SemLock

    names = {b._semlock.name for b in bells if getattr(b._semlock, "name", None)}
    if not names:
        return
    for fin in list(util._finalizer_registry.values()):
        args = getattr(fin, "_args", None)
        if getattr(fin, "_callback", None) is SemLock._cleanup and args and args[0] in names:
            names.discard(args[0])
            try:
                fin()
            except OSError:
                pass  # already gone
    for name in names:  # no finalizer found (another Python's internals): remove the name anyway
        try:
            from _multiprocessing import sem_unlink

            sem_unlink(name)
        except (OSError, ImportError):
            pass


def forkserver_listener_dir() -> str | None:
    """In a forkserver process: the ``pymp-*`` directory holding the socket it listens on, else None.

    Found from the process's open descriptors (a listening Unix socket named ``listener-*`` in a
    ``pymp-*`` directory), not from multiprocessing's internals."""
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return None
    for fd in fds:
        try:
            dup = os.dup(fd)
        except OSError:
            continue  # the descriptor of the listing itself, closed by now
        try:
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)  # not a socket: socket() leaves the descriptor open
            continue
        with sock:
            if sock.family != socket.AF_UNIX:
                continue
            try:
                path = sock.getsockname()
            except OSError:
                continue
        if isinstance(path, str) and os.path.basename(path).startswith("listener-") and \
                os.path.basename(os.path.dirname(path)).startswith("pymp-"):
            return os.path.dirname(path)
    return None


def _in_forkserver() -> bool:
    """True in multiprocessing's forkserver process (``python -c "from multiprocessing.forkserver
    import main; main(...)"``), which imports its preload modules before it serves (a driver run
    with ``python -c`` passes too, and finds no listener: it closed its own after starting the server)."""
    return sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules


if _in_forkserver():
    _dir = forkserver_listener_dir()
    if _dir is not None:
        # the forkserver exits (SystemExit, so exit handlers run) when the driver dies or exits; a
        # driver that exits normally has removed the directory already
        atexit.register(shutil.rmtree, _dir, ignore_errors=True)
