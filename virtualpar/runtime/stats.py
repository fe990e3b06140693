"""Traffic counters of a cluster: bytes and messages per device pair, host traffic apart."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError

__all__ = ["TrafficStats"]

MATRIX_UP_TO = 16  # devices: a 16-column matrix of bytes is ~180 characters wide
HEAVIEST = 8  # pairs listed under a per-device table


@dataclass(frozen=True)
class TrafficStats:
    """A snapshot of what moved since start-up (or the last ``reset_stats()``).

    ``bytes[s, d]`` / ``messages[s, d]``: payload bytes and messages device s sent to device d.
    ``host_to_device[d]`` / ``device_to_host[s]``: bytes between the driver and the devices.
    ``control_bytes``: the runtime's own small messages (collective contract checks), not data.
    """

    bytes: np.ndarray
    messages: np.ndarray
    host_to_device: np.ndarray
    device_to_host: np.ndarray
    control_bytes: int

    @classmethod
    def from_counters(cls, counters: np.ndarray, n: int) -> "TrafficStats":
        data, msgs, ctrl = counters
        return cls(
            bytes=data[:n, :n].copy(), messages=msgs[:n, :n].copy(),
            host_to_device=data[n, :n].copy(), device_to_host=data[:n, n].copy(),
            control_bytes=int(ctrl.sum()),
        )

    @property
    def total_bytes(self) -> int:
        """Device-to-device payload bytes."""
        return int(self.bytes.sum())

    def sent(self, rank: int) -> int:
        """Payload bytes device ``rank`` sent to other devices."""
        return int(self.bytes[self._rank(rank)].sum())

    def received(self, rank: int) -> int:
        """Payload bytes device ``rank`` received from other devices."""
        return int(self.bytes[:, self._rank(rank)].sum())

    def _rank(self, rank: int) -> int:
        n = self.bytes.shape[0]
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < n:
            raise UsageError(f"TrafficStats: rank must be a device rank 0..{n - 1}, got {rank!r}")  # -1 was the last
        return int(rank)

    def format(self, matrix_up_to: int = MATRIX_UP_TO) -> str:
        """The bytes each device sent to each other as a src × dst matrix — up to ``matrix_up_to``
        devices; beyond that a matrix row is wider than any terminal (64 devices: ~700 characters),
        so one line per device instead (bytes sent and received, messages out, peers sent to) and
        the heaviest pairs.  The whole matrix stays in :attr:`bytes`."""
        n = self.bytes.shape[0]
        if n <= matrix_up_to:
            head = "src\\dst " + " ".join(f"{d:>10}" for d in range(n))
            rows = [f"{s:>7} " + " ".join(f"{int(self.bytes[s, d]):>10}" for d in range(n)) for s in range(n)]
        else:
            head = (f"{n} devices, one line each (the src x dst matrix is TrafficStats.bytes)\n"
                    f"{'device':>7} {'sent B':>14} {'received B':>14} {'messages':>9} {'peers':>6}")
            sent, received = self.bytes.sum(axis=1), self.bytes.sum(axis=0)
            msgs, peers = self.messages.sum(axis=1), (self.bytes > 0).sum(axis=1)
            rows = [f"{s:>7} {int(sent[s]):>14} {int(received[s]):>14} {int(msgs[s]):>9} {int(peers[s]):>6}" for s in range(n)]
            order = np.argsort(-self.bytes, axis=None, kind="stable")[:HEAVIEST]
            pairs = [f"{s}->{d} {int(self.bytes[s, d])} B" for s, d in zip(*np.unravel_index(order, self.bytes.shape))
                     if self.bytes[s, d] > 0]
            rows.append("heaviest pairs: " + (", ".join(pairs) if pairs else "none"))
        tail = f"device-to-device {self.total_bytes} B; host->device {int(self.host_to_device.sum())} B; device->host {int(self.device_to_host.sum())} B"
        return "\n".join([head, *rows, tail])
