"""``VirtualCluster``: start one process per device, run SPMD functions on them, and reap them.

Lifecycle::

    with VirtualCluster(Mesh({"dp": 2, "tp": 2})) as cluster:
        results = cluster.run(step, batch)        # step(device, batch) on every device, rank order

Failure handling follows torch's spawn: the first failure is the root cause, raised in the driver
with the remote traceback as its ``__cause__``.  The other devices are aborted, given
``abort_grace`` seconds, and killed if still stuck.  If every device came back, the cluster is reset
and stays usable; if a device died, was stuck or overran ``run_timeout``, the cluster shuts down
and later calls raise ``ClusterClosedError``.

This module is the public API; the mechanism lives in one module per concept:

- :mod:`.startup`: processes, pipes, doorbells and the start-up handshake;
- :mod:`.supervisor`: collecting replies, aborts, the grace, killing the stuck; :mod:`.round`: what
  a round brought and its root cause;
- :mod:`.control`: commands, and the two ends of a failure (reset, fatal shutdown);
- :mod:`.host_link`: ``put`` / ``get`` over the host channel;
- :mod:`.worker`: the device side of all of the above.
"""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import UsageError, VirtualParError
from ..executable import as_executable
from ..mesh import Mesh
from ..transport.shm import Layout, SharedArena
from . import host_link
from .capacity import check_capacity
from .config import (DEFAULT_SCRATCH_BYTES, ClusterConfig, check_fault, check_options, check_sizes,
                     default_ring_bytes)
from .control import ClusterControl
from .fence_kinds import fence_kinds
from .hardware_choice import resolve_hardware
from .output import relay_for
from .recorder import merged_trace
from .startup import check_not_bootstrapping, start_devices
from .shipping import dumps_call as _dumps, resident as _resident
from .stats import TrafficStats
from .worker import device_main

__all__ = ["VirtualCluster", "START_METHODS"]


START_METHODS = ("fork", "forkserver", "spawn")

_created = 0  # clusters this process has begun to start


def clusters_created() -> int:
    """How many clusters this process has begun to start (failed start-ups included): the pytest
    plugin checks for leaks the tests during which this moved."""
    return _created


def as_mesh(mesh: Mesh | int | Mapping[str, int] | tuple) -> Mesh:
    return mesh if isinstance(mesh, Mesh) else Mesh(mesh)


