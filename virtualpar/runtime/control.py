"""The driver's side of a running cluster: commands to devices, and the two ends of a failure.

A command is a tuple sent down a device's command pipe (``("run", payload)``, ``("get", key)``...);
the device answers ``("ok", value[, unmatched messages])`` or ``("err", packaged error)``.  A command
to every device (``broadcast``) is collected by the :class:`~.supervisor.Supervisor`, which also
decides what a failure means.  A failed command ends one of two ways:

- **reset** (every device came back, some with an error): the rings' heads and tails and the abort
  word are zeroed, the host endpoint forgets what was in flight, and every device is told to do the
  same.  No message of the failed command can leak into the next one, and the cluster stays usable.
- **fatal shutdown** (a device died, was stuck, or overran ``run_timeout``): every process is killed
  and reaped, every pipe closed, every view of the shared arena dropped and the arena freed at once;
  later calls raise ``ClusterClosedError`` naming the reason.

After a successful run the rings must be empty: what is left is reported as ``UnmatchedMessages``
(runtime/unmatched.py) and the cluster reset.  The warm-up (runtime/warmup.py) is sent to every
device at start-up and gathered by the first call that needs the devices (``check_open``).

A command may be *posted* (``post``): sent without waiting for its reply, which the device still
sends, in order, on its pipe.  The next reply read from that device, and any reset, first takes the
posted ones (``settle``); one that failed fails the command being answered, with its own error, once
that command's replies are read too (so the pipes stay in step), and the cluster is reset; one that
nothing reads before ``close`` is logged.  ``cluster.put(..., block=False)`` posts (a pipeline step).
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

import numpy as np

from ..errors import ClusterClosedError, DeviceDied, VirtualParError
from ..mesh import Mesh
from ..transport.endpoint import Endpoint
from ..transport.shm import Layout, SharedArena, ring_control
from .config import ClusterConfig
from .supervisor import Supervisor, Verdict, unpack_error
from .unmatched import report_unmatched

__all__ = ["ClusterControl"]

log = logging.getLogger(__name__)

_CLOSE_WAIT = 2.0  # seconds devices get to leave their loop on close before they are killed
_REPLY_SLACK = 5.0  # a command's reply may take the op timeout plus this


class ClusterControl:
    """Commands, reset and shutdown for the devices ``sup`` watches (owns every arena view)."""

    def __init__(self, mesh: Mesh, config: ClusterConfig, layout: Layout, arena: SharedArena, sup: Supervisor,
                 doorbells: list[Any]) -> None:
        self.mesh = mesh
        self.size = mesh.size
        self.config = config
        self.sup = sup
        self.closed = False
        self.fatal: str | None = None  # why the cluster was shut down, if it was
        self._arena = arena
        self.host: Endpoint | None = Endpoint(layout.host, arena, layout, doorbells)
        E = layout.endpoints
        self._abort = arena.view(layout.abort_offset, 1, np.int64)
        self.clocks = arena.view(layout.clocks_offset, E, np.float64)
        self.counters = arena.view(layout.counters_offset, 3 * E * E, np.int64).reshape(3, E, E)
        ctrl = ring_control(arena, layout).reshape(E * E, 16)
        self._heads, self._tails = ctrl[:, 0], ctrl[:, 8]  # each counter on its own 64-byte line
        self._arrivals = arena.view(layout.arrivals_offset, layout.arrivals_bytes // 8, np.uint64)
        self.posted: dict[int, list[str]] = {}  # rank -> what each posted command was, oldest first
        # a posted command's error a reset read first, not yet raised
        self.held: dict[int, BaseException] = {}
        self.warming = False  # the warm-up was started and its replies are not read yet

    def check_open(self) -> None:
        """Raise ClusterClosedError if closed; else make sure the warm-up is over."""
        if self.closed:
            why = f" after a fatal failure: {self.fatal}" if self.fatal else ""
            raise ClusterClosedError(f"this VirtualCluster({self.mesh}) is closed{why}; create a new one")
        if self.warming:
            self.finish_warm_up()

    # -- commands -----------------------------------------------------------------------------------
    def send(self, rank: int, msg: tuple, what: str | None = None) -> None:
        """Send a command; a device that is gone (its pipe broke: spawn, forkserver) is a fatal DeviceDied."""
        try:
            self.sup.cmd[rank].send(msg)
        except (OSError, ValueError):
            died = self.sup.died(rank, during=what or f"the {msg[0]!r} command")
            self.fatal_shutdown(str(died))
            raise died from None

    def command(self, rank: int, msg: tuple) -> Any:
        """Send a command to one device and return its reply's value (or raise its error)."""
        self.send(rank, msg)
        return self.finish(rank, what=f"the {msg[0]!r} command")

    def post(self, rank: int, msg: tuple, what: str) -> None:
        """Send a command whose reply is taken later, by the next reply read from ``rank``."""
        try:
            self.send(rank, msg, what)
        except BaseException as exc:  # sent or not, nobody knows now: the replies could be a round off
            self._interrupted(exc, what)
            raise
        self.posted.setdefault(rank, []).append(what)

    def settle(self, rank: int) -> BaseException | None:
        """Read device ``rank``'s replies to its posted commands; the first one's error, if any
        failed (a death is fatal and raised at once)."""
        first = self.held.pop(rank, None)
        for what in self.posted.pop(rank, ()):
            reply = self._reply(rank, what)
            if reply[0] == "err" and first is None:
                first = unpack_error(reply[1])
                if isinstance(first, VirtualParError):
                    first = first.replace(f"the posted {what} failed: {first.message}")
        return first

    def finish(self, rank: int, reply: tuple | None = None, what: str = "a driver command") -> Any:
        """Wait for device ``rank``'s reply (unless given) and unpack it; a death is fatal.  A
        posted command that failed before it raises its own error (see the module doc)."""
        earlier = self.settle(rank) if reply is None else None
        if reply is None:
            reply = self._reply(rank, what)
        if earlier is not None:
            self.reset()
            raise earlier
        if reply[0] == "err":
            raise unpack_error(reply[1])
        return reply[1]

    def _reply(self, rank: int, what: str) -> tuple:
        try:
            return self.sup.recv_reply(rank, time.monotonic() + self.config.timeout + _REPLY_SLACK, what)
        except DeviceDied as died:
            self.fatal_shutdown(str(died))
            raise
        except BaseException as exc:  # a reply half read (a signal handler's exception): the pipe is off
            self._interrupted(exc, what)
            raise

    def broadcast(self, msg: tuple | None, what: str, run_timeout: float | None = None,
                  check_unmatched: bool = True) -> list[Any]:
        """Send ``msg`` to every device; their replies in rank order, or the root cause of a failure.
        ``msg`` None: no command, the replies to the warm-up, which start-up sent.

        ``run_timeout``: seconds the whole round may take from now (None: no limit).
        """
        earlier: BaseException | None = None
        # one guard from the first send to the last reply: a gap would leave later replies a round behind
        try:
            deadline = None if run_timeout is None else time.monotonic() + run_timeout
            if msg is None:
                self.warming = False
            for r in range(self.size if msg is not None else 0):  # (the warm-up was sent at start-up)
                self.send(r, msg, what)
            for r in sorted(set(self.posted) | set(self.held)):
                failed = self.settle(r)
                if earlier is None:
                    earlier = failed
                elif failed is not None:  # raised by the next call that hears from r, or logged at close
                    self.held[r] = failed
            got = self.sup.collect(what, deadline)
            verdict = self.sup.judge(got, what, run_timeout)
        except BaseException as exc:
            self._interrupted(exc, what if msg is None else f"{what}()")
            raise
        if verdict is not None and (verdict.fatal is not None or earlier is None):
            if isinstance(verdict.error, VirtualParError):  # what the others returned is not lost
                verdict.error.returned = dict(got.returned)
            self.fail(verdict)
        if earlier is not None:  # a posted command failed: this one's errors follow from it
            self.reset()
            raise earlier
        if check_unmatched and (got.pending or np.any(self._heads != self._tails)):
            try:
                report_unmatched(self, got.pending)
            except VirtualParError as exc:  # every device returned: what they returned is not lost
                exc.returned = dict(got.returned)
                raise
        return got.results

    def _interrupted(self, exc: BaseException, what: str) -> None:
        """Shut down for an outside exception (Ctrl-C, a signal handler's) amid sends and replies:
        the pipes may be a reply off.  virtualpar's own errors were handled where they arose."""
        if not isinstance(exc, VirtualParError):
            how = f": {exc}" if str(exc) else " (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else ""
            self.fatal_shutdown(f"{what} was interrupted in the driver by {type(exc).__name__}{how}")

    # -- the warm-up (runtime/warmup.py) ------------------------------------------------------------
    def start_warm_up(self) -> None:
        """Tell every device to warm up; the replies are read by the next call (``check_open``)."""
        try:
            self.warming = True  # owed from the first send on
            for r in range(self.size):
                self.send(r, ("warm",), "the warm-up")
        except BaseException as exc:
            self._interrupted(exc, "the warm-up")
            raise

    def finish_warm_up(self) -> None:
        """Wait for the warm-up, then zero the traffic counters and modelled clocks it moved; a
        failure says it was the warm-up's (the devices' errors name its ops)."""
        try:
            self.broadcast(None, "the warm-up")
        except VirtualParError as exc:
            raise exc.replace("the cluster's start-up warm-up failed, before any call "
                              "of yours (VirtualCluster("
                              f"warm_up=False) skips it): {exc.message}") from exc
        finally:
            if not self.closed:
                self.counters[...] = 0
                self.clocks[...] = 0.0

    def fail(self, verdict: Verdict) -> None:
        """End a failed command as the verdict says (shut down, or reset), then raise its error."""
        if verdict.fatal is not None:
            self.fatal_shutdown(verdict.fatal)
        else:
            self.reset()
        raise verdict.error

    # -- the two ends of a failure ------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything in flight after a failed command, posted commands settled first (their
        errors held): a put a busy device had not read yet was lost with the zeroed rings."""
        for r in sorted(self.posted):
            if (failed := self.settle(r)) is not None:
                self.held[r] = failed
        self._heads[:] = 0
        self._tails[:] = 0
        self._arrivals[:] = 0  # fence counts of a collective that never finished
        self._abort[0] = 0
        self.host.reset()
        for r in range(self.size):
            self.send(r, ("reset",))
        for r in range(self.size):
            self.finish(r, self._reply(r, "the 'reset' command"), "the 'reset' command")

    def fatal_shutdown(self, reason: str) -> None:
        """Shut down for good after a failure; later calls raise ClusterClosedError with ``reason``."""
        if self.closed:
            return
        self.fatal = reason
        self.closed = True
        self.shutdown()

    def collected(self, name: str) -> None:
        """The cluster was garbage-collected, or the interpreter exits, while still open: its devices
        would live on until the driver exits, so warn (a ``ResourceWarning``, as for an unclosed
        file) and close it."""
        if not self.closed:
            try:
                self.close()
            finally:  # (warned after: under -W error the warning raises, and the devices must be gone)
                warnings.warn(f"{name} was never closed; it was closed when collected (use `with "
                              "VirtualCluster(...)` or call close())", ResourceWarning, stacklevel=1)

    def close(self) -> None:
        """Ask every device to leave its loop, give them ``_CLOSE_WAIT`` s, then shut down.  Idempotent."""
        if self.closed:
            self._arena.close()  # after a fatal failure views may have outlived the shutdown: unmap now
            return
        # nobody needs its replies: stop it rather than wait (the devices read "close" after it)
        if self.warming:
            self.warming = False
            self.sup.abort(0)
        # nothing will read these any more: say if one failed
        for r in sorted(set(self.posted) | set(self.held)):
            try:
                failed = self.settle(r)
            except DeviceDied:
                return  # fatal_shutdown already closed everything
            if failed is not None:
                log.warning("%s", failed)
        self.closed = True
        sup = self.sup
        for r, proc in enumerate(sup.procs):
            try:
                if proc.is_alive():
                    sup.cmd[r].send(("close",))
            except (OSError, ValueError):
                pass  # already gone: shutdown reaps it
        deadline = time.monotonic() + _CLOSE_WAIT
        for proc in sup.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self.shutdown()

    def shutdown(self) -> None:
        """Kill and reap every process, close the pipes, drop every view of the arena and free it now."""
        self.closed = True
        self.posted.clear()
        self.held.clear()
        self.sup.kill_all()
        self.sup.release()
        self.host = None
        self._heads = self._tails = self._arrivals = None  # type: ignore[assignment]
        self._abort = self.clocks = self.counters = None  # type: ignore[assignment]
        self._arena.close()
