"""The driver's watch over its device processes: replies, failures, aborts and the root cause.

A ``Supervisor`` owns the driver's handles on every device process: the process itself (its
*sentinel* becomes readable when it exits), its command pipe (replies come back here) and its
sidecar pipe (asks "where are you stuck?"). ``collect`` waits on all of them at once with
``multiprocessing.connection.wait``, so a reply, a death and a deadline are noticed in one place and
nothing is polled.

Failure handling follows torch's spawn: the first failure is the root cause.

1. The first error reply or death raises the *abort word* in shared memory (``1 + culprit``) and
   rings every doorbell: devices blocked in communication wake, see the word and give up as
   ``DeviceAborted`` (a *secondary* error, which never hides the root cause).
2. The driver then waits at most ``abort_grace`` seconds for everybody.  A device still running
   after that is stuck in user code or in a C call that ignores aborts: its sidecar is asked for
   its stack, and the cluster kills it (fatal).
3. The root cause is a death if there was one, else the earliest error that was not caused by an
   abort (ties: lowest rank), with the remote traceback as its ``__cause__``.

A run may also carry a deadline (``VirtualCluster(run_timeout=...)``). If it passes before any
failure, every device still running is reported -- rank, last op from the flight recorder, stack --
as ``RunTimeout``, and the cluster kills them. If a failure came first, the deadline only cuts the
grace short and the root cause is reported as usual.

The supervisor decides *what* went wrong and whether it is fatal (a :class:`Verdict`); the cluster
acts on it (shuts down, or resets the rings and keeps going).
"""

from __future__ import annotations

import multiprocessing.connection as mpc
import pickle
import signal
import time
from typing import Any

import numpy as np

from ..errors import DeviceDied, PayloadError, VirtualParError, unpack_error
from ..mesh import Mesh
from .recorder import FlightRecorder, OpRecord, format_records
from .round import Collected, Verdict, judge

__all__ = ["Supervisor", "Collected", "Verdict", "unpack_error"]

_STACK_WAIT = 1.0  # seconds a sidecar gets to answer a stack request