class VirtualCluster:
    """A virtual cluster of ``mesh.size`` device processes on this machine.

    ``mesh``: a :class:`Mesh`, an int (a 1-D mesh) or a dict of axis sizes.
    ``start_method``: "fork" (default on Linux; fastest), "forkserver" or "spawn".
    ``timeout``: seconds any one blocking op may wait (per-call ``timeout=`` overrides).
    ``check_collectives``: compare every collective call across its group first (on by default).
    ``check_nan``: raise when a collective input holds NaN/Inf.  ``trace``: record events for ``trace()``.
    ``ring_bytes``: each channel's ring (default 4 MiB up to 4 devices, 2 MiB up to 8, then 1 MiB).
    ``hardware``: what the modelled clock models: a preset name (``"h100-node"``...), a
    ``Hardware``, or None for the mesh's own topology with the default device.
    ``scratch_bytes``: shared memory per device for shared-memory collectives (the default
    all_reduce reduces straight out of its peers' scratch, ``scratch_bytes`` at a time); 0 turns
    them off.  Pages are backed only when first used.
    ``abort_grace``: seconds to wait for the other devices after a failure before killing them.
    ``run_timeout``: seconds one whole ``run`` may take; None (the default): no limit, as user code
    may compute for long.  (``timeout`` bounds each op, so a device waiting on a peer always gives
    up.)  When it expires, the stacks of the devices still running are taken, those devices are
    killed, the cluster shuts down, and ``run`` raises ``RunTimeout``.
    ``detect_deadlocks``: the driver watches what blocked devices wait for and raises ``Deadlock``
    within tens of milliseconds when they wait on each other with nothing in flight (on by default;
    see runtime/deadlock.py).  The op ``timeout`` stays the backstop.
    ``eager_limit``: strict mode.  None (default): channels buffer sends.  An int: a send of more
    than this many bytes completes only once its matching receive is posted (0: every send), so a
    program that only works because channels buffer deadlocks here, visibly (MPI's eager limit);
    receives may come in any order, as in MPI (``dev.ssend`` is the same check for one send).
    ``shuffle``: an int seed turns on shuffled mode: seeded random pauses before sends and receives
    (transport/shuffle.py), so races show up in tests and the seed reproduces the perturbation.
    ``bind``: run every device on its own share of the cores (on by default; runtime/binding.py).
    ``warm_up``: the devices run their first collectives once, unseen, while the driver goes on, so
    that the user's first ones cost what later ones do; the first call that needs the devices waits
    for it (on by default; runtime/warmup.py).  ``start_line``: every device of a ``run`` begins
    its function once all have been handed it (on by default; runtime/start_line.py).
    ``tag_output``: prefix each line a device prints with ``[rank] `` (mpiexec's --tag-output).  Prints
    reach the driver's ``sys.stdout``/``sys.stderr`` even when those are no file (a notebook, a
    StringIO): ``run`` returns once they are written (runtime/output.py).  ``progress()``, if given,
    is called as each device is ready (a command's progress bar; the library itself never draws).
    """

    def __init__(self, mesh: Mesh | int | Mapping[str, int] | tuple = 1, *, start_method: str = "fork",
                 timeout: float = 60.0, check_collectives: bool = True, check_nan: bool = False,
                 hardware: Any = None, trace: bool = True, ring_bytes: int | None = None,
                 scratch_bytes: int = DEFAULT_SCRATCH_BYTES, abort_grace: float = 2.0,
                 run_timeout: float | None = None, detect_deadlocks: bool = True,
                 eager_limit: int | None = None, shuffle: int | None = None, bind: bool = True,
                 warm_up: bool = True, start_line: bool = True, tag_output: bool = False,
                 progress: Callable[[], None] | None = None) -> None:
        self._ctl: ClusterControl | None = None  # until start-up succeeds
        if not sys.platform.startswith("linux"):  # before anything is allocated: /dev/shm, process_vm_readv
            raise UsageError("virtualpar's runtime runs on Linux only: it needs /dev/shm and "
                             f"process_vm_readv; this is {sys.platform!r}")
        if start_method not in START_METHODS:
            raise UsageError(f"unknown start_method {start_method!r}; choose one of {START_METHODS}")
        check_not_bootstrapping(start_method)
        check_sizes(ring_bytes, scratch_bytes, abort_grace)
        check_options(timeout, run_timeout, eager_limit, shuffle)
        self.mesh = as_mesh(mesh)
        self.size = n = self.mesh.size
        self.layout = Layout(n, ring_bytes or default_ring_bytes(n), scratch_bytes, fence_kinds(self.mesh))
        check_capacity(self.layout)  # before anything is allocated, or any topology of n devices built
        self.start_method = start_method
        self.abort_grace = abort_grace
        self.run_timeout = None if run_timeout is None else float(run_timeout)
        self.hardware, topology, device_spec = resolve_hardware(hardware, self.mesh)
        self.config = ClusterConfig(timeout=float(timeout), check_collectives=check_collectives,
                                    check_nan=check_nan, trace=trace, t0=time.monotonic(),
                                    eager_limit=eager_limit, shuffle=shuffle, bind=bool(bind),
                                    start_line=bool(start_line))
        self.mesh.prepare_groups()  # inherited by every device
        global _created
        _created += 1
        self._arena = SharedArena.create(self.layout.total_bytes)
        self._relay = relay = relay_for(n, start_method, bool(tag_output))
        try:
            from ..sim.clock import DeviceClock

            clocks = [DeviceClock(r, topology, device_spec) for r in range(n)]
            # device_main is looked up here, at call time: tests replace it to fail a start-up
            sup, doorbells, self.pids = start_devices(self.mesh, self.config, self.layout, self._arena,
                                                      start_method, clocks, abort_grace,
                                                      relay.wrap(device_main), progress)
        except BaseException:
            self._arena.close()  # start_devices already reaped whatever it started
            relay.close()
            raise
        relay.started()
        self._ctl = ClusterControl(self.mesh, self.config, self.layout, self._arena, sup, doorbells)
        # dropped unclosed: close it
        weakref.finalize(self, self._ctl.collected, f"VirtualCluster({self.mesh})")
        if detect_deadlocks:
            from .deadlock import DeadlockWatch

            sup.watch = DeadlockWatch(self.mesh, self._arena, self.layout, sup._recorders, doorbells)
        if warm_up and n > 1:
            self._ctl.start_warm_up()

    # -- context and state ------------------------------------------------------------------------
    def __enter__(self) -> "VirtualCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.size} devices, {self.start_method}"
        return f"VirtualCluster({self.mesh}, {state})"

    @property
    def closed(self) -> bool:
        return self._ctl is None or self._ctl.closed

    def close(self) -> None:
        """Stop every device, reap every process, free the shared memory.  Idempotent."""
        if self._ctl is not None:
            self._ctl.close()
            self._relay.close()

    # -- running code -----------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(device, *args, **kwargs)`` on every device (SPMD); results in rank order.

        ``fn`` may be any function: a lambda, a closure, one defined in ``__main__`` or a notebook
        cell (``cloudpickle`` ships it by value when it cannot be imported by name, under every
        start method).  Arguments must be picklable; one that is not is named in the error.

        At most ``run_timeout`` seconds if the cluster has one (then ``RunTimeout``; see the class doc).
        """
        ctl = self._open()
        name = getattr(fn, "__qualname__", repr(fn))
        payload = _dumps(name, fn, args, kwargs)
        try:
            return ctl.broadcast(("run", payload), name, self.run_timeout)
        finally:
            self._relay.sync()  # what the devices printed is written before run returns or raises

    def execute(self, op: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Run an executable on this cluster and return what it returns to the host.

        ``op`` is any :class:`~virtualpar.executable.Executable` — anything with
        ``execute_on(cluster, *args, **kwargs)``: a ``ShardedOperation`` (scatters its inputs by their
        specs, runs, gathers its outputs), a ``MatMul`` or ``FeedForward``, a ``PipelinedOperation`` (one
        training step, returns its loss) — or an object its layer registered an adapter for (a
        ``networkx.DiGraph`` of operations).  The runtime knows nothing of these layers: they drive
        the cluster through ``run``, ``put`` and ``get`` like any user.
        """
        return as_executable(op).execute_on(self, *args, **kwargs)

    def inject(self, rank: int, at_op: int, action: str, **params: Any) -> None:
        """Make device ``rank`` fail at the ``at_op``-th op (1-based) of what it runs next.

        ``action``: "raise" (InjectedFault), "kill" (SIGKILL itself), "exit" (``code=``), "hang"
        (sleep forever, ignoring aborts) or "delay" (``seconds=``, then go on).  An op is any
        send, recv or collective.  Deterministic: no sleeps are needed in tests.  The ops are
        counted in the next run that performs any (an operation's set-up runs perform none); if
        that run ends before the fault's op, it fails with a ``UsageError`` saying so, rather than
        leaving the fault for some later, unrelated run.
        """
        ctl = self._open()
        self._check_rank(rank)
        check_fault(action, params)
        if isinstance(at_op, bool) or not isinstance(at_op, int) or at_op < 1:
            raise UsageError(f"at_op must be a positive int (the k-th op, 1-based), got {at_op!r}")
        ctl.command(rank, ("inject", at_op, action, params))

    # -- data to and from devices -----------------------------------------------------------------
    def put(self, rank: int, key: str, x: Any, block: bool = True) -> None:
        """Place ``x`` in ``device.state[key]`` of device ``rank`` over the host->device channel.

        ``block=False`` returns without waiting for the device to store it (when ``x`` fits in the
        host's channel at once); an error there is raised by the next call that hears from that device
        (or logged as a warning at ``close`` if none does).
        """
        ctl = self._open()
        self._check_rank(rank)
        host_link.put(ctl, rank, key, x, block)

    def get(self, rank: int, key: str) -> Any:
        """Fetch ``device.state[key]`` from device ``rank`` over the device->host channel."""
        ctl = self._open()
        self._check_rank(rank)
        return host_link.get(ctl, rank, key)

    # -- observing --------------------------------------------------------------------------------
    def stats(self) -> TrafficStats:
        """Bytes and messages so far per device pair, host traffic apart (shm collectives: at command end)."""
        return TrafficStats.from_counters(self._open().counters.copy(), self.size)

    def reset_stats(self) -> None:
        self._open().counters[...] = 0

    def resident_memory(self) -> list[dict[str, int]]:
        """Per device, bytes of memory resident now: ``rss`` (every page it maps and has touched,
        shared ones included) and ``pss`` (shared pages divided among their sharers, so the devices'
        ``pss`` add up to what the cluster really holds).  Read from ``/proc/<pid>/smaps_rollup``
        (Linux); a figure the kernel does not report is 0."""
        self._open()
        return [_resident(pid) for pid in self.pids]

    def clocks(self) -> list[float]:
        """Every device's modelled clock (seconds on the virtual hardware since start-up)."""
        return [float(c) for c in self._open().clocks[: self.size]]

    def flight_records(self, rank: int) -> list:
        """Device ``rank``'s last 64 ops (readable even after the device died or the cluster closed)."""
        self._check_rank(rank)
        if not self.closed:
            try:
                self._open()  # after the warm-up, which leaves no records
            except VirtualParError:
                pass  # it failed (and said so): what the devices recorded is what the caller wants now
        return self._ctl.sup.records(rank) if self._ctl is not None else []

    def trace(self, clear: bool = False) -> Any:
        """Every device's events merged into one :class:`~virtualpar.trace.Trace`."""
        replies = self._open().broadcast(("trace", clear), "trace", check_unmatched=False)
        names = {r: f"device {r} {self.mesh.index(r)}" for r in range(self.size)}
        return merged_trace(replies, names, self.config.max_events)

    def clear_trace(self) -> None:
        self._open().broadcast(("clear_trace",), "clear_trace")

    # -- argument checks --------------------------------------------------------------------------
    def _open(self) -> ClusterControl:
        """The control of this cluster; ClusterClosedError (with the reason) once it is closed."""
        if self._ctl is None:  # pragma: no cover - a failed __init__ leaves no object to call
            raise UsageError("this VirtualCluster did not start")
        self._ctl.check_open()
        return self._ctl

    def _check_rank(self, rank: Any) -> None:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.size:
            raise UsageError(f"rank must be a device rank 0..{self.size - 1}, got {rank!r}")
