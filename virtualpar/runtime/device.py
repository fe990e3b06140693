"""``VirtualDevice``: the handle user code receives on every device process.

``cluster.run(fn)`` calls ``fn(device)`` on every device.  The device knows who it is (``rank``,
``index`` on the mesh), keeps ``state`` across runs, moves data point-to-point or through
collectives, and keeps two clocks: ``wall`` (seconds on this machine) and ``clock`` (modelled
seconds on the virtual hardware).  Collective methods validate their arguments here, at the call
site (:mod:`.collective_spec`), then run in :mod:`.collective_call`.

Point-to-point ops (``send``, ``recv``, ``isend``, ``irecv``) come from the :mod:`.p2p` mixin,
``wait_any`` and the probes from :mod:`.probing`.  They, the requests, the collectives and the
worker loop reach the endpoint, the clock, the recorder and the scratch through one object, the
device's :class:`~.core.DeviceCore` (``_core``), never through each other's fields.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import numpy as np

from ..errors import P2PTimeout, UsageError
from ..sim.hardware import dtype_name
from .collective_call import run_collective
from .collective_spec import CollectiveSpec, GroupInfo
from .config import TAG_HOST, ClusterConfig
from .core import DeviceCore
from .fence_kinds import fence_kind
from .p2p import PointToPoint
from .probing import Probing
from .recorder import FlightRecorder

if TYPE_CHECKING:  # pragma: no cover
    from ..mesh import Mesh
    from ..sim.clock import DeviceClock
    from ..transport.endpoint import Endpoint

__all__ = ["VirtualDevice"]

Group = "str | Sequence[str] | None"


class VirtualDevice(PointToPoint, Probing):
    """One device of a virtual cluster, as seen by the code running on it."""

    def __init__(
        self,
        rank: int,
        mesh: "Mesh",
        config: ClusterConfig,
        endpoint: "Endpoint",
        recorders: Mapping[int, FlightRecorder],
        clock: "DeviceClock",
        clocks: np.ndarray,
        scratch: np.ndarray | None = None,
    ) -> None:
        self.rank = rank
        self.mesh = mesh
        self.size = mesh.size
        self.index = mesh.index(rank)
        self.state: dict[str, Any] = {}
        self.config = config
        # what this device's parts share (runtime/core.py); the worker loop, warm-up and start line too
        self._core = DeviceCore(rank, mesh, config, endpoint, recorders, clock, clocks, scratch)
        self._run_ops_from = 0  # op_seq when the current run began: its own ops number above it
        self._groups: dict[Any, GroupInfo] = {}  # resolved group spellings (see _group)

    @property
    def _last_op(self) -> str:
        """What op #``op_seq`` was (the error packaging's "last op")."""
        return self._core.last_op

    # -- identity ---------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._core.name  # "device {rank} {index}"

    def __repr__(self) -> str:
        return f"VirtualDevice(rank={self.rank}, index={self.index}, mesh={self.mesh!r})"

    @property
    def clock(self) -> float:
        """Modelled seconds since the cluster started, on the virtual hardware."""
        return self._core.clock.now

    @property
    def wall(self) -> float:
        """Wall-clock seconds since the cluster started, on this machine."""
        return time.monotonic() - self.config.t0

    @property
    def op_seq(self) -> int:
        """How many communication ops this device has started (the ``op #N`` of error messages)."""
        return self._core.op_seq

    def group(self, group: Group = None) -> tuple[int, ...]:
        """The ranks of this device's group along mesh axes ``group`` (None: every device)."""
        return self.mesh.group_of(self.rank, self.mesh.axes(group))

    def group_rank(self, group: Group = None) -> int:
        """This device's position within ``group``."""
        return self.group(group).index(self.rank)

    # -- compute ----------------------------------------------------------------------------------
    def compute(self, flops: float = 0.0, bytes: float = 0.0, dtype: Any = "float32", name: str = "compute",
                since: float | None = None) -> float:
        """Charge a kernel to the modelled clock: max(flops / peak, bytes / memory bandwidth).

        Returns the modelled seconds charged.  virtualpar's own kernels call this as they run
        (a matmul of (m, k) x (k, n) charges 2mnk flops).  ``since``: the ``dev.wall`` at which the
        work began, when it ran before this charge (as ``dev.matmul``'s does): the trace's wall-clock
        slice then covers the work itself.
        """
        wall0 = time.monotonic() if since is None else since + self.config.t0
        core = self._core
        try:
            start, end = core.clock.compute(flops=flops, nbytes=bytes, dtype=dtype_name(dtype))
        except UsageError as exc:  # the clock knows its rank, not the mesh: say which device, as errors do
            raise exc.replace(exc.message.replace(f"compute on rank {self.rank}", f"{self.name}: compute"),
                              index=str(self.index)) from None
        core.publish_clock()
        if core.trace:
            core.events.compute(name, wall0, start, end, core.op_seq, flops, bytes)
        return end - start

    @contextlib.contextmanager
    def comm_stream(self, since: float | None = None) -> Iterator[None]:
        """Run the calls inside on the modelled clock's communication stream, from ``max(since, its
        last end)`` (``since`` defaults to ``clock``), leaving ``clock`` where it was (see
        :meth:`virtualpar.sim.clock.DeviceClock.begin_stream`)."""
        core = self._core
        core.clock.begin_stream(core.clock.now if since is None else since)
        core.publish_clock()  # what a shared-memory collective's members read as this one's entry
        try:
            yield
        finally:
            core.clock.end_stream()
            core.publish_clock()

    def wait_comm_stream(self) -> float:
        """The compute stream waits for the communication stream: ``clock = max(clock, its end)``."""
        now = self._core.clock.join_stream()
        self._core.publish_clock()
        return now

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` with numpy, charging 2mnk flops to the modelled clock (see :mod:`virtualpar.kernels`)."""
        from ..kernels import matmul

        return matmul(self, a, b)

    # -- collectives (argument checks here; the protocol in collective_call) -----------------------
    def all_reduce(self, x: np.ndarray, op: str = "sum", group: Group = None, algorithm: str | None = None,
                   timeout: float | None = None) -> np.ndarray:
        """Every device of ``group`` gets the elementwise reduction of every device's ``x``."""
        return self._collective("all_reduce", x, group, algorithm, timeout, op=op)

    def all_gather(self, x: np.ndarray, dim: int = 0, group: Group = None, algorithm: str | None = None,
                   timeout: float | None = None) -> np.ndarray:
        """Concatenate every device's ``x`` along ``dim`` in group order (pieces may differ in size)."""
        return self._collective("all_gather", x, group, algorithm, timeout, dim=dim)

    def reduce_scatter(self, x: np.ndarray, dim: int = 0, op: str = "sum", group: Group = None,
                       algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Reduce every device's ``x``, then give position i piece i of ``numpy.array_split(.., n, dim)``."""
        return self._collective("reduce_scatter", x, group, algorithm, timeout, dim=dim, op=op)

    def broadcast(self, x: np.ndarray | None, root: int = 0, group: Group = None,
                  algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Every device gets the root's ``x`` (``root`` is a position in the group; others may pass None)."""
        return self._collective("broadcast", x, group, algorithm, timeout, root=root)

    def reduce(self, x: np.ndarray, root: int = 0, op: str = "sum", group: Group = None,
               algorithm: str | None = None, timeout: float | None = None) -> np.ndarray | None:
        """The root gets the reduction of every device's ``x``; other devices get None."""
        return self._collective("reduce", x, group, algorithm, timeout, root=root, op=op)

    def gather(self, x: np.ndarray, root: int = 0, dim: int = 0, group: Group = None,
               algorithm: str | None = None, timeout: float | None = None) -> np.ndarray | None:
        """The root gets every device's ``x`` concatenated along ``dim``; other devices get None."""
        return self._collective("gather", x, group, algorithm, timeout, root=root, dim=dim)

    def scatter(self, x: np.ndarray | None, root: int = 0, dim: int = 0, group: Group = None,
                algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Position i gets piece i of ``numpy.array_split(x, n, dim)`` of the root's ``x``."""
        return self._collective("scatter", x, group, algorithm, timeout, root=root, dim=dim)

    def all_to_all(self, x: np.ndarray, split_dim: int = 0, concat_dim: int = 0, group: Group = None,
                   algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Piece j of ``x`` split along ``split_dim`` goes to position j; received pieces concatenate
        along ``concat_dim``."""
        return self._collective("all_to_all", x, group, algorithm, timeout, split_dim=split_dim,
                                concat_dim=concat_dim)

    def barrier(self, group: Group = None, algorithm: str | None = None,
                timeout: float | None = None) -> None:
        """Return once every device of ``group`` has entered the barrier (``shm``: one fence over
        shared counters, the default; ``direct``: the dissemination barrier's messages)."""
        self._collective("barrier", None, group, algorithm, timeout)

    def _collective(self, name: str, x: Any, group: Group, algorithm: str | None, timeout: float | None,
                    **params: Any) -> Any:
        core = self._core
        spec = CollectiveSpec.build(core, name, x, self._group(group), algorithm, params)
        timeout = core.timeout if timeout is None else core.budget(timeout)
        return run_collective(core, spec, x if spec.reads_x else None, timeout)

    def _group(self, group: Group) -> GroupInfo:
        """``group`` resolved on the mesh: (axes, ranks, this device's position, description).
        Kept per spelling of ``group`` (the mesh never changes), so a loop of collectives resolves
        its group once; an unhashable spelling (a list of axes) is resolved every time."""
        try:
            info, keep = self._groups.get(group), True
        except TypeError:
            info, keep = None, False
        if info is None:
            axes = self.mesh.axes(group)
            ranks = self.mesh.group_of(self.rank, axes)
            info = GroupInfo(axes, ranks, ranks.index(self.rank), self.mesh.describe_group(axes, ranks),
                             fence_kind(self.mesh, axes))
            if keep:
                self._groups[group] = info
        return info

    # -- the modelled network ----------------------------------------------------------------------
    def mesh_route_time(self, peer: int, nbytes: int) -> float:
        """Modelled seconds of ``nbytes`` from this device to ``peer``: α_route + nbytes / β_route."""
        return self._core.clock.route_time(peer, nbytes)

    # -- host channel (used by the worker loop) -----------------------------------------------------
    def _from_host(self) -> Any:
        req = self._core.endpoint.irecv(self.size, TAG_HOST)
        return req.wait(self.config.timeout, self._host_timeout("receiving from"))

    def _to_host(self, x: Any) -> None:
        req = self._core.endpoint.isend(x, self.size, TAG_HOST)
        req.wait(self.config.timeout, self._host_timeout("sending to"))

    def _host_timeout(self, what: str):
        def build() -> P2PTimeout:
            return P2PTimeout(f"{self.name}: {what} the host did not complete within "
                              f"{self.config.timeout:g} s",
                              rank=self.rank, index=str(self.index), peer=self.size, tag=TAG_HOST,
                              op_seq=self._core.op_seq)
        return build
