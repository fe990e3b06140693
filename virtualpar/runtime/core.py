"""``DeviceCore``: the one object a device's parts share, passed to each of them explicitly.

A :class:`~virtualpar.runtime.device.VirtualDevice` is the handle user code holds; what moves its
messages and keeps its books is this core, built once per device process::

    VirtualDevice ── p2p (PointToPoint), probing (Probing)   ┐
    Request (requests.py), GroupComm (group_comm.py)         ├── DeviceCore ── Endpoint (transport/)
    run_collective (collective_call.py), loopback.py         │                 DeviceClock (sim/)
    warm-up, start line, worker loop                         ┘                 FlightRecorder, EventLog

It holds the endpoint (and its arrival counters and receive pool), the modelled clock and the slot
it is published in, the flight recorders, the trace's event log, the shared-memory scratch, and the
op bookkeeping: ``op_seq`` (the ``op #N`` of error messages), the run count and injected faults.
Its methods are the bookkeeping every op shares, each a handful of attribute reads:
:meth:`begin_op` (count, record, fire a fault due), :meth:`sent` / :meth:`received` (the modelled
clock in program order, the trace event, the record's end), :meth:`post_send` and :meth:`wait`.
No part reads another part's fields: each reads the core's.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ..errors import InjectedFault, P2PTimeout, UsageError
from ..transport.channel import FLAG_CONTROL
from ..transport.lazy import Lazy
from .event_log import EventLog
from .recorder import FlightRecorder, OpTexts, format_records

if TYPE_CHECKING:  # pragma: no cover
    from ..mesh import Mesh
    from ..sim.clock import DeviceClock
    from ..transport.endpoint import Endpoint
    from .config import ClusterConfig

__all__ = ["DeviceCore"]

Flow = "tuple[int, int, int, int] | None"  # a trace flow id: (src, dst, message number, resets)


class DeviceCore:
    """The endpoint, clock, recorder, trace and scratch of one device, and its op bookkeeping."""

    __slots__ = ("rank", "size", "name", "index", "mesh", "config", "timeout", "trace",
                 "endpoint", "arrivals", "pool", "clock", "clock_slot", "recorder", "recorders", "events",
                 "texts", "scratch", "scratch_table", "scratch_bytes",
                 "op_seq", "last_op", "run", "faults", "group_seq", "specs")

    def __init__(self, rank: int, mesh: "Mesh", config: "ClusterConfig", endpoint: "Endpoint",
                 recorders: Mapping[int, FlightRecorder], clock: "DeviceClock", clocks: np.ndarray,
                 scratch: np.ndarray | None = None) -> None:
        self.rank = rank
        self.size = mesh.size
        self.index = mesh.index(rank)
        self.name = f"device {rank} {self.index}"
        self.mesh = mesh
        self.config = config
        self.timeout = config.timeout  # an op's default budget, in seconds (the config is frozen)
        self.trace = config.trace
        self.endpoint = endpoint
        self.arrivals = endpoint.arrivals  # the fences' counters in the arena (transport/arrivals.py)
        self.pool = endpoint.pool  # receive buffers; shared-memory collectives' results too
        self.clock = clock
        self.clock_slot = memoryview(clocks[rank : rank + 1])  # where the driver reads our modelled clock
        self.recorders = recorders
        self.recorder = recorders[rank]
        self.events = EventLog(rank, config.max_events, config.t0)
        self.texts = OpTexts()  # flight-recorder texts of recent sends and receives
        # every device's scratch region (shm collectives): row r is device r's, viewed on first use
        self.scratch_table = scratch
        self.scratch_bytes = endpoint.layout.scratch_bytes  # of each device's region
        self.scratch: Any = [] if scratch is None else \
            Lazy(lambda r: scratch[r, : endpoint.layout.scratch_bytes])
        self.op_seq = 0
        self.last_op = ""  # what op #op_seq was, for error messages
        self.run = 0  # how many cluster.run calls this device has served (the same on every device)
        self.faults: dict[int, tuple[str, dict[str, Any]]] = {}  # op number -> injected fault
        self.group_seq: dict[int, int] = {}  # collective calls per group kind (collective_call.py)
        self.specs: dict[tuple, Any] = {}  # validated collective calls (CollectiveSpec.build)

    # -- ops: count, record, fire faults ----------------------------------------------------------
    def begin_op(self, text: str, raw: bytes | None = None) -> int:
        """Count an op, record it, and fire an injected fault due at it (``raw``: ``text``
        encoded, if known); returns its flight-recorder slot."""
        seq = self.op_seq = self.op_seq + 1
        self.last_op = text
        slot = self.recorder.start(seq, text if raw is None else raw, self.clock.now, self.run)
        if self.faults:
            fault = self.faults.pop(seq, None)
            if fault is not None:
                self._fire(fault, text)
        return slot

    def fail(self, slot: int) -> None:
        """Record the op in ``slot`` as failed, now."""
        self.recorder.finish(slot, self.clock.now, failed=True)

    def _fire(self, fault: tuple[str, dict[str, Any]], text: str) -> None:
        action, params = fault
        if action == "raise":
            raise InjectedFault(f"injected fault on {self.name} at op #{self.op_seq} ({text})",
                                rank=self.rank, op_seq=self.op_seq)
        if action == "delay":
            time.sleep(float(params.get("seconds", 1.0)))
        elif action == "exit":
            os._exit(int(params.get("code", 3)))
        elif action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "hang":
            while True:  # a stuck device: ignores aborts; the driver has to kill it
                time.sleep(3600)

    def budget(self, timeout: Any) -> float:
        """An op's ``timeout`` argument as seconds (None: the cluster's default), or ``UsageError``."""
        if timeout is None:
            return self.timeout
        number = isinstance(timeout, (int, float, np.integer, np.floating))
        if isinstance(timeout, (bool, np.bool_)) or not number or not timeout > 0:
            raise UsageError(f"{self.name}: timeout must be positive seconds, got {timeout!r}")
        return float(timeout)

    def publish_clock(self) -> None:
        self.clock_slot[0] = self.clock.now

    # -- messages: post, wait, and the books once complete ----------------------------------------
    def post_send(self, x: Any, dst: int, tag: int, sync: bool = False) -> tuple[Any, Flow]:
        """Stamp and post one message; returns (transport request, trace flow id or None).  A flow
        id is (src, dst, message number, resets), formatted only when the trace is read."""
        ep = self.endpoint
        flow = None
        if self.trace:  # the flow id links the send and recv events of one message in a trace
            flow = (self.rank, dst, ep.next_seq(dst), ep.resets)
        return ep.isend(x, dst, tag, on_send=self.clock.on_send, sync=sync), flow

    def wait(self, inner: Any, slot: int | None, timeout: float, on_timeout: Any) -> Any:
        """Wait for a transport request (at most ``timeout`` s); a failed wait is recorded as such."""
        try:
            return inner.wait(timeout, on_timeout)
        except BaseException:
            if slot is not None:
                self.fail(slot)
            raise

    def sent(self, dst: int, inner: Any, slot: int | None, wall0: float, flow: Any) -> None:
        """Clock, trace and record once a send completed (in program order).

        Hockney's model: a send costs its sender alpha + M/beta, charged when it is waited on, so
        an isend overlapped with compute costs max(compute, transfer), not the sum."""
        clock = self.clock
        stamp = inner.stamp
        end = clock.on_send_done(dst, inner.nbytes, stamp)
        now = self.clock_slot[0] = clock.now  # publish_clock, inlined
        if self.trace:
            self.events.message("send", wall0, stamp, end, self.op_seq, inner.nbytes, dst, flow)
        if slot is not None:
            self.recorder.finish(slot, now)

    def received(self, inner: Any, slot: int | None, wall0: float, model0: float) -> None:
        """Clock, trace and record once a receive completed (in program order): the modelled
        clock moves to the message's arrival (see ``DeviceClock.on_recv``)."""
        src = inner.src  # the actual source of a receive from ANY_SOURCE
        header = inner.header
        clock = self.clock
        if not header.kind & FLAG_CONTROL:  # the runtime's own messages cost no modelled time
            nbytes = header.nbytes
            clock.on_recv(src, nbytes, header.stamp)
            self.clock_slot[0] = clock.now
            if self.trace:
                self.events.message("recv", wall0, model0, clock.now, self.op_seq, nbytes, src,
                                    (src, self.rank, header.seq, self.endpoint.resets))
        if slot is not None:
            self.recorder.finish(slot, clock.now)

    def p2p_error(self, what: str, peer: int, tag: int, budget: float, after: str = "") -> P2PTimeout:
        """The error of a send/recv that did not complete within ``budget`` s, with both ends'
        flight records; ``after`` says what became of the operation."""
        where = dict(rank=self.rank, index=str(self.index), peer=peer, tag=tag, op_seq=self.op_seq)
        if peer < 0:  # a receive from ANY_SOURCE: no one peer to show
            return P2PTimeout(f"{self.name}: {what} any source (tag {'any' if tag < 0 else tag}) did not "
                              f"complete within {budget:g} s (op #{self.op_seq}).{after}", **where)
        records = {r: self.recorders[r].records() for r in (self.rank, peer)}
        return P2PTimeout(
            f"{self.name}: {what} device {peer} (tag {tag}) did not complete within {budget:g} s "
            f"(op #{self.op_seq}).{after}\n  device {peer} {self.mesh.index(peer)} last ops:\n"
            f"{format_records(records[peer], 4)}", flight_records=records, **where)
