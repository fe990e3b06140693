"""What devices print, relayed to the driver's ``sys.stdout`` / ``sys.stderr`` as it comes.

By default a device process writes to the file descriptors 1 and 2 it inherited from the driver:
a terminal shows its prints at once and nothing is copied.  That is not enough in two cases, and
in those the cluster starts an :class:`OutputRelay`:

* the driver's ``sys.stdout`` (or ``sys.stderr``) is not its descriptor 1 (2): a notebook's
  ``OutStream``, an ``io.StringIO``, a file the user assigned.  Prints that went to descriptor 1
  would never reach the cell or the buffer;
* ``tag_output=True``: every line is prefixed ``[rank] `` (mpiexec's ``--tag-output`` /
  ``-prepend-rank``), which needs the lines to pass through the driver.

Each device then gets two pipes (stdout, stderr) as its descriptors 1 and 2, and a fresh
line-buffered ``sys.stdout``/``sys.stderr`` on them, so each line leaves the device as it is printed
(a pipe would otherwise be block-buffered until the command ends).  In the driver one reader thread
waits on every pipe (one ``select`` for all devices) and writes what arrives to whatever
``sys.stdout``/``sys.stderr`` is *at that moment*, flushing after each batch, a whole line at a time
(a line's unfinished end waits for its newline, or for the end of the run), so that two devices'
lines never glue into one.  A device flushes its
streams before it replies, and :meth:`OutputRelay.sync` (called by ``cluster.run`` before it returns
or raises) drains what is already in the pipes, so ``run`` ends with the devices' prints written.

Cost: two pipes per device and one thread per cluster, only when relaying; each line costs a
``read`` and a ``write`` in the driver.  Pure Python, no polling: the thread sleeps in ``select``.
"""

from __future__ import annotations

import codecs
import functools
import os
import selectors
import sys
import threading
from typing import Any, Callable

__all__ = ["OutputRelay", "NoRelay", "relay_for", "forwarding_needed"]

_CHUNK = 1 << 16
_MAX_PUMP = 1 << 20  # bytes read from one pipe per pump: a device printing without end cannot hold sync


def forwarding_needed() -> bool:
    """True when the driver's ``sys.stdout``/``sys.stderr`` is not the file its descriptor 1/2 is
    (no ``fileno()``, or another file): prints written to descriptors 1/2 would not reach it."""
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            own = stream.fileno()
            if own != fd and not os.path.sameopenfile(own, fd):
                return True
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
            return True
    return False


def relay_for(n: int, start_method: str, tag_output: bool) -> "OutputRelay | NoRelay":
    """The relay a cluster of ``n`` devices needs (see the module doc), or a :class:`NoRelay`."""
    if not tag_output and not forwarding_needed():
        return NoRelay()
    import multiprocessing as mp

    return OutputRelay(mp.get_context(start_method), n, tag_output)


