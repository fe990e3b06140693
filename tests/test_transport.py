"""Transport paths that the runtime tests do not force: ring wrap-around with tiny rings, the
rendezvous fallback when the kernel refuses cross-memory reads, the receive-buffer pool, and no
lost wake-ups (with the safety-net wake slice raised to 60 s, a lost post would hang a wait)."""

from __future__ import annotations

import gc
import multiprocessing as mp

import numpy as np
import pytest

import virtualpar.transport.endpoint as ep
from virtualpar import VirtualCluster
from virtualpar.transport.endpoint import Endpoint
from virtualpar.transport.shm import Layout, SharedArena

SIZES = [0, 1, 7, 8, 100, 4096, 5000, 70000, 300000, 1 << 20]


def _payload(size: int, kind: int, i: int):
    if kind == 2:
        return {"i": i, "b": bytes(range(256)) * (size // 256)}
    x = (np.arange(size, dtype=np.int64) * 7 + i).astype(np.uint8)
    return x.reshape(-1, 1)[::2] if kind == 1 and size else x  # kind 1: non-contiguous


def _plan(seed: int, n: int):
    rng = np.random.default_rng(seed)
    return [(*map(int, rng.choice(n, 2, replace=False)), int(rng.integers(3)), int(rng.choice(SIZES)), int(rng.integers(3)), i)
            for i in range(150)]


def exchange(dev, seed: int):
    """Everyone isends its share of a random plan first, then receives; returns the number of bad messages."""
    plan = _plan(seed, dev.size)
    sends = [dev.isend(_payload(sz, k, i), d, tag) for s, d, tag, sz, k, i in plan if s == dev.rank]
    bad = 0
    for s, d, tag, sz, k, i in plan:
        if d == dev.rank:
            y, x = dev.recv(s, tag), _payload(sz, k, i)
            ok = y == x if k == 2 else isinstance(y, np.ndarray) and y.shape == x.shape and np.array_equal(y, x)
            bad += not ok
    for req in sends:
        req.wait()
    return bad


@pytest.mark.parametrize("ring_bytes,cross_memory,n", [(4096, True, 3), (4096, False, 2), (65536, False, 4), (8192, True, 8)])
def test_random_traffic_arrives_intact_in_order(monkeypatch, ring_bytes, cross_memory, n):
    monkeypatch.setattr(ep, "_WAKE_SLICE", 60.0)  # a lost wake-up would now hang until the op timeout
    if not cross_memory:
        monkeypatch.setattr(ep, "read_remote", lambda *args: 1)  # EPERM: every offer falls back to the ring
    with VirtualCluster(n, ring_bytes=ring_bytes, timeout=20) as c:
        for seed in range(2):
            assert c.run(exchange, seed) == [0] * n


@pytest.fixture
def pair():
    layout = Layout(2, 1 << 20)
    arena = SharedArena.create(layout.total_bytes)
    arena.unlink()
    bells = [mp.get_context("fork").Semaphore(0) for _ in range(layout.endpoints)]
    yield Endpoint(0, arena, layout, bells), Endpoint(1, arena, layout, bells)


def _xfer(pair, x):
    a, b = pair
    s = a.isend(x, 1, 0)
    y = b.irecv(0, 0).wait(1)
    s.wait(1)
    return y


def test_pool_recycles_a_buffer_only_when_every_view_is_gone(pair):
    a = _xfer(pair, np.full((256, 256), 1, np.float32))  # 256 KiB: pooled
    b = _xfer(pair, np.full((256, 256), 2, np.float32))
    view, addr = a[10:20], a.ctypes.data
    del a
    gc.collect()
    c = _xfer(pair, np.full((256, 256), 3, np.float32))
    assert c.ctypes.data != addr and (view == 1).all()
    del view
    gc.collect()
    d = _xfer(pair, np.full((256, 256), 4, np.float32))
    assert d.ctypes.data == addr  # recycled, warm
    assert (b == 2).all() and (c == 3).all() and (d == 4).all()
