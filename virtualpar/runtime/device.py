"""``VirtualDevice``: the handle user code receives on every device process.

``cluster.run(fn)`` calls ``fn(device)`` on every device.  The device knows who it is (``rank``,
``index`` on the mesh), keeps ``state`` across runs, moves data point-to-point or through
collectives, and keeps two clocks: ``wall`` (seconds on this machine) and ``clock`` (modelled
seconds on the virtual hardware).  Collective methods validate their arguments here, at the call
site, then delegate to :mod:`virtualpar.runtime.collective_call`.

Cost of a point-to-point op beyond the transport: a handful of type checks, one flight-recorder
write at start and one at the end, the modelled-clock update (route figures cached per peer in the
clock) and one ``time.monotonic`` for the deadline.  The flight-recorder text of a send or receive
is formatted once per (peer, tag, shape, dtype) and reused: formatting a dtype alone costs ~2 µs.
Trace events and their flow ids are built only when ``trace`` is on.
"""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import InjectedFault, P2PTimeout, UsageError
from ..transport.channel import FLAG_CONTROL
from .collective_call import CollectiveSpec, run_collective
from .config import TAG_HOST, ClusterConfig
from .recorder import EventLog, FlightRecorder, OpTexts, format_records
from .requests import Request

if TYPE_CHECKING:  # pragma: no cover
    from ..mesh import Mesh
    from ..sim.clock import DeviceClock
    from ..transport.endpoint import Endpoint

__all__ = ["VirtualDevice"]

Group = "str | Sequence[str] | None"


