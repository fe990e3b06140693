"""An in-process ``Comm`` (and ``SharedComm``) over threads and queues, for tests and labs (no processes).

``run_threaded(n, fn, *args)`` runs ``fn(comm, *args)`` on n threads and returns their results in
rank order.  ``ThreadWorld`` does the same and keeps the traffic: bytes and messages per ordered
pair (src, dst), so tests can assert the closed-form byte counts of each algorithm exactly.
Shared-memory algorithms get one ``scratch_bytes`` array per member and a ``threading.Barrier``
as their fence; a fence carries up to ``fence_payload_bytes`` from each member (0 by default, so
that tests of the chunked paths stay on them).

Safety nets, so that a buggy algorithm fails a test instead of hanging or lying:

* arrays are copied on send (no aliasing between "devices");
* every blocking receive times out with ``P2PTimeout`` naming the ranks;
* when one thread raises, the others' pending receives abort (``DeviceAborted``) and the first
  real exception is re-raised in the caller, with a note naming its rank;
* messages left unreceived at the end raise ``UnmatchedMessages``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

import numpy as np

from virtualpar._words import counted
from virtualpar.collectives.comm import call_stamp
from virtualpar.errors import (
    CollectiveTimeout,
    DeviceAborted,
    P2PTimeout,
    PayloadError,
    UnmatchedMessages,
    UsageError,
)

__all__ = ["ThreadComm", "ThreadWorld", "run_threaded"]

log = logging.getLogger(__name__)

_POLL = 0.05  # seconds between checks of the abort flag while blocked in a receive


class _Done:
    """An already completed request (sends are buffered, so isend completes at once)."""

    def wait(self) -> None:
        return None


class _PendingRecv:
    """A receive that happens on ``wait()``: the queues buffer without bound, so deferring is safe."""

    def __init__(self, comm: "ThreadComm", peer: int, out: np.ndarray | None) -> None:
        self._comm, self._peer, self._out = comm, peer, out

    def wait(self) -> np.ndarray:
        return self._comm.recv(self._peer, out=self._out)


class ThreadComm:
    """One member's view of a ``ThreadWorld``: implements the ``Comm`` protocol."""

    def __init__(self, world: "ThreadWorld", rank: int) -> None:
        self.world = world
        self.rank = rank
        self.size = world.size
        self._fences = 0  # entered so far in this run: the parity picks the payload slot

    def _check_peer(self, peer: int, what: str) -> None:
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.size or peer == self.rank:
            raise UsageError(
                f"rank {self.rank}: {what} peer {peer!r} is not another member of a group of "
                f"{self.size} (expected 0..{self.size - 1}, not {self.rank})",
                rank=self.rank,
            )

    def send(self, x: np.ndarray, peer: int) -> None:
        """Copy ``x`` into the (src, dst) queue and count its bytes."""
        self._check_peer(peer, "send to")
        if not isinstance(x, np.ndarray):
            raise PayloadError(
                f"rank {self.rank}: send to {peer} expects a numpy array, got {type(x).__name__}",
                rank=self.rank,
            )
        payload = np.array(x, copy=True, order="C")
        self.world._count(self.rank, peer, payload.nbytes)
        self.world._queues[self.rank, peer].put(payload)

    def recv(self, peer: int, out: np.ndarray | None = None) -> np.ndarray:
        """Block until the next message from ``peer``; return it, or copy it into ``out``."""
        self._check_peer(peer, "recv from")
        q = self.world._queues[peer, self.rank]
        deadline = time.monotonic() + self.world.timeout
        while True:
            if self.world._abort.is_set():
                raise DeviceAborted(
                    f"rank {self.rank}: recv from {peer} aborted because another rank failed",
                    rank=self.rank,
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise P2PTimeout(
                    f"rank {self.rank}: no message from rank {peer} within {self.world.timeout}s",
                    rank=self.rank,
                    peer=peer,
                )
            try:
                msg = q.get(timeout=min(_POLL, remaining))
                break
            except queue.Empty:
                continue
        if out is None:
            return msg
        if out.shape != msg.shape or out.dtype != msg.dtype:
            raise UsageError(
                f"rank {self.rank}: recv from {peer} into out of shape {out.shape} {out.dtype}, "
                f"but the message is {msg.shape} {msg.dtype}",
                rank=self.rank,
            )
        np.copyto(out, msg)
        return out

    def isend(self, x: np.ndarray, peer: int) -> _Done:
        self.send(x, peer)
        return _Done()

    def irecv(self, peer: int, out: np.ndarray | None = None) -> _PendingRecv:
        self._check_peer(peer, "recv from")
        return _PendingRecv(self, peer, out)

    # -- SharedComm: scratch arrays shared by the threads, a threading.Barrier as the fence ------
    @property
    def scratch_bytes(self) -> int:
        return self.world.scratch_bytes

    def scratch(self, member: int) -> np.ndarray:
        return self.world._scratch[member]

    def scratch_rows(self) -> np.ndarray | None:
        return self.world._scratch

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype)

    @property
    def fence_payload_bytes(self) -> int:
        return self.world.fence_payload_bytes

    def fence_exchange(self, x: np.ndarray) -> np.ndarray:
        if x.nbytes > self.fence_payload_bytes:
            raise UsageError(f"rank {self.rank}: a fence carries at most {self.fence_payload_bytes} bytes, "
                             f"not {x.nbytes}", rank=self.rank)
        slots = self.world._payloads[self._fences & 1]
        slots[self.rank] = np.array(x, copy=True).reshape(-1)
        self.fence()
        return np.stack([slots[j] for j in range(self.size)])

    def call_stamp(self, op: int, root: int) -> int:
        return call_stamp(op, root, self._fences + 1, tuple(range(self.size)))

    def fence(self) -> None:
        self._fences += 1
        try:
            self.world._fence.wait(self.world.timeout)
        except threading.BrokenBarrierError:
            if self.world._abort.is_set():
                raise DeviceAborted(f"rank {self.rank}: fence aborted because another rank failed",
                                    rank=self.rank) from None
            raise CollectiveTimeout(f"rank {self.rank}: not every rank reached the fence within "
                                    f"{self.world.timeout}s", rank=self.rank) from None

    def release(self, owner: int) -> None:
        """Threads share one barrier: a release is a fence."""
        self.fence()

    def account(self, peer: int, nbytes: int, messages: int = 1) -> None:
        self.world._count(self.rank, peer, nbytes, messages)

    def account_all(self, nbytes: Any, messages: int = 1) -> None:
        for peer in range(self.size):
            if peer != self.rank:
                self.account(peer, nbytes if type(nbytes) is int else int(nbytes[peer]), messages)

    def _no_clock(self, *args: Any) -> None:
        """Threads keep no modelled clock: nothing to charge."""

    model_ring_all_reduce = model_barrier = model_tree_all_reduce = _no_clock
    model_ring_all_gather = model_ring_reduce_scatter = _no_clock
    model_tree_broadcast = model_pairwise_all_to_all = _no_clock


