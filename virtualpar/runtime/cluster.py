"""``VirtualCluster``: start one process per device, run SPMD functions on them, and reap them.

Lifecycle::

    with VirtualCluster(Mesh({"dp": 2, "tp": 2})) as cluster:
        results = cluster.run(step, batch)        # step(device, batch) on every device, rank order

Failure handling follows torch's spawn: the first failure is the root cause.  When a device
reports an error, the driver raises the abort word in shared memory and rings every doorbell, so
devices blocked in communication give up at once (as ``DeviceAborted``, a secondary error); it
waits ``abort_grace`` seconds for everybody, then kills whatever is still stuck (after asking its
sidecar for its stack).  If every device came back, the rings are zeroed and the cluster stays
usable; if a device died or had to be killed, the cluster shuts down and later calls raise
``ClusterClosedError``.  Either way the driver raises the root cause, with the remote traceback as
its ``__cause__``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection as mpc
import pickle
import signal
import time
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import (ClusterClosedError, CollectiveTimeout, DeviceDied, P2PTimeout, PayloadError,
                      RemoteTraceback, UnmatchedMessages, UsageError, VirtualParError)
from ..mesh import Mesh
from ..transport.endpoint import Endpoint
from ..transport.shm import Layout, SharedArena
from .config import FAULT_ACTIONS, TAG_HOST, ClusterConfig
from .hardware_choice import resolve_hardware
from .recorder import FlightRecorder, format_records
from .stats import TrafficStats
from .worker import WorkerArgs, device_main

__all__ = ["VirtualCluster", "START_METHODS"]

log = logging.getLogger(__name__)

START_METHODS = ("fork", "forkserver", "spawn")
_READY_TIMEOUT = 60.0


def _default_ring_bytes(n: int) -> int:
    """Ring size per directed channel: larger rings for small clusters (fewer chunks in flight)."""
    return 4 << 20 if n <= 4 else 2 << 20 if n <= 8 else 1 << 20


def as_mesh(mesh: Mesh | int | Mapping[str, int] | tuple) -> Mesh:
    return mesh if isinstance(mesh, Mesh) else Mesh(mesh)


class VirtualCluster:
    """A virtual cluster of ``mesh.size`` device processes on this machine.

    ``mesh``: a :class:`Mesh`, an int (a 1-D mesh) or a dict of axis sizes.
    ``start_method``: "fork" (default on Linux; fastest), "forkserver" or "spawn".
    ``timeout``: seconds any one blocking op may wait (per-call ``timeout=`` overrides).
    ``check_collectives``: compare every collective call across its group first (on by default).
    ``check_nan``: raise when a collective input holds NaN/Inf.
    ``hardware``: what the modelled clock models: a preset name (``"h100-node"``...), a
    ``Hardware``, or None for the mesh's own topology with the default device.
    ``abort_grace``: seconds to wait for the other devices after a failure before killing them.
    """

    def __init__(
        self,
        mesh: Mesh | int | Mapping[str, int] | tuple = 1,
        *,
        start_method: str = "fork",
        timeout: float = 60.0,
        check_collectives: bool = True,
        check_nan: bool = False,
        hardware: Any = None,
        trace: bool = True,
        ring_bytes: int | None = None,
        abort_grace: float = 2.0,
    ) -> None:
        self._closed = True  # until start-up succeeds
        self._fatal: str | None = None
        if start_method not in START_METHODS:
            raise UsageError(f"unknown start_method {start_method!r}; choose one of {START_METHODS}")
        if not timeout > 0:
            raise UsageError(f"timeout must be positive seconds, got {timeout!r}")
        self.mesh = as_mesh(mesh)
        self.size = n = self.mesh.size
        self.start_method = start_method
        self.abort_grace = abort_grace
        self.hardware, topology, device_spec = resolve_hardware(hardware, self.mesh)
        self.config = ClusterConfig(timeout=float(timeout), check_collectives=check_collectives,
                                    check_nan=check_nan, trace=trace, t0=time.monotonic())
        self.layout = layout = Layout(n, ring_bytes or _default_ring_bytes(n))
        self._arena = SharedArena.create(layout.total_bytes)
        self._procs: list[Any] = []
        self._cmd: list[Any] = []
        self._side: list[Any] = []
        self._recorders: list[FlightRecorder] = []
        self._final_records: list[list] = []
        try:
            self._start(topology, device_spec)
        except BaseException:
            self._kill_all()
            self._release()
            raise
        self._closed = False

    # -- start-up ---------------------------------------------------------------------------------
    def _start(self, topology: Any, device_spec: Any) -> None:
        from ..sim.clock import DeviceClock

        n, layout = self.size, self.layout
        ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":
            ctx.set_forkserver_preload(["numpy", "networkx", "virtualpar.runtime.worker", "virtualpar.runtime.device"])
        forked = self.start_method == "fork"
        if forked:
            self._arena.unlink()  # children inherit the mapping: the name is never needed again
        self._doorbells = [ctx.Semaphore(0) for _ in range(layout.endpoints)]
        child_ends = []
        try:
            for r in range(n):
                here, there = ctx.Pipe(duplex=True)
                self._cmd.append(here)
                child_ends.append(there)
                side_here, side_there = ctx.Pipe(duplex=True)
                self._side.append(side_here)
                child_ends.append(side_there)
                args = WorkerArgs(r, self.mesh, self.config, layout, self._arena.name, self._doorbells, there,
                                  side_there, DeviceClock(r, topology, device_spec))
                self._procs.append(ctx.Process(target=device_main, args=(args, self._arena if forked else None),
                                               daemon=True, name=f"virtualpar-device-{r}"))
            for proc in self._procs:
                proc.start()
        finally:
            for conn in child_ends:
                conn.close()  # the child has its own copy; ours would hide the child's death
        self._host = Endpoint(layout.host, self._arena, layout, self._doorbells)
        self._abort = self._arena.view(layout.abort_offset, 1, np.int64)
        self._clocks = self._arena.view(layout.clocks_offset, layout.endpoints, np.float64)
        E = layout.endpoints
        self._counters = self._arena.view(layout.counters_offset, 3 * E * E, np.int64).reshape(3, E, E)
        ctrl = self._arena.view(layout.ring_ctrl_offset, E * E * 16, np.uint64).reshape(E * E, 16)
        self._heads, self._tails = ctrl[:, 0], ctrl[:, 8]
        self._recorders = [FlightRecorder(self._arena, layout, r) for r in range(n)]
        self.pids = []
        deadline = time.monotonic() + _READY_TIMEOUT
        for r in range(n):
            msg = self._recv_reply(r, deadline, "start-up")
            self.pids.append(msg[1])
        if not forked:
            self._arena.unlink()  # every device has mapped it now

    def _recv_reply(self, r: int, deadline: float, what: str) -> tuple:
        conn, proc = self._cmd[r], self._procs[r]
        while True:
            left = deadline - time.monotonic()
            ready = mpc.wait([conn, proc.sentinel], timeout=max(0.0, left))
            if conn in ready:
                try:
                    return conn.recv()
                except (EOFError, OSError):
                    pass
            if proc.sentinel in ready or not proc.is_alive():
                raise self._died(r, during=what)
            if left <= 0:
                raise VirtualParError(f"device {r} did not answer within {_READY_TIMEOUT:g} s during {what}")

    # -- public API -------------------------------------------------------------------------------
    def __enter__(self) -> "VirtualCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.size} devices, {self.start_method}"
        return f"VirtualCluster({self.mesh}, {state})"

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(device, *args, **kwargs)`` on every device (SPMD); results in rank order."""
        self._check_open()
        name = getattr(fn, "__qualname__", repr(fn))
        try:
            payload = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise PayloadError(
                f"cannot send {name}() and its arguments to the devices: {exc}. Functions run on devices must be "
                "picklable: define them at module level (not as a lambda or inside another function)"
            ) from None
        return self._broadcast_command(("run", payload), name)

    def inject(self, rank: int, at_op: int, action: str, **params: Any) -> None:
        """Make device ``rank`` fail at the ``at_op``-th op (1-based) of what it runs next.

        ``action``: "raise" (InjectedFault), "kill" (SIGKILL itself), "exit" (``code=``), "hang"
        (sleep forever, ignoring aborts) or "delay" (``seconds=``, then go on).  An op is any
        send, recv or collective.  Deterministic: no sleeps are needed in tests.
        """
        self._check_open()
        self._check_rank(rank)
        if action not in FAULT_ACTIONS:
            raise UsageError(f"unknown fault action {action!r}; choose one of {FAULT_ACTIONS}")
        if isinstance(at_op, bool) or not isinstance(at_op, int) or at_op < 1:
            raise UsageError(f"at_op must be a positive int (the k-th op, 1-based), got {at_op!r}")
        self._command(rank, ("inject", at_op, action, params))

    def put(self, rank: int, key: str, x: Any) -> None:
        """Place ``x`` in ``device.state[key]`` of device ``rank`` over the host->device channel."""
        self._check_open()
        self._check_rank(rank)
        req = self._host.isend(x, rank, TAG_HOST)  # an unpicklable x fails here, before the device is involved
        self._host_command(rank, ("put", key), lambda: req.done, "put")

    def get(self, rank: int, key: str) -> Any:
        """Fetch ``device.state[key]`` from device ``rank`` over the device->host channel."""
        self._check_open()
        self._check_rank(rank)
        req = self._host.irecv(rank, TAG_HOST)
        self._host_command(rank, ("get", key), lambda: req.done, "get")
        return req.wait(0.0)

    def stats(self) -> TrafficStats:
        """Bytes and messages moved so far, per device pair, with host traffic apart."""
        self._check_open()
        return TrafficStats.from_counters(self._counters.copy(), self.size)

    def reset_stats(self) -> None:
        self._check_open()
        self._counters[...] = 0

    def clocks(self) -> list[float]:
        """Every device's modelled clock (seconds on the virtual hardware since start-up)."""
        self._check_open()
        return [float(c) for c in self._clocks[: self.size]]

    def flight_records(self, rank: int) -> list:
        """Device ``rank``'s last 64 ops (readable even after the device died or the cluster closed)."""
        self._check_rank(rank)
        if self._recorders:
            return self._recorders[rank].records()
        return list(self._final_records[rank]) if self._final_records else []

    def trace(self, clear: bool = False) -> Any:
        """Every device's events merged into one :class:`~virtualpar.trace.Trace`."""
        from ..trace.events import Trace

        self._check_open()
        replies = self._broadcast_command(("trace", clear), "trace")
        events = [e for evs in replies for e in evs]
        names = {r: f"device {r} {self.mesh.index(r)}" for r in range(self.size)}
        return Trace(events, device_names=names)

    def clear_trace(self) -> None:
        self._check_open()
        self._broadcast_command(("clear_trace",), "clear_trace")

    def close(self) -> None:
        """Stop every device, reap every process, free the shared memory.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        for r, proc in enumerate(self._procs):
            try:
                if proc.is_alive():
                    self._cmd[r].send(("close",))
            except (OSError, ValueError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self._kill_all()
        self._release()

    # -- internals ----------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            why = f" after a fatal failure: {self._fatal}" if self._fatal else ""
            raise ClusterClosedError(f"this VirtualCluster({self.mesh}) is closed{why}; create a new one")

    def _check_rank(self, rank: Any) -> None:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.size:
            raise UsageError(f"rank must be a device rank 0..{self.size - 1}, got {rank!r}")

    def _send(self, rank: int, msg: tuple, what: str | None = None) -> None:
        """Send a command; a device that is gone (its pipe broke: spawn, forkserver) is a fatal DeviceDied."""
        try:
            self._cmd[rank].send(msg)
        except (OSError, ValueError):
            died = self._died(rank, during=what or f"the {msg[0]!r} command")
            self._fatal_shutdown(str(died))
            raise died from None

    def _command(self, rank: int, msg: tuple) -> Any:
        self._send(rank, msg)
        return self._finish_command(rank, what=f"the {msg[0]!r} command")

    def _finish_command(self, rank: int, reply: tuple | None = None, what: str = "a driver command") -> Any:
        try:
            if reply is None:
                reply = self._recv_reply(rank, time.monotonic() + self.config.timeout + 5, what)
        except DeviceDied as died:
            self._fatal_shutdown(str(died))
            raise
        if reply[0] == "err":
            raise self._reraise(reply[1])
        return reply[1]

    def _host_command(self, rank: int, msg: tuple, done: Callable[[], bool], what: str) -> None:
        """Send a put/get command and move its data over the host channel.

        A device that fails the command (a missing key, an unpicklable value) leaves the host's
        half of the transfer posted; the cluster is then reset exactly as after a failed run, so the
        next command starts clean.  A timeout or Ctrl-C leaves the device's state unknown: fatal.
        """
        try:
            self._send(rank, msg, what)
            reply = self._host_wait(rank, done, what)
            self._finish_command(rank, reply, what)
        except (KeyboardInterrupt, P2PTimeout) as exc:
            self._fatal_shutdown(f"{what} with device {rank} was interrupted: {type(exc).__name__}")
            raise
        except VirtualParError:
            if not self._closed:
                self._reset()
            raise

    def _host_wait(self, rank: int, done: Callable[[], bool], what: str) -> tuple | None:
        """Progress the host endpoint until ``done``, watching device ``rank`` for an early reply."""
        box: list[tuple] = []

        def watch() -> None:
            if not box and self._cmd[rank].poll():
                box.append(self._cmd[rank].recv())
                if box[0][0] == "err":
                    raise self._reraise(box[0][1])
            if not self._procs[rank].is_alive():
                died = self._died(rank, during=what)
                self._fatal_shutdown(str(died))
                raise died

        def timed_out() -> P2PTimeout:
            return P2PTimeout(f"host: {what} with device {rank} {self.mesh.index(rank)} did not complete within "
                              f"{self.config.timeout:g} s", rank=rank, index=str(self.mesh.index(rank)))

        self._host.wait(done, self.config.timeout, timed_out, f"{what} with device {rank}", on_idle=watch)
        return box[0] if box else None

    def _broadcast_command(self, msg: tuple, what: str) -> list[Any]:
        try:
            for r in range(self.size):
                self._send(r, msg, what)
            return self._collect(what)
        except KeyboardInterrupt:
            self._fatal_shutdown("interrupted by Ctrl-C")
            raise

    def _collect(self, what: str) -> list[Any]:
        """Wait for every device's reply; on the first failure abort the rest (see module doc)."""
        n = self.size
        results: list[Any] = [None] * n
        pending_msgs: list[tuple] = []
        errors: list[tuple[int, tuple]] = []
        deaths: list[DeviceDied] = []
        waiting = set(range(n))
        by_obj = {self._cmd[r]: r for r in range(n)} | {self._procs[r].sentinel: r for r in range(n)}
        grace_deadline: float | None = None
        while waiting:
            objs = [self._cmd[r] for r in waiting] + [self._procs[r].sentinel for r in waiting]
            timeout = None if grace_deadline is None else max(0.0, grace_deadline - time.monotonic())
            ready = mpc.wait(objs, timeout=timeout)
            for obj in ready:
                r = by_obj[obj]
                if r not in waiting:
                    continue
                reply = None
                if obj is self._cmd[r] or self._cmd[r].poll():
                    try:
                        reply = self._cmd[r].recv()
                    except (EOFError, OSError):
                        reply = None
                if reply is None:
                    deaths.append(self._died(r, during=what))
                elif reply[0] == "ok":
                    results[r] = reply[1]
                    if len(reply) > 2 and reply[2]:
                        pending_msgs.extend(reply[2])
                else:
                    errors.append((r, reply[1]))
                waiting.discard(r)
                if (reply is None or reply[0] == "err") and grace_deadline is None:
                    self._raise_abort(r)
                    grace_deadline = time.monotonic() + self.abort_grace
            if grace_deadline is not None and waiting and time.monotonic() >= grace_deadline:
                return self._give_up_on(sorted(waiting), errors, deaths)
        if deaths:
            root = deaths[0]
            self._fatal_shutdown(str(root))
            raise root
        if errors:
            root = self._root_error(errors)
            self._reset()
            raise root
        if what != "trace" and (pending_msgs or self._rings_busy()):
            self._report_unmatched(pending_msgs)
        return results

    def _give_up_on(self, stuck: list[int], errors: list, deaths: list) -> list[Any]:
        stacks = {r: self._stack(r) for r in stuck}
        root = deaths[0] if deaths else self._root_error(errors) if errors else None
        if isinstance(root, CollectiveTimeout) or root is None:
            extra = "".join(f"\n  stack of stuck device {r} {self.mesh.index(r)}:\n{_indent(stacks[r])}" for r in stuck)
            if root is None:
                root = VirtualParError(f"devices {stuck} did not return after an abort{extra}")
            else:
                root = root.replace(str(root) + extra, stacks=stacks)
        self._fatal_shutdown(f"devices {stuck} were stuck and had to be killed")
        raise root

    def _root_error(self, errors: list[tuple[int, tuple]]) -> BaseException:
        """The first failure that was not itself caused by an abort (earliest, then lowest rank)."""
        primary = [e for e in errors if not e[1][3]] or errors
        r, (err, tb, _, _) = min(primary, key=lambda e: (e[1][2], e[0]))
        err.__cause__ = RemoteTraceback(tb)
        return err

    def _reraise(self, packaged: tuple) -> BaseException:
        err, tb, _, _ = packaged
        err.__cause__ = RemoteTraceback(tb)
        return err

    def _raise_abort(self, culprit: int) -> None:
        self._abort[0] = culprit + 1
        for bell in self._doorbells:
            bell.release()

    def _rings_busy(self) -> bool:
        return bool(np.any(self._heads != self._tails))

    def _report_unmatched(self, found: list[tuple]) -> None:
        found = list(found)
        for r in range(self.size):
            found.extend(self._command(r, ("pending",)))
        found = sorted(set(found))
        self._reset()
        if found:
            lines = "\n".join(f"  device {s} -> device {d}, tag {t}: {desc}" for s, d, t, desc in found)
            raise UnmatchedMessages(f"{len(found)} message(s) were sent and never received:\n{lines}", messages=found)

    def _reset(self) -> None:
        """Forget everything in flight after a failed run; every device is idle in its loop."""
        self._heads[:] = 0
        self._tails[:] = 0
        self._abort[0] = 0
        self._host.reset()
        for r in range(self.size):
            self._send(r, ("reset",))
        for r in range(self.size):
            self._finish_command(r, what="the 'reset' command")

    def _stack(self, rank: int) -> str:
        try:
            self._side[rank].send("stack")
            if self._side[rank].poll(1.0):
                return self._side[rank].recv()
        except (OSError, EOFError, BrokenPipeError):
            pass
        return "(the device did not answer)"

    def _died(self, rank: int, during: str) -> DeviceDied:
        proc = self._procs[rank]
        proc.join(0.5)
        code = proc.exitcode
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        elif code is not None:
            how = f"exited with code {code}"
        else:
            how = "stopped answering"
        last = self._recorders[rank].last()
        last_text = last.describe() if last else "no op started"
        return DeviceDied(
            f"device {rank} {self.mesh.index(rank)} (pid {proc.pid}) {how} during {during}; last op: {last_text}"
            f"\n  last ops:\n{format_records(self._recorders[rank].records(), 4)}",
            rank=rank, index=str(self.mesh.index(rank)), exitcode=code,
            signal=signal.Signals(-code).name if code is not None and code < 0 else None, last_op=last_text,
        )

    def _fatal_shutdown(self, reason: str) -> None:
        if self._closed:
            return
        self._fatal = reason
        self._closed = True
        self._kill_all()
        self._release()

    def _kill_all(self) -> None:
        started = [proc for proc in self._procs if proc.pid is not None]
        for proc in started:
            if proc.is_alive():
                proc.kill()
        for proc in started:
            proc.join(5.0)
            try:
                proc.close()
            except ValueError:
                pass

    def _release(self) -> None:
        """Close the pipes and drop every view of the arena, so its memory and fd are freed now."""
        for conn in self._cmd + self._side:
            conn.close()
        if self._recorders:
            self._final_records = [rec.records() for rec in self._recorders]
        self._recorders = []
        self._host = None
        self._heads = self._tails = self._abort = self._clocks = self._counters = None
        self._doorbells = []
        self._arena.close()


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())