class Supervisor:
    """Watches the device processes of one cluster (handles are added as the cluster starts them)."""

    def __init__(self, mesh: Mesh, recorders: list[FlightRecorder], abort_word: np.ndarray,
                 doorbells: list[Any], abort_grace: float) -> None:
        self.mesh = mesh
        self.abort_grace = abort_grace
        self.procs: list[Any] = []
        self.cmd: list[Any] = []
        self.side: list[Any] = []
        self._recorders = recorders
        self._abort = abort_word
        self._doorbells = doorbells
        self._final_records: list[list[OpRecord]] = []
        self.watch: Any = None  # a DeadlockWatch (runtime/deadlock.py), or None: no detection
        self.blas_release: Any = None  # gives the driver its BLAS threads back (blas_threads.hold)

    def add(self, proc: Any, cmd: Any, side: Any) -> None:
        """Watch device ``len(self.procs)``: its process, command pipe and sidecar pipe."""
        self.procs.append(proc)
        self.cmd.append(cmd)
        self.side.append(side)

    # -- one device ---------------------------------------------------------------------------------
    def recv_reply(self, rank: int, deadline: float, what: str) -> tuple:
        """Device ``rank``'s next reply; ``DeviceDied`` if it exits first, an error at ``deadline``."""
        conn, proc = self.cmd[rank], self.procs[rank]
        budget = deadline - time.monotonic()
        while True:
            left = deadline - time.monotonic()
            ready = mpc.wait([conn, proc.sentinel], timeout=max(0.0, left))
            if conn in ready:
                try:
                    return self._load(rank, what, conn.recv_bytes())
                except (EOFError, OSError):
                    pass  # the pipe broke: the process is gone, the sentinel says how
            if proc.sentinel in ready or not proc.is_alive():
                raise self.died(rank, during=what)
            if left <= 0:
                raise VirtualParError(f"device {rank} {self.mesh.index(rank)} did not answer within "
                                      f"{max(budget, 0.0):g} s during {what}", rank=rank)

    def _load(self, r: int, what: str, data: bytes) -> tuple:
        """A reply read whole from the pipe, unpickled; one the driver cannot unpickle (a class only
        the devices import) is that device's error, and the pipes stay in step."""
        try:
            return pickle.loads(data)
        except Exception as exc:
            err = PayloadError(f"device {r} {self.mesh.index(r)}: its reply to {what} "
                               "cannot be unpickled in the "
                               f"driver ({type(exc).__name__}: {exc}); return objects the "
                               "driver can import, e.g. "
                               "arrays and builtins", rank=r, index=str(self.mesh.index(r)))
            return ("err",
                    (err, "(the device's reply was read, but not loadable, in the driver)\n",
                     time.monotonic(),
                            False))

    def died(self, rank: int, during: str) -> DeviceDied:
        """A ``DeviceDied`` for device ``rank``: how it ended (exit code or signal) and its last ops."""
        proc = self.procs[rank]
        proc.join(0.5)  # the sentinel fires before the exit code is collected
        code = proc.exitcode
        sig = signal.Signals(-code).name if code is not None and code < 0 else None
        how = (
            f"was killed by {sig}"
            if sig
            else f"exited with code {code}" if code is not None else "stopped answering"
        )
        last_text = self._last_op(rank)
        return DeviceDied(
            f"device {rank} {self.mesh.index(rank)} (pid {proc.pid}) {how} during "
            f"{during}; last op: {last_text}"
            f"\n  last ops:\n{format_records(self.records(rank), 4)}",
            rank=rank, index=str(self.mesh.index(rank)), exitcode=code, signal=sig, last_op=last_text,
        )

    def stack(self, rank: int) -> str:
        """Device ``rank``'s main-thread stack, from its sidecar thread (works while it sleeps in C)."""
        try:
            self.side[rank].send("stack")
            if self.side[rank].poll(_STACK_WAIT):
                return self.side[rank].recv()
        except (OSError, EOFError, ValueError):
            pass
        return "(the device did not answer)"

    def records(self, rank: int) -> list[OpRecord]:
        """Device ``rank``'s flight records (kept after ``release`` for post-mortems)."""
        if self._recorders:
            return self._recorders[rank].records()
        return list(self._final_records[rank]) if self._final_records else []

    def _last_op(self, rank: int) -> str:
        recs = self.records(rank)
        return recs[-1].describe() if recs else "no op started"

    # -- every device -------------------------------------------------------------------------------
    def abort(self, culprit: int) -> None:
        """Raise the abort word and ring every doorbell, so that blocked devices give up now."""
        self._abort[0] = culprit + 1
        for bell in self._doorbells:
            bell.release()

    def collect(self, what: str, deadline: float | None = None) -> Collected:
        """Wait for every device's reply; on the first failure abort the rest (see module doc).

        ``deadline``: the ``time.monotonic()`` by which the whole round must be over (None: none).
        """
        n = len(self.procs)
        out = Collected(results=[None] * n)
        waiting = set(range(n))
        by_obj = {self.cmd[r]: r for r in range(n)} | {self.procs[r].sentinel: r for r in range(n)}
        grace: float | None = None
        watch = self.watch
        if watch is not None:
            watch.reset()
            scan_at = time.monotonic() + watch.every  # scans on their own clock, not at every reply
        while waiting:
            limit = min((t for t in (grace, deadline) if t is not None), default=None)
            if watch is not None and grace is None:
                if out.deadlock is None and time.monotonic() >= scan_at:
                    found = watch.scan(waiting)
                    if found is not None:
                        out.deadlock = found
                        self.abort(found.cycle[0])
                        grace = time.monotonic() + self.abort_grace
                        continue
                    scan_at = time.monotonic() + watch.every
                limit = scan_at if limit is None else min(limit, scan_at)
            objs = [self.cmd[r] for r in waiting] + [self.procs[r].sentinel for r in waiting]
            ready = mpc.wait(objs, timeout=None if limit is None else max(0.0, limit - time.monotonic()))
            for obj in ready:
                r = by_obj[obj]
                if r not in waiting:
                    continue  # its pipe and its sentinel were both ready
                failed = self._take_reply(r, obj, what, out)
                waiting.discard(r)
                if failed and grace is None:
                    self.abort(r)
                    grace = time.monotonic() + self.abort_grace
            if (
                waiting
                and limit is not None
                and time.monotonic() >= limit
                and (
                    grace is not None
                    and time.monotonic() >= grace
                    or deadline is not None
                    and time.monotonic() >= deadline
                )
            ):
                out.stuck = sorted(waiting)
                out.timed_out = grace is None
                out.stacks = {r: self.stack(r) for r in out.stuck}
                break
        return out

    def _take_reply(self, r: int, obj: Any, what: str, out: Collected) -> bool:
        """File device ``r``'s reply (or death) into ``out``; True if it is a failure."""
        reply = None
        if obj is self.cmd[r] or self.cmd[r].poll():  # a device may reply and exit at once
            try:
                data = self.cmd[r].recv_bytes()  # an interrupt here propagates: the caller closes the cluster
            except (EOFError, OSError):
                data = None
            if data is not None:
                reply = self._load(r, what, data)
        if reply is None:
            out.deaths.append(self.died(r, during=what))
            return True
        if reply[0] == "ok":
            out.results[r] = out.returned[r] = reply[1]
            if len(reply) > 2 and reply[2]:
                out.pending.extend(reply[2])
            return False
        out.errors.append((r, reply[1]))
        return True

    def judge(self, got: Collected, what: str, run_timeout: float | None = None) -> Verdict | None:
        """The error ``got`` calls for, and whether it is fatal; None if every device succeeded."""
        return judge(got, what, run_timeout, self.mesh, self._last_op)

    # -- the end ------------------------------------------------------------------------------------
    def kill_all(self) -> None:
        """SIGKILL every device still alive and reap every process that was started."""
        started = [proc for proc in self.procs if proc.pid is not None]
        for proc in started:
            if proc.is_alive():
                proc.kill()
        for proc in started:
            proc.join(5.0)
            try:
                proc.close()
            except ValueError:
                pass  # still running after 5 s: cannot happen after SIGKILL, but never raise here

    def release(self) -> None:
        """Close every pipe and drop every view of the arena (keeping a copy of the flight records)."""
        for conn in self.cmd + self.side:
            conn.close()
        if self._recorders:
            self._final_records = [rec.records() for rec in self._recorders]
        self._recorders = []
        if self.watch is not None:  # it holds views of the arena too, and a traceback may hold it
            self.watch.release()
        self.watch = None
        self._abort = None  # type: ignore[assignment]
        self._doorbells = []
        # the devices are gone: their share of the cores is the driver's again
        if self.blas_release is not None:
            self.blas_release()
            self.blas_release = None

