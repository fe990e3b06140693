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

from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["Device"]

Group = "str | Sequence[str] | None"


@runtime_checkable
class Device(Protocol):
    # identity and mesh
    rank: int
    size: int
    index: Any  # MeshIndex: this device's coordinates, e.g. dev.index.tp
    mesh: Any
    state: dict[str, Any]  # kept across runs: weights, optimizer state

    @property
    def name(self) -> str: ...

    def group(self, group: Group = None) -> tuple[int, ...]: ...

    def group_rank(self, group: Group = None) -> int: ...

    # point to point (FIFO per source and tag; arrays travel raw, other objects pickled; a device
    # may message itself)
    def send(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None: ...

    def recv(self, src: int, tag: int = 0, out: np.ndarray | None = None, timeout: float | None = None,
             status: Any = None) -> Any: ...  # src may be ANY_SOURCE and tag ANY_TAG

    def isend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> Any: ...

    def irecv(self, src: int, tag: int = 0, out: np.ndarray | None = None, timeout: float | None = None) -> Any: ...

    def sendrecv(self, x: Any, dst: int, src: int, sendtag: int = 0, recvtag: int | None = None,
                 timeout: float | None = None) -> Any: ...

    # collectives
    def all_reduce(self, x: np.ndarray, op: str = "sum", group: Group = None, algorithm: str | None = None,
                   timeout: float | None = None) -> np.ndarray: ...

    def all_gather(self, x: np.ndarray, dim: int = 0, group: Group = None, algorithm: str | None = None,
                   timeout: float | None = None) -> np.ndarray: ...

    def reduce_scatter(self, x: np.ndarray, dim: int = 0, op: str = "sum", group: Group = None,
                       algorithm: str | None = None, timeout: float | None = None) -> np.ndarray: ...

    def broadcast(self, x: np.ndarray | None, root: int = 0, group: Group = None, algorithm: str | None = None,
                  timeout: float | None = None) -> np.ndarray: ...

    def reduce(self, x: np.ndarray, root: int = 0, op: str = "sum", group: Group = None,
               algorithm: str | None = None, timeout: float | None = None) -> np.ndarray | None: ...

    def gather(self, x: np.ndarray, root: int = 0, dim: int = 0, group: Group = None, algorithm: str | None = None,
               timeout: float | None = None) -> np.ndarray | None: ...

    def scatter(self, x: np.ndarray | None, root: int = 0, dim: int = 0, group: Group = None,
                algorithm: str | None = None, timeout: float | None = None) -> np.ndarray: ...

    def all_to_all(self, x: np.ndarray, split_dim: int = 0, concat_dim: int = 0, group: Group = None,
                   algorithm: str | None = None, timeout: float | None = None) -> np.ndarray: ...

    def barrier(self, group: Group = None, algorithm: str | None = None, timeout: float | None = None) -> None: ...

    # compute charges and the two clocks
    def compute(self, flops: float = 0.0, bytes: float = 0.0, dtype: Any = "float32", name: str = "compute",
                since: float | None = None) -> float: ...  # since: the dev.wall the work began (run before the charge)

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...

    @property
    def clock(self) -> float: ...  # modelled seconds on the virtual hardware

    @property
    def wall(self) -> float: ...  # seconds on this machine
