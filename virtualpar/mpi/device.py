"""``MPIDevice``: the device protocol over mpi4py, so a ``step(dev)`` written for the emulator runs
unchanged under ``mpiexec -n N python -m virtualpar run script.py:step --mesh dp=2,tp=4``.

* Mesh axes map to sub-communicators: ``Split`` by the coordinates off the axes, for every set of
  axes when the device is made (a second, private ``Dup`` carries virtualpar's own algorithms when
  ``algorithm=`` names one).
* Every wait has the op timeout (:mod:`virtualpar.mpi.waiting`), and every collective checks that
  its members make the same call: under MPI these mistakes would wait forever.
* Arrays move with buffer calls: a small pickled header (shape, dtype, the departure stamp on the
  modelled clock), then ``Send``/``Isend`` of the array itself; other objects are pickled.
  A blocking send to oneself is posted non-blocking and completed by the matching receive, so a
  device may message itself as on the emulator.
* Receives match messages as MPI does, in posting order: the device keeps its posted receives
  (``irecv``, and a blocking ``recv`` while it waits) and, whenever it waits on anything, probes
  for them in posting order and hands a message to the earliest one it fits
  (:mod:`virtualpar.mpi.matching`).
* Collectives map to MPI's own (:mod:`virtualpar.mpi.collectives`).
* The modelled clock is the emulator's ``DeviceClock`` on the mesh's hardware: sends and receives
  are charged from the stamps exactly as on the emulator, compute from the roofline.
* Every op is recorded as a trace :class:`~virtualpar.trace.event.Event` and its bytes counted per
  destination; :meth:`MPIDevice.report` hands rank 0 what ``cluster.run`` would return (see
  :func:`collect`).

Requires mpi4py; importing this module without it raises ImportError with the install hint.
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
import time
from typing import Any, Iterator

import numpy as np

try:
    from mpi4py import MPI
except ImportError as exc:  # pragma: no cover - exercised only without mpi4py
    raise ImportError("the MPI backend needs mpi4py: pip install 'virtualpar[mpi]'") from exc

from ..errors import P2PTimeout, UsageError
from ..runtime.status import ANY_SOURCE, ANY_TAG
from ..sim.hardware import dtype_name
from ..trace.event import Event
from .collectives import MPICollectives
from .matching import ReceiveMatching
from .requests import RecvRequest, SendRequest
from .waiting import DEFAULT_TIMEOUT, wait_for

__all__ = ["MPIDevice", "collect"]

_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN, "avg": MPI.SUM}


class MPIDevice(MPICollectives, ReceiveMatching):
    """One MPI process as a device of ``mesh`` (whose size must be the world's)."""

    def __init__(self, mesh: Any, comm: Any = None, hardware: Any = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        from ..runtime.hardware_choice import resolve_hardware
        from ..sim.clock import DeviceClock

        if not timeout > 0:
            raise UsageError(f"timeout must be positive seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.comm = comm or MPI.COMM_WORLD
        mesh.check_devices(self.comm.Get_size())
        self.mesh, self.rank, self.size = mesh, self.comm.Get_rank(), self.comm.Get_size()
        self.index = mesh.index(self.rank)
        self.state: dict[str, Any] = {}
        _, topology, spec = resolve_hardware(hardware, mesh)
        self._clock = DeviceClock(self.rank, topology, spec)
        self._t0 = time.monotonic()
        # every group's communicators, made now by every rank in one order: made on first use, a
        # Split needed every rank of the world (a collective of one group's members hung), and
        # ranks using different groups first matched each other's Splits (wrong members, silently)
        self._comms: dict[tuple[tuple[str, ...], bool], Any] = {((), False): MPI.COMM_SELF,
                                                                ((), True): MPI.COMM_SELF.Dup()}
        names = tuple(mesh.axis_names)
        for k in range(1, len(names) + 1):
            for axes in itertools.combinations(names, k):
                ranks = mesh.group_of(self.rank, axes)
                sub = self._comms[(axes, False)] = self.comm.Split(color=min(ranks),
                                                                   key=ranks.index(self.rank))
                self._comms[(axes, True)] = sub.Dup()  # virtualpar's own algorithms' messages
        self._to_self: list[SendRequest] = []
        self._posted: list[RecvRequest] = []  # receives without a message yet, in posting order
        self._stash: list[tuple[int, int, Any, Any]] = []  # messages a probe took in early (mpi/matching.py)
        self.events: list[Event] = []
        self.sent_bytes = np.zeros(self.size, np.int64)  # per destination, algorithm messages included
        self.sent_messages = np.zeros(self.size, np.int64)

    @property
    def name(self) -> str:
        return f"device {self.rank} {self.index}"

    @property
    def clock(self) -> float:
        return self._clock.now

    @property
    def wall(self) -> float:
        return time.monotonic() - self._t0

    def group(self, group: Any = None) -> tuple[int, ...]:
        return self.mesh.group_of(self.rank, self.mesh.axes(group))

    def group_rank(self, group: Any = None) -> int:
        return self.group(group).index(self.rank)

    def _comm(self, group: Any, private: bool = False) -> Any:
        return self._comms[(self.mesh.axes(group), private)]

    def _deadline(self, timeout: float | None) -> tuple[float, float]:
        budget = self.timeout if timeout is None else float(timeout)
        if not budget > 0:
            raise UsageError(f"{self.name}: timeout must be positive seconds, got {timeout!r}",
                             rank=self.rank)
        return budget, time.monotonic() + budget

    def wait_any(self, requests: Any, timeout: float | None = None) -> int:
        """The first of ``requests`` (this device's) that can complete, not completed (``Device.wait_any``),
        polled as every wait here is (:mod:`virtualpar.mpi.waiting`)."""
        reqs = list(requests) if isinstance(requests, (list, tuple)) else None
        if not reqs or any(not isinstance(r, (SendRequest, RecvRequest)) or r._dev is not self for r in reqs):
            raise UsageError(f"{self.name}: wait_any needs a non-empty list of this "
                             "device's requests (from isend, "
                             f"irecv or issend), got {requests!r}", rank=self.rank)
        budget, deadline = self._deadline(timeout)
        found = [0]

        def ready() -> bool:
            for i, r in enumerate(reqs):
                if r.test():
                    found[0] = i
                    return True
            return False

        wait_for(ready, deadline, lambda: P2PTimeout(f"{self.name}: wait for any of {len(reqs)} request"
                                                     f"{'s' * (len(reqs) > 1)} did not complete within "
                                                     f"{budget:g} s", rank=self.rank))
        return found[0]

    def _p2p_timeout(self, what: str, peer: int, tag: int, budget: float) -> P2PTimeout:
        who = "any source" if peer == ANY_SOURCE else f"device {peer}"
        return P2PTimeout(f"{self.name}: {what} {who} (tag "
                          f"{'any' if tag == ANY_TAG else tag}) did not complete "
                          f"within {budget:g} s", rank=self.rank, peer=peer, tag=tag)

    def _mpi_op(self, op: str, dtype: Any = None) -> Any:
        # numpy's bool add is OR, multiply AND: MPI's logical ops
        if dtype is not None and np.dtype(dtype) == np.bool_:
            return {"sum": MPI.LOR, "max": MPI.LOR, "prod": MPI.LAND, "min": MPI.LAND}[op]
        return _OPS[op]

    def _peer(self, peer: Any, tag: Any, what: str) -> tuple[int, int]:
        """``(peer, tag)`` checked as the emulator checks them, so a mistake is a named
        ``UsageError`` here too, not MPI's error stack or a routing error naming no device."""
        if isinstance(peer, (bool, np.bool_)) or not isinstance(peer, (int, np.integer)) or not (
                0 <= peer < self.size or peer == ANY_SOURCE and what == "src"):
            raise UsageError(f"{self.name}: {what} must be a device rank 0..{self.size - 1}, got {peer!r}",
                             rank=self.rank)
        ub = self.comm.Get_attr(MPI.TAG_UB)
        if isinstance(tag, (bool, np.bool_)) or not isinstance(tag, (int, np.integer)) or not (
                0 <= tag <= ub or tag == ANY_TAG and what == "src"):
            raise UsageError(f"{self.name}: tag must be an int in 0..{ub} (MPI's TAG_UB), got {tag!r}",
                             rank=self.rank)
        return int(peer), int(tag)

    def _count(self, dst: int, nbytes: int) -> None:
        self.sent_bytes[dst] += nbytes
        self.sent_messages[dst] += 1

    def _record(self, kind: str, name: str, wall0: float, model0: float, nbytes: int = 0,
                peer: int | None = None, group: tuple[int, ...] | None = None) -> None:
        self.events.append(Event(self.rank, kind, name, wall0, self.wall, model0, self._clock.now,
                                 int(nbytes), peer=peer, seq=len(self.events), group=group))

    # -- point to point -----------------------------------------------------------------------------
    def isend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> SendRequest:
        return self._isend(x, dst, tag, False)

    def issend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> SendRequest:
        """MPI's ``Issend``: complete once the matching receive took the message."""
        return self._isend(x, dst, tag, True)

    def ssend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        """MPI's ``Ssend`` (to this process itself with no receive posted: ``P2PTimeout``)."""
        self._isend(x, dst, tag, True).wait(timeout)

    def _isend(self, x: Any, dst: int, tag: int, sync: bool) -> SendRequest:
        dst, tag = self._peer(dst, tag, "dst")
        t0 = (self.wall, self._clock.now)
        # the bytes that travel, as on the emulator: an array's, or an object's pickle
        nbytes = x.nbytes if isinstance(x, np.ndarray) else len(pickle.dumps(x, protocol=5))
        stamp = self._clock.on_send(dst, nbytes)
        post, post_array = (self.comm.issend,
                            self.comm.Issend) if sync else (self.comm.isend, self.comm.Isend)
        if isinstance(x, np.ndarray):
            x = np.ascontiguousarray(x)
            reqs = [post(("array", x.shape, x.dtype.str, stamp), dest=dst, tag=tag),
                    post_array(x, dest=dst, tag=tag), x]  # the array stays referenced until done
        else:
            reqs = [post(("object", x, stamp, nbytes), dest=dst, tag=tag)]
        if dst != self.rank:  # as on the emulator: a message to oneself crosses no link, an object counts
            self._count(dst, nbytes)
        return SendRequest(self, reqs, dst, nbytes, stamp, t0, tag)

    def send(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        """Under MPI a large send waits for its receive (the emulator buffers it; its
        ``VirtualCluster(eager_limit=0)`` does the same): past the timeout, ``P2PTimeout``."""
        req = self.isend(x, dst, tag)
        if dst == self.rank:  # MPI would block a large send to oneself until the receive: defer
            self._to_self.append(req)
        else:
            req.wait(timeout)

    def recv(self, src: int, tag: int = 0, out: np.ndarray | None = None, timeout: float | None = None,
             status: Any = None) -> Any:
        req = self.irecv(src, tag, out, timeout)
        try:
            value = req.wait()
        except (
            BaseException
        ):  # a blocking receive that failed is no longer posted: it must not take a later message
            if req in self._posted:
                self._posted.remove(req)
            raise
        if status is not None:
            status.source, status.tag, status.nbytes = req.status.source, req.status.tag, req.status.nbytes
        return value

    def irecv(self, src: int, tag: int = 0, out: np.ndarray | None = None,
              timeout: float | None = None) -> RecvRequest:
        src, tag = self._peer(src, tag, "src")
        req = RecvRequest(self, src, tag, out, timeout)
        self._posted.append(req)
        return req

    def sendrecv(self, x: Any, dst: int, src: int, sendtag: int = 0, recvtag: int | None = None,
                 timeout: float | None = None) -> Any:
        req = self.isend(x, dst, sendtag)
        value = self.recv(src, sendtag if recvtag is None else recvtag, timeout=timeout)
        req.wait(timeout)
        return value

    # -- compute and clocks -------------------------------------------------------------------------
    def compute(self, flops: float = 0.0, bytes: float = 0.0, dtype: Any = "float32", name: str = "compute",
                since: float | None = None) -> float:
        wall0 = self.wall if since is None else since
        start, end = self._clock.compute(flops=flops, nbytes=bytes, dtype=dtype_name(dtype))
        self._record("compute", name, wall0, start)
        return end - start

    @contextlib.contextmanager
    def comm_stream(self, since: float | None = None) -> Iterator[None]:
        self._clock.begin_stream(self._clock.now if since is None else since)
        try:
            yield
        finally:
            self._clock.end_stream()

    def wait_comm_stream(self) -> float:
        return self._clock.join_stream()

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        from ..kernels import matmul

        return matmul(self, a, b)

    # -- what rank 0 collects --------------------------------------------------------------------------
    def report(self, result: Any) -> tuple[Any, float, np.ndarray, np.ndarray, list[Event]]:
        """This device's part of a run: its result, modelled clock, bytes and messages sent per
        destination, and its events."""
        self.wait_comm_stream()  # the run's modelled time includes its communication stream
        return result, self._clock.now, self.sent_bytes.copy(), self.sent_messages.copy(), list(self.events)


def collect(dev: MPIDevice, result: Any) -> dict[str, Any] | None:
    """Gather every rank's :meth:`MPIDevice.report` on rank 0, as ``cluster.run`` returns them there:
    ``{"results", "clocks", "stats" (a TrafficStats), "trace" (a Trace)}``; None on the other ranks."""
    from ..runtime.stats import TrafficStats
    from ..trace.events import Trace

    parts = dev.comm.gather(dev.report(result), root=0)
    if parts is None:
        return None
    n = dev.size
    zeros = np.zeros(n, np.int64)
    stats = TrafficStats(bytes=np.stack([p[2] for p in parts]), messages=np.stack([p[3] for p in parts]),
                         host_to_device=zeros, device_to_host=zeros.copy(), control_bytes=0)
    names = {r: f"device {r} {dev.mesh.index(r)}" for r in range(n)}
    trace = Trace([e for p in parts for e in p[4]], device_names=names)
    return {"results": [p[0] for p in parts], "clocks": [p[1] for p in parts], "stats": stats, "trace": trace}
