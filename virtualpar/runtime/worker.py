"""The main loop of a device process, and its sidecar thread.

A device process serves commands from the driver over its own pipe (``Connection.send`` pickles in
the caller, so nothing is silently lost as with ``multiprocessing.Queue``) until told to close.
A sidecar thread watches the driver: when the driver dies, even by SIGKILL, the device notices
at once (multiprocessing's parent sentinel, a pipe end the driver holds, becomes readable) or within
half a second (its parent pid changes: under ``fork`` a later sibling also holds that pipe) and
exits quietly, whatever it was doing, start-up included (a device that finds its driver gone
raises nothing and prints nothing: a ``BrokenPipeError`` traceback per orphan helped nobody); the
same thread answers "where are you stuck?" requests with the main thread's stack, which works
even while the main thread sleeps in C.
Devices ignore SIGINT: Ctrl-C belongs to the driver, which then reaps them.

After an error reply to a host-channel command (``put``/``get``) the device rings the host's
doorbell: the driver is asleep on it, waiting for the transfer, and would otherwise notice the
error on the pipe only when its wait slice ends (see :mod:`.host_link`).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import pickle
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import blas_threads
from .._words import counted
from ..errors import P2PTimeout, PayloadError, UsageError
from ..transport.endpoint import Endpoint
from ..transport.lazy import Lazy
from ..transport.leftovers import pending
from ..transport.shm import Layout, SharedArena
from .binding import bind
from .config import ClusterConfig
from .packaging import package_error
from .recorder import FlightRecorder
from ..transport.payload import dumps_by_value
from .shipping import ByValue
from .start_line import wait_at_start_line
from .warmup import warm_up

__all__ = ["device_main", "WorkerArgs"]

_PARENT_POLL = 0.5
_HOST_COMMANDS = frozenset({"put", "get"})  # commands whose data crosses the host channel


@dataclass
class WorkerArgs:
    """Everything a device process needs, picklable for spawn/forkserver."""

    rank: int
    mesh: Any
    config: ClusterConfig
    layout: Layout
    arena_name: str
    doorbells: list
    cmd: Any
    side: Any
    clock: Any


def _parent_sentinel() -> Any:
    """multiprocessing's pipe end that becomes readable when the process that started us exits."""
    parent = mp.parent_process()
    return getattr(parent, "sentinel", None) if parent is not None else None


def _driver_gone(ppid: int, sentinel: Any) -> bool:
    if os.getppid() != ppid:
        return True
    try:
        return sentinel is not None and bool(mpc.wait([sentinel], timeout=0))
    except (OSError, ValueError):
        return True


def _sidecar(side: Any, ppid: int, main_ident: int, sentinel: Any) -> None:
    watched = [side] if sentinel is None else [side, sentinel]
    while True:
        if os.getppid() != ppid:
            os._exit(0)  # the driver is gone: nobody will ever collect our results
        try:
            ready = mpc.wait(watched, timeout=_PARENT_POLL)
            if sentinel is not None and sentinel in ready:
                os._exit(0)
            if side not in ready:
                continue
            side.recv()
        except (EOFError, OSError):
            os._exit(0)
        frame = sys._current_frames().get(main_ident)
        stack = _device_stack(frame) if frame is not None else "(no main thread)"
        try:
            side.send(stack)
        except (OSError, ValueError):
            os._exit(0)


def _device_stack(frame: Any) -> str:
    """The main thread's stack from ``device_main`` down (a forked child also has the driver's frames
    above)."""
    frames = traceback.extract_stack(frame)
    starts = [i for i, f in enumerate(frames) if f.name == "device_main"]
    return "".join(traceback.format_list(frames[starts[-1] if starts else 0 :]))


