"""Traffic counters of a cluster: bytes and messages per device pair, host traffic apart."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from ..trace.fmt import WIDTH, fit, nbytes, table

__all__ = ["TrafficStats"]

MATRIX_UP_TO = 16  # devices: a 16 x 16 matrix of bytes, folded into blocks of destinations that fit
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
            # -1 was the last
            raise UsageError(f"TrafficStats: rank must be a device rank 0..{n - 1}, got {rank!r}")
        return int(rank)

    def format(self, matrix_up_to: int = MATRIX_UP_TO, width: int = WIDTH) -> str:
        """What each device sent to each other, in binary units, every line at most ``width``
        columns: a src × dst matrix up to ``matrix_up_to`` devices (folded into blocks of
        destinations when wider than ``width``; ``-`` for nothing); beyond that a matrix is
        unreadable (64 devices: 4,096 cells), so one line per device instead (bytes sent and
        received, messages out, peers sent to) and the heaviest pairs.  The whole matrix stays in
        :attr:`bytes`."""
        n = self.bytes.shape[0]
        if n <= matrix_up_to:
            lines = self._matrix(width)
        else:
            sent, received = self.bytes.sum(axis=1), self.bytes.sum(axis=0)
            msgs, peers = self.messages.sum(axis=1), (self.bytes > 0).sum(axis=1)
            rows = [(str(s), nbytes(int(sent[s])), nbytes(int(received[s])), f"{int(msgs[s]):,}",
                     str(int(peers[s]))) for s in range(n)]
            lines = [f"{n} devices, one line each (the src x dst matrix is TrafficStats.bytes)",
                     *table(("device", "sent", "received", "messages", "peers"), rows, width=width,
                            right=[True] * 5).splitlines()]
            order = np.argsort(-self.bytes, axis=None, kind="stable")[:HEAVIEST]
            pairs = [f"{s}->{d} {nbytes(int(self.bytes[s, d]))}"
                     for s, d in zip(*np.unravel_index(order, self.bytes.shape)) if self.bytes[s, d] > 0]
            lines += _items("heaviest pairs: ", pairs or ["none"], width)
        tail = (f"device-to-device {_exact(self.total_bytes)}; "
                f"host->device {_exact(int(self.host_to_device.sum()))}; "
                f"device->host {_exact(int(self.device_to_host.sum()))}")
        return "\n".join(lines + fit(tail, width))

    def _matrix(self, width: int) -> list[str]:
        """The src × dst matrix of bytes, folded into blocks of destinations that fit ``width``."""
        n = self.bytes.shape[0]
        cells = [[nbytes(int(self.bytes[s, d])) if self.bytes[s, d] else "-" for d in range(n)]
                 for s in range(n)]
        cw = max([len(str(n - 1))] + [len(c) for row in cells for c in row])
        label = "src\\dst"
        per = max(1, (width - len(label)) // (cw + 2))
        blocks = []
        for first in range(0, n, per):
            last = min(n, first + per)
            block = [label + "".join(f"  {d:>{cw}}" for d in range(first, last))]
            block += [f"{s:>{len(label)}}" + "".join(f"  {c:>{cw}}" for c in cells[s][first:last])
                      for s in range(n)]
            blocks.append("\n".join(block))
        return "\n\n".join(blocks).splitlines()


def _items(head: str, items: list[str], width: int) -> list[str]:
    """``head`` then ``items`` joined by ``", "``, wrapped between items (never inside one)."""
    lines, line = [], head
    for k, item in enumerate(items):
        piece = item + ("," if k < len(items) - 1 else "")
        if line.strip() and len(line) + len(piece) + (0 if line == head else 1) > width:
            lines.append(line.rstrip())
            line = "  "
        line += ("" if line in (head, "  ") else " ") + piece
    return lines + [line]


def _exact(n: int) -> str:
    """Bytes in binary units, and exactly when that rounds: ``"937.5 KiB (960,000 B)"``."""
    return nbytes(n) if n < 1024 else f"{nbytes(n)} ({n:,} B)"