class NoRelay:
    """Devices write to the descriptors they inherited: nothing to do."""

    def wrap(self, target: Callable[..., None]) -> Callable[..., None]:
        return target

    def started(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


def _device_entry(ends: list[tuple[Any, Any]], target: Callable[..., None], args: Any, *rest: Any) -> None:
    """In the device process: make its pipes descriptors 1 and 2, then run ``target``."""
    out, err = ends[args.rank]
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    for pair in ends:  # descriptors 1 and 2 hold our pipes now; the others' ends are not ours
        for conn in pair:
            conn.close()
    # a forked device inherited the driver's sys.stdout object (a StringIO, an OutStream, or a
    # block-buffered wrapper of descriptor 1): replace both with line-buffered ones on the pipes
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    target(args, *rest)


class OutputRelay:
    """Two pipes per device and a reader thread in the driver (see the module doc)."""

    def __init__(self, ctx: Any, n: int, tag: bool) -> None:
        self.tag = tag
        self._lock = threading.Lock()
        self._read: dict[int, tuple[int, int]] = {}  # fd -> (rank, stream: 1 stdout, 2 stderr)
        self._conns: list[Any] = []  # the driver's read ends (closing them closes the fds)
        self._ends: list[tuple[Any, Any]] = []  # the devices' write ends, until they are started
        self._decoders: dict[tuple[int, int], Any] = {}
        self._partial: dict[tuple[int, int], str] = {}
        self._thread: threading.Thread | None = None
        self._closing = False
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()  # close() writes here to end the thread's select at once
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            for rank in range(n):
                pair = []
                for stream in (1, 2):
                    r, w = ctx.Pipe(duplex=False)
                    self._conns.append(r)
                    pair.append(w)
                    os.set_blocking(r.fileno(), False)
                    self._read[r.fileno()] = (rank, stream)
                    self._sel.register(r.fileno(), selectors.EVENT_READ)
                self._ends.append((pair[0], pair[1]))
        except BaseException:
            self._close_ends()
            self.close()
            raise

    def wrap(self, target: Callable[..., None]) -> Callable[..., None]:
        """The process target that gives each device its pipes before running ``target``."""
        return functools.partial(_device_entry, self._ends, target)

    def _close_ends(self) -> None:
        for pair in self._ends:
            for conn in pair:
                conn.close()
        self._ends = []

    def started(self) -> None:
        """Every device has its copies: close the driver's write ends (so a device's exit reads as
        end-of-file) and start the reader thread."""
        self._close_ends()
        self._thread = threading.Thread(target=self._loop, name="virtualpar-output", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._read or self._closing:  # every device has exited, or close() took over
                    break
            ready = [key.fd for key, _ in self._sel.select()]
            if self._wake_r in ready:
                break
            with self._lock:
                self._pump(ready)
        with self._lock:
            self._sel.close()

    def sync(self) -> None:
        """Write out everything the devices have printed so far (what is in the pipes now)."""
        with self._lock:
            self._pump(list(self._read))
            for key in list(self._partial):
                self._flush_partial(key, end=False)

    def close(self) -> None:
        """After the devices are gone: write out what is left, end unfinished lines, stop the thread.
        Idempotent."""
        with self._lock:
            self._pump(list(self._read))
            for key in list(self._partial):
                self._flush_partial(key)
            for fd in list(self._read):
                self._drop(fd)
            self._closing = True
        thread, self._thread = self._thread, None
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")  # the thread may sleep in select: wake it
            if thread is not None and thread is not threading.current_thread():
                thread.join(2.0)
            with self._lock:
                self._sel.close()
            os.close(self._wake_w)
            os.close(self._wake_r)
            self._wake_w = self._wake_r = -1
        for conn in self._conns:
            conn.close()
        self._conns = []

    # -- under the lock ----------------------------------------------------------------------------
    def _drop(self, fd: int) -> None:
        self._read.pop(fd, None)
        try:
            self._sel.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass

    def _pump(self, fds: list[int]) -> None:
        touched: set[int] = set()
        for fd in fds:
            key = self._read.get(fd)
            if key is None:
                continue
            got = 0
            while got < _MAX_PUMP:
                try:
                    data = os.read(fd, _CHUNK)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:  # end of file: the device exited
                    self._flush_partial(key)
                    self._drop(fd)
                    break
                got += len(data)
                self._emit(key, data)
                touched.add(key[1])
        for stream in touched:
            _flush(stream)

    def _emit(self, key: tuple[int, int], data: bytes) -> None:
        """Whole lines go out at once (prefixed ``[rank] `` when tagging); a line's unfinished end
        waits for its newline, so that two devices' lines never glue into one."""
        dec = self._decoders.get(key)
        if dec is None:
            dec = self._decoders[key] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = self._partial.pop(key, "") + dec.decode(data)
        *lines, rest = text.split("\n")
        if lines:
            prefix = f"[{key[0]}] " if self.tag else ""
            _write(key[1], "".join(f"{prefix}{line}\n" for line in lines))
        if rest:
            self._partial[key] = rest

    def _flush_partial(self, key: tuple[int, int], end: bool = True) -> None:
        """Write out a line's unfinished end: tagged, as a line of its own (``end``: at exit or
        close) or not yet; untagged, as it is (at the end of every run, as a terminal shows it)."""
        rest = self._partial.get(key, "")
        if not rest or self.tag and not end:
            return
        del self._partial[key]
        _write(key[1], f"[{key[0]}] {rest}\n" if self.tag else rest)
        _flush(key[1])


def _stream(which: int) -> Any:
    return sys.stdout if which == 1 else sys.stderr


def _write(which: int, text: str) -> None:
    stream = _stream(which)
    if stream is None or not text:
        return
    try:
        stream.write(text)
    except (OSError, ValueError):  # closed or broken: the driver's output is gone, nothing to keep
        pass


def _flush(which: int) -> None:
    stream = _stream(which)
    try:
        if stream is not None:
            stream.flush()
    except (OSError, ValueError):
        pass