def device_main(args: WorkerArgs, arena: SharedArena) -> None:
    """Entry point of a device process (``arena``: inherited when forked, else rebuilt from the
    descriptor the driver sent).  A device whose driver is gone exits quietly, whatever it was doing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ppid, sentinel = os.getppid(), _parent_sentinel()
    if _driver_gone(ppid, sentinel):
        os._exit(0)  # killed while we started: nobody waits for us
    try:
        _serve(args, arena, ppid, sentinel)
    except BaseException:
        if _driver_gone(ppid, sentinel):
            os._exit(0)  # a broken pipe to a dead driver: nothing to report, nobody to report it to
        raise
    _flush()
    os._exit(0)  # (os._exit skips the flush a normal exit does)


def _serve(args: WorkerArgs, arena: SharedArena, ppid: int, sentinel: Any) -> None:
    threading.Thread(target=_sidecar, args=(args.side, ppid, threading.get_ident(), sentinel), daemon=True,
                     name="virtualpar-sidecar").start()

    from .device import VirtualDevice  # after the fork: keeps start-up imports in one place

    layout = args.layout
    endpoint = Endpoint(args.rank, arena, layout, args.doorbells)
    endpoint.eager_limit = args.config.eager_limit
    if args.config.shuffle is not None:
        from ..transport.shuffle import Shuffle

        endpoint.shuffle = Shuffle(args.config.shuffle, args.rank)
    # every device's flight recorder (read in error reports) and scratch region, viewed on first use
    recorders = Lazy(lambda r: FlightRecorder(arena, layout, r))
    clocks = arena.view(layout.clocks_offset, layout.endpoints, np.float64)
    scratch = arena.view(layout.scratch_data_offset, layout.devices * layout.scratch_stride).reshape(
        layout.devices, layout.scratch_stride)
    dev = VirtualDevice(args.rank, args.mesh, args.config, endpoint, recorders, args.clock, clocks, scratch)
    cmd = args.cmd
    cmd.send(("ready", os.getpid()))
    handlers = _Handlers(dev, endpoint)
    while True:
        try:
            msg = cmd.recv()
        except (EOFError, OSError):
            break
        kind = msg[0]
        if kind == "close":
            cmd.send(("ok", None))
            break
        try:
            reply = getattr(handlers, kind)(*msg[1:])
        except BaseException as exc:  # everything goes back to the driver, never lost
            reply = ("err", package_error(dev, exc))
        endpoint.traffic.settle()  # the counters are read between commands (transport/traffic.py)
        _flush()  # what the device printed goes out before its reply: to a pipe or a file it was buffered
        try:
            cmd.send(reply)
        except Exception as exc:
            reply = ("err",
                     package_error(dev,
                                   PayloadError(f"{dev.name}: the result cannot be sent to the driver: it "
                                                f"cannot be pickled ({exc})")))
            cmd.send(reply)
        if kind in _HOST_COMMANDS and reply[0] == "err":
            # The driver waits for a host transfer asleep on its doorbell and reads this pipe only
            # between sleeps: ring, or the error would wait out the driver's wake slice (0.5 s).
            args.doorbells[layout.host].release()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or replaced by the user: nothing to keep
            pass


class _Handlers:
    """One method per driver command; each returns the reply tuple."""

    def __init__(self, dev: Any, endpoint: Endpoint) -> None:
        self.dev = dev
        self.core = dev._core  # the device's machinery (runtime/core.py): its run count, faults, records
        self.endpoint = endpoint
        self._placed = False

    def _place(self) -> None:
        """Before the warm-up or the first run (a device that never computes skips both): bind to
        our cores, after start-up, which the kernel spreads over the cores faster; then limit BLAS
        threads, so that threads started from now on inherit the binding."""
        self._placed = True
        if self.dev.config.bind:
            bind(self.dev.rank, self.dev.size)
        blas_threads.limit(self.dev.size)

    def run(self, payload: bytes) -> tuple:
        dev, core = self.dev, self.core
        if not self._placed:
            self._place()
        core.run += 1  # first: every device counts every run, even one whose payload fails to load
        dev._run_ops_from = dev.op_seq  # an error before this run's first op must not name an older one
        fn, fargs, fkwargs = pickle.loads(payload)
        name = getattr(fn, "__qualname__", repr(fn))
        if dev.config.start_line:
            wait_at_start_line(dev, core.run)
        slot = core.recorder.start(dev.op_seq, f"run {name}() [user code]", dev.clock, core.run)
        try:
            result = fn(dev, *fargs, **fkwargs)
            dev.wait_comm_stream()  # the run's modelled time includes its communication stream
        except BaseException:
            core.recorder.finish(slot, dev.clock, failed=True)
            raise
        core.recorder.finish(slot, dev.clock)
        if core.faults and dev.op_seq > dev._run_ops_from:  # a fault this run's ops never reached
            due = min(core.faults) - dev._run_ops_from
            core.faults.clear()
            raise UsageError(f"{dev.name}: a fault injected at op {due} of this run did not "
                             "fire: the run ended after "
                             f"{counted(dev.op_seq - dev._run_ops_from, 'op')}", rank=dev.rank,
                             index=str(dev.index))
        try:  # fail here, with a clear message, rather than in cmd.send
            pickle.dumps(result)
        except Exception as exc:
            try:  # a class brought by value (a script's __main__, a notebook) goes by value again
                result = ByValue(dumps_by_value(result))
            except Exception:
                raise PayloadError(f"{dev.name}: the result of {name}() cannot be sent to "
                                   "the driver: it cannot be "
                                   f"pickled ({exc})", rank=dev.rank, index=str(dev.index)) from None
        self.endpoint.flush_control(dev.config.timeout, lambda: P2PTimeout(
            f"{dev.name}: at the end of {name}(), could not write the acknowledgements "
            "its peers wait for within "
            f"{dev.config.timeout:g} s (their rings stayed full)", rank=dev.rank, index=str(dev.index)))
        self.endpoint.drain()
        return ("ok", result, self._pending())

    def warm(self) -> tuple:
        self._place()
        warm_up(self.dev)
        return ("ok", None)

    def inject(self, at_op: int, action: str, params: dict) -> tuple:
        self.core.faults[self.dev.op_seq + at_op] = (action, params)
        return ("ok", None)

    def put(self, key: str) -> tuple:
        self.dev.state[key] = self.dev._from_host()
        return ("ok", None)

    def get(self, key: str) -> tuple:
        if key not in self.dev.state:
            dev = self.dev  # the caller's mistake, not user code on the device: no "last op" of an older run
            raise UsageError(f"cluster.get({dev.rank}, {key!r}): {dev.name} has no state[{key!r}]; it holds "
                             f"{sorted(dev.state)}", rank=dev.rank, index=str(dev.index))
        self.dev._to_host(self.dev.state[key])
        return ("ok", None)

    def _pending(self) -> list[tuple[int, int, int, str]]:
        return pending(self.endpoint)

    def pending(self) -> tuple:
        self.endpoint.drain()
        return ("ok", self._pending())

    def reset(self) -> tuple:
        self.endpoint.reset()
        self.core.group_seq.clear()
        self.core.faults.clear()
        return ("ok", None)

    def trace(self, clear: bool) -> tuple:
        log = self.core.events
        reply = ("ok", (list(log), log.dropped))
        if clear:
            log.clear()
        return reply

    def clear_trace(self) -> tuple:
        self.core.events.clear()
        return ("ok", None)
