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
        self._clock_slot = clocks[rank : rank + 1]
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
        if type(dst) is not int or not 0 <= dst < self.size or dst == self.rank:  # fast path for plain ints
            self._check_peer(dst, "dst")
        if type(tag) is not int or tag < 0:
            self._check_tag(tag)
        budget = self.config.timeout if timeout is None else self._timeout(timeout)
        slot = self._begin_op(*self._texts.send(x, dst, tag))
        deadline = time.monotonic() + budget
        try:
            inner, flow = self._post_send(x, dst, tag)
        except BaseException:
            self._recorder.finish(slot, self._clock.now, failed=True)
            raise
        return Request(self, inner, "send", dst, tag, deadline, None, slot, flow, budget)

    def irecv(self, src: int, tag: int = 0, out: np.ndarray | None = None, timeout: float | None = None) -> Request:
        """Start receiving the next message from ``src`` with ``tag`` (into ``out`` if given)."""
        if type(src) is not int or not 0 <= src < self.size or src == self.rank:
            self._check_peer(src, "src")
        if type(tag) is not int or tag < 0:
            self._check_tag(tag)
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise UsageError(f"{self.name}: recv(out=...) needs a numpy array, got {type(out).__name__}")
            if not (out.flags.c_contiguous and out.flags.writeable):
                raise UsageError(f"{self.name}: recv(out=...) needs a writeable C-contiguous array")
        budget = self.config.timeout if timeout is None else self._timeout(timeout)
        slot = self._begin_op(*self._texts.recv(src, tag))
        deadline = time.monotonic() + budget
        inner = self._endpoint.irecv(src, tag, out)
        return Request(self, inner, "recv", src, tag, deadline, None, slot, None, budget)

    def send(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        """Send ``x`` to device ``dst``; returns once the message is on its way (buffered)."""
        self.isend(x, dst, tag, timeout).wait()

    def recv(self, src: int, tag: int = 0, out: np.ndarray | None = None, timeout: float | None = None) -> Any:
        """Receive the next message from device ``src`` with ``tag``; FIFO per (src, tag)."""
        return self.irecv(src, tag, out, timeout).wait()

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

    def _check_peer(self, peer: Any, what: str) -> None:
        if isinstance(peer, (bool, np.bool_)) or not isinstance(peer, (int, np.integer)):
            raise UsageError(f"{self.name}: {what} must be a device rank (int), got {peer!r}")
        if not 0 <= peer < self.size:
            raise UsageError(f"{self.name}: {what}={peer} is out of range; ranks are 0..{self.size - 1}")
        if peer == self.rank:
            raise UsageError(f"{self.name}: {what}={peer} is this device itself; send to another rank")

    def _check_tag(self, tag: Any) -> None:
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)) or tag < 0:
            raise UsageError(f"{self.name}: tag must be a non-negative int, got {tag!r}")

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

    def _post_send(self, x: Any, dst: int, tag: int, control: bool = False) -> tuple[Any, str | None]:
        """Stamp and post one message; returns (transport request, trace flow id or None)."""
        flow = None
        stamp = 0.0
        if not control and dst < self.size:
            if self._trace:  # the flow id links the send and recv events of one message in a trace
                flow = f"{self.rank}>{dst}#{self._endpoint.next_seq(dst)}"
            stamp = self._clock.on_send(dst, x.nbytes if isinstance(x, np.ndarray) else 0)
        inner = self._endpoint.isend(x, dst, tag, stamp=stamp, control=control)
        return inner, flow

    def _complete(self, kind: str, peer: int, inner: Any, wall0: float, model0: float, flow: str | None) -> None:
        """Clock and trace bookkeeping once a send or recv completed (in program order)."""
        if peer >= self.size:
            return  # host traffic costs no modelled time
        clock = self._clock
        if kind == "recv":
            header = inner.header
            if header.control:
                return
            nbytes = inner.nbytes
            clock.on_recv(peer, nbytes, inner.stamp)
            self._clock_slot[0] = clock.now  # _publish_clock, inlined
            if self._trace:
                flow = f"{peer}>{self.rank}#{header.seq}"
                self._event("recv", "recv", wall0, model0, clock.now, nbytes=nbytes, peer=peer, flow=flow)
        else:
            # Hockney's model: a send costs its sender alpha + M/beta, charged when it is waited
            # on, so an isend overlapped with compute costs max(compute, transfer), not the sum.
            stamp = inner.stamp
            end = clock.on_send_done(peer, inner.nbytes, stamp)
            self._clock_slot[0] = clock.now
            if self._trace:
                self._event("send", "send", wall0, stamp, end, nbytes=inner.nbytes, peer=peer, flow=flow)

    def mesh_route_time(self, peer: int, nbytes: int) -> float:
        """Modelled seconds of ``nbytes`` from this device to ``peer``: α_route + nbytes / β_route."""
        return self._clock.route_time(peer, nbytes)

    def _publish_clock(self) -> None:
        self._clock_slot[0] = self._clock.now

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
