"""``Device``: what code above the runtime may call on a device — the device protocol.

Every layer above ``runtime/`` (nn, sharding and tensor parallelism, pipelines, strategies,
timeline parallelism) talks to a device only through these members, so the same program runs on
the emulator's :class:`~virtualpar.runtime.VirtualDevice` and on any other implementation (a
fake in a unit test, an MPI-backed device).  ``tests/test_device_protocol.py`` checks that
``VirtualDevice`` provides all of it and that the upper layers import nothing from the runtime.

Groups are mesh axes: ``group=None`` is every device, ``"tp"`` the devices that differ only along
axis tp, ``("dp", "tp")`` along both.  ``root`` is a position within the group.
"""

from __future__ import annotations

from typing import Any, ContextManager, Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["Device"]

Group = "str | Sequence[str] | None"


@runtime_checkable
class Device(Protocol):
    """The calls code above the runtime may make on a device: identity, point to point, collectives, compute
    charges and the two clocks.  Implemented by the emulator's :class:`~virtualpar.runtime.VirtualDevice` and
    the MPI backend's :class:`~virtualpar.mpi.device.MPIDevice`; ``isinstance(dev, Device)`` checks the
    members exist. Every blocking call waits at most ``timeout`` seconds (None: the device's default), then
    raises."""

    # identity and mesh
    rank: int
    size: int
    index: Any  # MeshIndex: this device's coordinates, e.g. dev.index.tp
    mesh: Any
    state: dict[str, Any]  # kept across runs: weights, optimizer state

    @property
    def name(self) -> str:
        """A readable name for messages, e.g. ``"device 3 (dp=1, tp=1)"``."""
        ...

    def group(self, group: Group = None) -> tuple[int, ...]:
        """The ranks of this device's group along mesh axes ``group`` (None: every device), in group order."""
        ...

    def group_rank(self, group: Group = None) -> int:
        """This device's position within ``group`` (what ``root`` counts in)."""
        ...

    # point to point (FIFO per source and tag; arrays travel raw, other objects pickled; a device
    # may message itself)
    def send(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        """Send ``x`` to rank ``dst`` with ``tag``; returns once the message is on its way (the emulator
        buffers it; under MPI a large send waits for its receive)."""
        ...

    def recv(self, src: int, tag: int = 0, out: np.ndarray | None = None, timeout: float | None = None,
             status: Any = None) -> Any:
        """Receive the next message from ``src`` with ``tag`` (into ``out`` if given); ``src`` may be
        ``ANY_SOURCE`` and ``tag`` ``ANY_TAG``, and a ``Status`` passed as ``status`` is filled with the
        source, tag and size."""
        ...

    def isend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> Any:
        """Start a ``send``; returns a request whose ``wait()`` completes it (and ``test()`` polls it)."""
        ...

    def irecv(self, src: int, tag: int = 0, out: np.ndarray | None = None,
              timeout: float | None = None) -> Any:
        """Start a ``recv``; returns a request whose ``wait()`` returns the message (its ``status``: who sent
        it)."""
        ...

    def ssend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        """A synchronous ``send`` (MPI's ``Ssend``): returns only once a matching receive has taken ``x``,
        whatever its size, so a program that completes with it does not rely on buffering."""
        ...

    def issend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> Any:
        """Start an ``ssend`` (MPI's ``Issend``); its request completes once a matching receive has taken
        ``x``."""
        ...

    def sendrecv(self, x: Any, dst: int, src: int, sendtag: int = 0, recvtag: int | None = None,
                 timeout: float | None = None) -> Any:
        """Send ``x`` to ``dst`` and receive from ``src`` at once (MPI's ``Sendrecv``; a ring of them never
        deadlocks); ``recvtag`` defaults to ``sendtag``."""
        ...

    def wait_any(self, requests: Sequence[Any], timeout: float | None = None) -> int:
        """Block until one of ``requests`` (this device's, from ``isend``/``irecv``/``issend``) can complete;
        returns the index of the first that can, in list order, without completing it (its ``wait()`` then
        returns at once): what MPI's ``Waitany`` and ``Waitsome`` block in."""
        ...

    def iprobe(self, src: int = -1, tag: int = -1) -> Any:
        """The ``Status`` (source, tag, bytes) of the message ``recv(src, tag)`` would take now, without
        taking it, or None if none has arrived (MPI's ``Iprobe``; ``src``/``tag`` may be
        ``ANY_SOURCE``/``ANY_TAG``)."""
        ...

    def probe(self, src: int = -1, tag: int = -1, timeout: float | None = None) -> Any:
        """Block until ``iprobe(src, tag)`` finds a message; its ``Status`` (MPI's ``Probe``)."""
        ...

    # collectives
    def all_reduce(self, x: np.ndarray, op: str = "sum", group: Group = None, algorithm: str | None = None,
                   timeout: float | None = None) -> np.ndarray:
        """Every device of ``group`` gets the elementwise ``op`` (sum, prod, max, min, avg) of every device's
        ``x``; ``algorithm`` (``"ring"``, ``"tree"``, ...) overrides the default choice."""
        ...

    def all_gather(self, x: np.ndarray, dim: int = 0, group: Group = None, algorithm: str | None = None,
                   timeout: float | None = None) -> np.ndarray:
        """Every device gets every device's ``x`` concatenated along ``dim`` in group order."""
        ...

    def reduce_scatter(self, x: np.ndarray, dim: int = 0, op: str = "sum", group: Group = None,
                       algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Reduce every device's ``x``, then give position i piece i of ``numpy.array_split(.., n, dim)``."""
        ...

    def broadcast(self, x: np.ndarray | None, root: int = 0, group: Group = None,
                  algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Every device gets the root's ``x`` (the others may pass None)."""
        ...

    def reduce(self, x: np.ndarray, root: int = 0, op: str = "sum", group: Group = None,
               algorithm: str | None = None, timeout: float | None = None) -> np.ndarray | None:
        """The root gets the ``op`` reduction of every device's ``x``; the others get None."""
        ...

    def gather(self, x: np.ndarray, root: int = 0, dim: int = 0, group: Group = None,
               algorithm: str | None = None, timeout: float | None = None) -> np.ndarray | None:
        """The root gets every device's ``x`` concatenated along ``dim`` in group order; the others get
        None."""
        ...

    def scatter(self, x: np.ndarray | None, root: int = 0, dim: int = 0, group: Group = None,
                algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Position i gets piece i of ``numpy.array_split(x, n, dim)`` of the root's ``x`` (the others pass
        None)."""
        ...

    def all_to_all(self, x: np.ndarray, split_dim: int = 0, concat_dim: int = 0, group: Group = None,
                   algorithm: str | None = None, timeout: float | None = None) -> np.ndarray:
        """Piece j of ``x`` split along ``split_dim`` goes to position j; the pieces received concatenate
        along ``concat_dim`` in group order."""
        ...

    def barrier(self, group: Group = None, algorithm: str | None = None,
                timeout: float | None = None) -> None:
        """Return once every device of ``group`` has entered the barrier."""
        ...

    # compute charges and the two clocks
    def compute(self, flops: float = 0.0, bytes: float = 0.0, dtype: Any = "float32", name: str = "compute",
                since: float | None = None) -> float:
        """Charge a kernel to the modelled clock: ``max(flops / peak(dtype), bytes / memory bandwidth)``;
        returns the seconds charged.  ``name`` labels the trace slice; ``since``: the ``dev.wall`` the work
        began, if it ran before the charge."""
        ...

    def comm_stream(self, since: float | None = None) -> ContextManager[None]:
        """``with dev.comm_stream(since):`` runs the calls inside on a second modelled stream, as a GPU
        runs NCCL beside its kernels: they start at ``max(since, the stream's last end)`` (``since``
        defaults to ``clock``) and ``clock`` is where it was after the block — the compute stream
        goes on.  Wall time is unchanged: the calls still block.  Streams do not nest."""
        ...

    def wait_comm_stream(self) -> float:
        """The compute stream waits for the communication stream: ``clock = max(clock, its end)``;
        returns the new ``clock``.  Every run ends with it."""
        ...

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` of (..., m, k) by (k, n) with numpy, charging 2mnk flops per batch to the modelled
        clock."""
        ...

    @property
    def clock(self) -> float:
        """Modelled seconds since the cluster started, on the virtual hardware."""
        ...

    @property
    def wall(self) -> float:
        """Wall-clock seconds since the cluster started, on this machine."""
        ...