class VirtualDevice:
    """One device of a virtual cluster, as seen by the code running on it."""

    def __init__(
        self,
        rank: int,
        mesh: "Mesh",
        config: ClusterConfig,
        endpoint: "Endpoint",
        recorders: list[FlightRecorder],
        clock: "DeviceClock",
        clocks: np.ndarray,
        scratch: list[np.ndarray] | None = None,
    ) -> None:
        self.rank = rank
        self.mesh = mesh
        self.size = mesh.size
        self.index = mesh.index(rank)
        self.state: dict[str, Any] = {}
        self.config = config
        self._endpoint = endpoint
        self._recorders = recorders
        self._recorder = recorders[rank]
        self._clock = clock
        self._clocks = clocks  # every endpoint's published modelled clock (shared memory)
        self._clock_mv = memoryview(clocks[rank : rank + 1])  # this device's slot (cheaper to store through)
        self._scratch = scratch or []  # every device's shared scratch region, for shm collectives
        self._trace = config.trace
        self._texts = OpTexts()  # flight-recorder texts of recent sends and receives
        self._op_seq = 0
        self._last_op = ""  # what op #_op_seq was, for error messages
        self._run = 0  # how many cluster.run calls this device has served (same on every device)
        self._group_seq: dict[tuple[int, ...], int] = {}
        self._faults: dict[int, tuple[str, dict[str, Any]]] = {}
        self._events = EventLog(rank)
        self._events_dropped = 0

    # -- identity ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return f"device {self.rank} {self.index}"

    def __repr__(self) -> str:
        return f"VirtualDevice(rank={self.rank}, index={self.index}, mesh={self.mesh!r})"

    @property
    def clock(self) -> float:
        """Modelled seconds since the cluster started, on the virtual hardware."""
        return self._clock.now

    @property
    def wall(self) -> float:
        """Wall-clock seconds since the cluster started, on this machine."""
        return time.monotonic() - self.config.t0

    @property
    def op_seq(self) -> int:
        """How many communication ops this device has started (the ``op #N`` of error messages)."""
        return self._op_seq

    def group(self, group: Group = None) -> tuple[int, ...]:
        """The ranks of this device's group along mesh axes ``group`` (None: every device)."""
        return self.mesh.group_of(self.rank, self.mesh.axes(group))

    def group_rank(self, group: Group = None) -> int:
        """This device's position within ``group``."""
        return self.group(group).index(self.rank)

    # -- compute ----------------------------------------------------------------------------------
    def compute(self, flops: float = 0.0, bytes: float = 0.0, dtype: Any = "float32", name: str = "compute") -> float:
        """Charge a kernel to the modelled clock: max(flops / peak, bytes / memory bandwidth).

        Returns the modelled seconds charged.  virtualpar's own kernels call this as they run
        (a matmul of (m, k) x (k, n) charges 2mnk flops).
        """
        wall0 = time.monotonic()
        start, end = self._clock.compute(flops=flops, nbytes=bytes, dtype=str(np.dtype(dtype)))
        self._publish_clock()
        self._event("compute", name, wall0, start, end, args=(("flops", float(flops)), ("bytes", float(bytes))))
        return end - start

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` with numpy, charging 2mnk flops to the modelled clock (see :mod:`virtualpar.kernels`)."""
        from ..kernels import matmul

        return matmul(self, a, b)

    # -- point to point ---------------------------------------------------------------------------
    def isend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> Request:
        """Start sending ``x`` (an array travels raw; any other picklable object is pickled)."""
        if type(dst) is not int or not 0 <= dst < self.size or dst == self.rank or type(tag) is not int or tag < 0:
            self._check_p2p(dst, tag, "dst")  # the fast test above passes plain valid ints only
        budget = self.config.timeout if timeout is None else self._timeout(timeout)
        slot = self._begin_op(*self._texts.send(x, dst, tag))
        deadline = time.monotonic() + budget
        inner, flow = self._post_send_or_fail(x, dst, tag, slot)
        return Request(self, inner, "send", dst, tag, deadline, None, slot, flow, budget)

    def irecv(self, src: int, tag: int = 0, out: np.ndarray | None = None, timeout: float | None = None) -> Request:
        """Start receiving the next message from ``src`` with ``tag`` (into ``out`` if given)."""
        if type(src) is not int or not 0 <= src < self.size or src == self.rank or type(tag) is not int or tag < 0:
            self._check_p2p(src, tag, "src")
        if out is not None:
            self._check_out(out)
        budget = self.config.timeout if timeout is None else self._timeout(timeout)
        slot = self._begin_op(*self._texts.recv(src, tag))
        deadline = time.monotonic() + budget
        inner = self._endpoint.irecv(src, tag, out)
        return Request(self, inner, "recv", src, tag, deadline, None, slot, None, budget)

    def send(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        """Send ``x`` to device ``dst``; returns once the message is on its way (buffered).

        The same op as ``isend(x, dst, tag).wait()``, minus the handle.  Unless a fault is
        injected or tracing is on, the op is recorded just *after* it is posted: the flight-recorder
        write then overlaps with the receiver's work instead of delaying the message (a small send
        is complete once posted, so no reader can see it pending in between).
        """
        if type(dst) is not int or not 0 <= dst < self.size or dst == self.rank or type(tag) is not int or tag < 0:
            self._check_p2p(dst, tag, "dst")
        budget = self.config.timeout if timeout is None else self._timeout(timeout)
        if self._faults or self._trace:
            self.isend(x, dst, tag, budget).wait()  # a fault due at this op fires before anything is posted
            return
        try:
            inner = self._endpoint.isend(x, dst, tag, self._clock.on_send(dst, x.nbytes if isinstance(x, np.ndarray) else 0))
        except BaseException:
            self._recorder.finish(self._begin_op(*self._texts.send(x, dst, tag)), self._clock.now, failed=True)
            raise
        slot = self._begin_op(*self._texts.send(x, dst, tag))
        if not inner.done:
            self._await(inner, slot, budget, lambda: self._p2p_error("send to", dst, tag, budget))
        self._sent(dst, inner, slot, 0.0, None)

    def recv(self, src: int, tag: int = 0, out: np.ndarray | None = None, timeout: float | None = None) -> Any:
        """Receive the next message from device ``src`` with ``tag``; FIFO per (src, tag).

        The same op as ``irecv(src, tag, out).wait()``, without the handle."""
        if type(src) is not int or not 0 <= src < self.size or src == self.rank or type(tag) is not int or tag < 0:
            self._check_p2p(src, tag, "src")
        if out is not None:
            self._check_out(out)
        budget = self.config.timeout if timeout is None else self._timeout(timeout)
        slot = self._begin_op(*self._texts.recv(src, tag))
        wall0, model0 = (time.monotonic(), self._clock.now) if self._trace else (0.0, 0.0)
        inner = self._endpoint.irecv(src, tag, out)
        value = self._await(inner, slot, budget, lambda: self._p2p_error("recv from", src, tag, budget))
        self._received(src, inner, slot, wall0, model0)
        return value

    # -- collectives (argument checks here; the protocol in collective_call) -----------------------
    def all_reduce(self, x: np.ndarray, op: str = "sum", group: Group = None, algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Every device of ``group`` gets the elementwise reduction of every device's ``x``."""
        return self._collective("all_reduce", x, group, algorithm, timeout, op=op)

    def all_gather(self, x: np.ndarray, dim: int = 0, group: Group = None, algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Concatenate every device's ``x`` along ``dim`` in group order (pieces may differ in size)."""
        return self._collective("all_gather", x, group, algorithm, timeout, dim=dim)

    def reduce_scatter(self, x: np.ndarray, dim: int = 0, op: str = "sum", group: Group = None, algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Reduce every device's ``x``, then give position i piece i of ``numpy.array_split(.., n, dim)``."""
        return self._collective("reduce_scatter", x, group, algorithm, timeout, dim=dim, op=op)

    def broadcast(self, x: np.ndarray | None, root: int = 0, group: Group = None, algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Every device gets the root's ``x`` (``root`` is a position in the group; others may pass None)."""
        return self._collective("broadcast", x, group, algorithm, timeout, root=root)

    def reduce(self, x: np.ndarray, root: int = 0, op: str = "sum", group: Group = None, algorithm: str | None = None, timeout: float | None = None) -> np.ndarray | None:
        """The root gets the reduction of every device's ``x``; other devices get None."""
        return self._collective("reduce", x, group, algorithm, timeout, root=root, op=op)

    def gather(self, x: np.ndarray, root: int = 0, dim: int = 0, group: Group = None, algorithm: str | None = None, timeout: float | None = None) -> np.ndarray | None:
        """The root gets every device's ``x`` concatenated along ``dim``; other devices get None."""
        return self._collective("gather", x, group, algorithm, timeout, root=root, dim=dim)

    def scatter(self, x: np.ndarray | None, root: int = 0, dim: int = 0, group: Group = None, algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Position i gets piece i of ``numpy.array_split(x, n, dim)`` of the root's ``x``."""
        return self._collective("scatter", x, group, algorithm, timeout, root=root, dim=dim)

    def all_to_all(self, x: np.ndarray, split_dim: int = 0, concat_dim: int = 0, group: Group = None, algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Piece j of ``x`` split along ``split_dim`` goes to position j; received pieces concatenate along ``concat_dim``."""
        return self._collective("all_to_all", x, group, algorithm, timeout, split_dim=split_dim, concat_dim=concat_dim)

    def barrier(self, group: Group = None, timeout: float | None = None) -> None:
        """Return once every device of ``group`` has entered the barrier."""
        self._collective("barrier", None, group, None, timeout)

    def _collective(self, name: str, x: Any, group: Group, algorithm: str | None, timeout: float | None, **params: Any) -> Any:
        axes = self.mesh.axes(group)
        ranks = self.mesh.group_of(self.rank, axes)
        spec = CollectiveSpec.build(self, name, x, axes, ranks, algorithm, params)
        return run_collective(self, spec, self._timeout(timeout))

    # -- internals shared with collective_call ----------------------------------------------------
    def _timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self.config.timeout
        if not timeout > 0:
            raise UsageError(f"{self.name}: timeout must be positive seconds, got {timeout!r}")
        return float(timeout)

    def _check_p2p(self, peer: Any, tag: Any, what: str) -> None:
        """Raise ``UsageError`` for a bad peer rank or tag (the callers' fast test failed)."""
        if isinstance(peer, (bool, np.bool_)) or not isinstance(peer, (int, np.integer)):
            raise UsageError(f"{self.name}: {what} must be a device rank (int), got {peer!r}")
        if not 0 <= peer < self.size:
            raise UsageError(f"{self.name}: {what}={peer} is out of range; ranks are 0..{self.size - 1}")
        if peer == self.rank:
            raise UsageError(f"{self.name}: {what}={peer} is this device itself; send to another rank")
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or tag < 0:
            raise UsageError(f"{self.name}: tag must be a non-negative int, got {tag!r}")

    def _check_out(self, out: Any) -> None:
        if not isinstance(out, np.ndarray):
            raise UsageError(f"{self.name}: recv(out=...) needs a numpy array, got {type(out).__name__}")
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise UsageError(f"{self.name}: recv(out=...) needs a writeable C-contiguous array")

    def _begin_op(self, text: str, raw: bytes | None = None) -> int:
        """Count an op, record it, and fire an injected fault due at it (``raw``: ``text`` encoded, if known)."""
        seq = self._op_seq = self._op_seq + 1
        self._last_op = text
        slot = self._recorder.start(seq, text if raw is None else raw, self._clock.now, self._run)
        if self._faults:
            fault = self._faults.pop(seq, None)
            if fault is not None:
                self._fire(fault, text)
        return slot

    def _fire(self, fault: tuple[str, dict[str, Any]], text: str) -> None:
        action, params = fault
        if action == "raise":
            raise InjectedFault(f"injected fault on {self.name} at op #{self._op_seq} ({text})", rank=self.rank, op_seq=self._op_seq)
        if action == "delay":
            time.sleep(float(params.get("seconds", 1.0)))
        elif action == "exit":
            os._exit(int(params.get("code", 3)))
        elif action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "hang":
            while True:  # a stuck device: ignores aborts; the driver has to kill it
                time.sleep(3600)

    def _post_send(self, x: Any, dst: int, tag: int) -> tuple[Any, str | None]:
        """Stamp and post one message; returns (transport request, trace flow id or None)."""
        flow = None
        if self._trace:  # the flow id links the send and recv events of one message in a trace
            flow = f"{self.rank}>{dst}#{self._endpoint.next_seq(dst)}"
        stamp = self._clock.on_send(dst, x.nbytes if isinstance(x, np.ndarray) else 0)
        return self._endpoint.isend(x, dst, tag, stamp), flow

    def _post_send_or_fail(self, x: Any, dst: int, tag: int, slot: int) -> tuple[Any, str | None]:
        """``_post_send`` for a user-level op: a send that cannot be posted is recorded as failed."""
        try:
            return self._post_send(x, dst, tag)
        except BaseException:
            self._recorder.finish(slot, self._clock.now, failed=True)
            raise

    def _await(self, inner: Any, slot: int | None, timeout: float, on_timeout: Any) -> Any:
        """Wait for a transport request (at most ``timeout`` s); a failed wait is recorded as such."""
        try:
            return inner.wait(timeout, on_timeout)
        except BaseException:
            if slot is not None:
                self._recorder.finish(slot, self._clock.now, failed=True)
            raise

    def _sent(self, dst: int, inner: Any, slot: int | None, wall0: float, flow: str | None) -> None:
        """Clock, trace and record once a send completed (in program order).

        Hockney's model: a send costs its sender alpha + M/beta, charged when it is waited on, so
        an isend overlapped with compute costs max(compute, transfer), not the sum."""
        clock = self._clock
        stamp = inner.stamp
        end = clock.on_send_done(dst, inner.nbytes, stamp)
        now = self._clock_mv[0] = clock.now  # _publish_clock, inlined
        if self._trace:
            self._event("send", "send", wall0, stamp, end, nbytes=inner.nbytes, peer=dst, flow=flow)
        if slot is not None:
            self._recorder.finish(slot, now)

    def _received(self, src: int, inner: Any, slot: int | None, wall0: float, model0: float) -> None:
        """Clock, trace and record once a receive completed (in program order): the modelled
        clock moves to the message's arrival (see ``DeviceClock.on_recv``)."""
        header = inner.header
        clock = self._clock
        if not header.kind & FLAG_CONTROL:  # the runtime's own messages cost no modelled time
            nbytes = header.nbytes
            clock.on_recv(src, nbytes, header.stamp)
            self._clock_mv[0] = clock.now
            if self._trace:
                flow = f"{src}>{self.rank}#{header.seq}"
                self._event("recv", "recv", wall0, model0, clock.now, nbytes=nbytes, peer=src, flow=flow)
        if slot is not None:
            self._recorder.finish(slot, clock.now)

    def mesh_route_time(self, peer: int, nbytes: int) -> float:
        """Modelled seconds of ``nbytes`` from this device to ``peer``: α_route + nbytes / β_route."""
        return self._clock.route_time(peer, nbytes)

    def _publish_clock(self) -> None:
        self._clock_mv[0] = self._clock.now

    def _event(self, kind: str, name: str, wall0: float, model0: float, model1: float, **fields: Any) -> None:
        if not self.config.trace:
            return
        if len(self._events) >= self.config.max_events:
            self._events_dropped += 1
            return
        t0 = self.config.t0
        self._events.add(kind, name, wall0 - t0, time.monotonic() - t0, model0, model1, self._op_seq, fields)

    def _p2p_error(self, what: str, peer: int, tag: int, budget: float) -> P2PTimeout:
        """The error of a send/recv that did not complete within ``budget`` s, with both ends' flight records."""
        records = {r: self._recorders[r].records() for r in (self.rank, peer)}
        return P2PTimeout(
            f"{self.name}: {what} device {peer} (tag {tag}) did not complete within {budget:g} s "
            f"(op #{self._op_seq}).\n  device {peer} {self.mesh.index(peer)} last ops:\n{format_records(records[peer], 4)}",
            rank=self.rank, index=str(self.index), peer=peer, tag=tag, op_seq=self._op_seq, flight_records=records,
        )

    # -- host channel (used by the worker loop) -----------------------------------------------------
    def _from_host(self) -> Any:
        req = self._endpoint.irecv(self.size, TAG_HOST)
        return req.wait(self.config.timeout, self._host_timeout("receiving from"))

    def _to_host(self, x: Any) -> None:
        self._endpoint.isend(x, self.size, TAG_HOST).wait(self.config.timeout, self._host_timeout("sending to"))

    def _host_timeout(self, what: str):
        def build() -> P2PTimeout:
            return P2PTimeout(f"{self.name}: {what} the host did not complete within {self.config.timeout:g} s",
                              rank=self.rank, index=str(self.index), peer=self.size, tag=TAG_HOST, op_seq=self._op_seq)
        return build
