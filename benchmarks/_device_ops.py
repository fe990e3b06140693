"""What runs on the devices during ``bench_collectives.py`` (module level, so it pickles by reference).

Every function returns plain floats measured on the device: wall seconds from
``time.perf_counter`` and modelled seconds from ``dev.clock``.  Buffers are allocated once per
cluster and kept in ``dev.state`` (OSU benchmarks reuse their buffers too): on this VM the first
touch of fresh memory can cost 0.4 GB/s, which would measure the hypervisor, not the transport.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["pingpong", "stream", "collective", "hello"]


def _buffer(dev: Any, name: str, nbytes: int, dtype: Any = np.uint8) -> np.ndarray:
    """A warm, reused buffer of ``nbytes`` (filled once with the device's rank + 1)."""
    key = (name, nbytes, np.dtype(dtype).str)
    buf = dev.state.get(key)
    if buf is None:
        buf = np.full(nbytes // np.dtype(dtype).itemsize, dev.rank + 1, dtype=dtype)
        dev.state[key] = buf
    return buf


def hello(dev: Any) -> int:
    """The first run of a fresh cluster: one message from every device to its right neighbour."""
    n, r = dev.size, dev.rank
    if n > 1:
        req = dev.irecv((r - 1) % n, tag=1)
        dev.send(r, (r + 1) % n, tag=1)
        req.wait()
    return r


def pingpong(dev: Any, nbytes: int, iters: int) -> tuple[float, float]:
    """One-way latency between devices 0 and 1: (round trip / 2) averaged over ``iters`` round trips.

    Sends a numpy array (``send`` moves arrays raw) and receives into a reused ``out=`` buffer.
    Returns (wall seconds, modelled seconds) per one-way message; other devices return zeros.
    """
    if dev.rank > 1:
        return 0.0, 0.0
    x, out = _buffer(dev, "ping", nbytes), _buffer(dev, "pong", nbytes)
    peer = 1 - dev.rank
    for _ in range(2):  # warm-up
        _round_trip(dev, x, out, peer)
    c0, t0 = dev.clock, time.perf_counter()
    for _ in range(iters):
        _round_trip(dev, x, out, peer)
    return (time.perf_counter() - t0) / iters / 2, (dev.clock - c0) / iters / 2


def _round_trip(dev: Any, x: np.ndarray, out: np.ndarray, peer: int) -> None:
    if dev.rank == 0:
        dev.send(x, peer)
        dev.recv(peer, out=out)
    else:
        dev.recv(peer, out=out)
        dev.send(x, peer)


def stream(dev: Any, nbytes: int, iters: int) -> tuple[float, float]:
    """Bandwidth from device 0 to device 1: ``iters`` back-to-back sends, then one tiny ack.

    Device 1 receives into a reused ``out=`` buffer.  Returns (wall seconds per message at the
    sender, including the final ack; modelled seconds per message at the receiver).
    """
    x, out = _buffer(dev, "src", nbytes), _buffer(dev, "dst", nbytes)
    ack = np.zeros(1, np.uint8)
    dev.barrier()
    if dev.rank > 1:
        return 0.0, 0.0
    c0, t0 = dev.clock, time.perf_counter()
    if dev.rank == 0:
        for _ in range(iters):
            dev.send(x, 1)
        dev.recv(1, out=ack)
    else:
        for _ in range(iters):
            dev.recv(0, out=out)
        # before the ack: its latency is not one of the messages' (it was α/iters more)
        model = dev.clock - c0
        dev.send(ack, 0)
        return (time.perf_counter() - t0) / iters, model / iters
    # the modelled figure is the receiver's (the bench takes the max)
    return (time.perf_counter() - t0) / iters, 0.0


def collective(dev: Any, op: str, nbytes: int, algorithm: str | None, iters: int) -> tuple[float, float]:
    """Mean wall and modelled seconds of ``iters`` back-to-back calls of collective ``op``.

    ``nbytes`` is the NCCL-tests "size": the full array for all_reduce and reduce_scatter (each
    device's input), the gathered result for all_gather (each device contributes nbytes / n).
    float32 data, reduce op "sum", the whole cluster as the group.
    """
    n = dev.size
    if op == "all_gather":
        x = _buffer(dev, "in", max(4, nbytes // n // 4 * 4), np.float32)
        call = lambda: dev.all_gather(x, algorithm=algorithm)  # noqa: E731
    elif op == "reduce_scatter":
        x = _buffer(dev, "in", nbytes, np.float32)
        call = lambda: dev.reduce_scatter(x, algorithm=algorithm)  # noqa: E731
    elif op == "all_reduce":
        x = _buffer(dev, "in", nbytes, np.float32)
        call = lambda: dev.all_reduce(x, algorithm=algorithm)  # noqa: E731
    else:
        raise ValueError(f"unknown collective {op!r}")
    call()  # warm-up: the algorithm's own buffers, the rings, the modelled links
    dev.barrier()
    c0, t0 = dev.clock, time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters, (dev.clock - c0) / iters