class ThreadWorld:
    """n ``ThreadComm`` members sharing FIFO queues per ordered pair, with traffic counters.

    ``bytes[src, dst]`` and ``messages[src, dst]`` accumulate over every ``run``.
    """

    def __init__(self, size: int, timeout: float = 5.0, scratch_bytes: int = 4096,
                 fence_payload_bytes: int = 0) -> None:
        if not isinstance(size, int) or size < 1:
            raise UsageError(f"ThreadWorld size must be a positive int, got {size!r}")
        self.size = size
        self.timeout = float(timeout)
        self._queues = {(s, d): queue.Queue() for s in range(size) for d in range(size) if s != d}
        self._lock = threading.Lock()
        self._abort = threading.Event()
        self.bytes = np.zeros((size, size), dtype=np.int64)
        self.messages = np.zeros((size, size), dtype=np.int64)
        self.scratch_bytes = scratch_bytes
        self._scratch = np.zeros((size, scratch_bytes), np.uint8)  # row j: member j's region
        self._fence = threading.Barrier(size)
        self.fence_payload_bytes = fence_payload_bytes
        self._payloads: list[list[Any]] = [[None] * size, [None] * size]  # by fence parity, then member
        self.comms = [ThreadComm(self, r) for r in range(size)]

    def _count(self, src: int, dst: int, nbytes: int, messages: int = 1) -> None:
        with self._lock:
            self.bytes[src, dst] += nbytes
            self.messages[src, dst] += messages

    def bytes_sent(self, rank: int) -> int:
        """Total bytes ``rank`` sent to all peers so far."""
        return int(self.bytes[rank].sum())

    def bytes_received(self, rank: int) -> int:
        """Total bytes ``rank`` was sent by all peers so far."""
        return int(self.bytes[:, rank].sum())

    def unmatched(self) -> list[tuple[int, int, str]]:
        """Messages still queued: (src, dst, description)."""
        return [
            (s, d, f"{m.shape} {m.dtype}")
            for (s, d), q in self._queues.items()
            for m in list(q.queue)
        ]

    def _drain(self) -> None:
        for q in self._queues.values():
            while not q.empty():
                q.get_nowait()

    def run(self, fn: Callable[..., Any], *args: Any, check_unmatched: bool = True) -> list[Any]:
        """Run ``fn(comm, *args)`` on every member in its own thread; results in rank order."""
        self._abort.clear()
        self._fence.reset()
        for comm in self.comms:
            comm._fences = 0
        results: list[Any] = [None] * self.size
        errors: list[tuple[float, int, BaseException]] = []

        def target(rank: int) -> None:
            try:
                results[rank] = fn(self.comms[rank], *args)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller below
                errors.append((time.monotonic(), rank, exc))
                self._abort.set()
                self._fence.abort()  # wakes ranks waiting in a fence

        threads = [
            threading.Thread(target=target, args=(r,), name=f"vp-thread-rank{r}", daemon=True)
            for r in range(self.size)
        ]
        for t in threads:
            t.start()
        # Receives time out on their own; this bound only catches a rank stuck outside the comm.
        deadline = time.monotonic() + 2 * self.timeout + 1.0
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [r for r, t in enumerate(threads) if t.is_alive()]
        if stuck:
            self._abort.set()
            raise CollectiveTimeout(
                f"threads of ranks {stuck} still running after {2 * self.timeout + 1.0:.1f}s",
                missing=stuck,
            )
        if errors:
            self._drain()  # leave the world reusable after a failed run
            primary = [e for e in errors if not isinstance(e[2], DeviceAborted)] or errors
            _, rank, exc = min(primary, key=lambda e: e[0])
            if len(errors) > 1:
                log.debug("run_threaded: %d ranks failed; re-raising rank %d's", len(errors), rank)
            exc.add_note(f"(raised on thread rank {rank} of {self.size})")
            raise exc
        if check_unmatched and (left := self.unmatched()):
            raise UnmatchedMessages(
                f"{counted(len(left), 'message')} sent and never received (src, dst, payload): {left}",
                messages=left,
            )
        return results


def run_threaded(n: int, fn: Callable[..., Any], *args: Any, timeout: float = 5.0,
                 scratch_bytes: int = 4096) -> list[Any]:
    """Run ``fn(comm, *args)`` on n threads, each with its own ``ThreadComm``; results by rank."""
    return ThreadWorld(n, timeout=timeout, scratch_bytes=scratch_bytes).run(fn, *args)
