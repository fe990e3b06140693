"""The modelled clock on real device processes, against the α–β closed forms (issue 4 §3).

Uniform hardware: every pair of devices joined by a link of latency α and bandwidth β, ideal
compute (reductions cost nothing), so collective times follow from their algorithms alone.
Clusters are fresh per case, so every clock starts at 0.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from virtualpar import Mesh, VirtualCluster
from virtualpar.sim import Hardware, analytic, get_hardware

ALPHA = 1e-5
BETA = 1e9
UNIFORM = Hardware.uniform(latency=ALPHA, bandwidth=BETA)


def _p2p(dev, nbytes):
    if dev.rank == 0:
        dev.send(np.zeros(nbytes, np.uint8), 1)
    elif dev.rank == 1:
        dev.recv(0)
    return dev.clock


def _all_reduce(dev, count, algorithm):
    dev.all_reduce(np.ones(count, np.float64), algorithm=algorithm)
    return dev.clock


def _broadcast(dev, count):
    x = np.ones(count, np.float64) if dev.rank == 0 else None
    dev.broadcast(x, root=0)
    return dev.clock


def _mixed(dev):
    """A little of everything: the modelled result must not depend on scheduling."""
    x = np.arange(4096, dtype=np.float32) + dev.rank
    y = dev.all_reduce(x)
    z = dev.all_gather(x[:100])
    dev.compute(flops=1e9, bytes=1e6)
    right, left = (dev.rank + 1) % dev.size, (dev.rank - 1) % dev.size
    req = dev.irecv(left)
    dev.send(y[: 1000 * (dev.rank + 1)], right)
    req.wait()
    dev.reduce_scatter(z, dim=0)
    return dev.clock


def test_point_to_point_costs_alpha_plus_m_over_beta():
    nbytes = 1 << 20
    with VirtualCluster(2, hardware=UNIFORM) as cluster:
        sender, receiver = cluster.run(_p2p, nbytes)
        assert cluster.clocks() == [sender, receiver]
    expected = analytic.p2p(nbytes, ALPHA, BETA)
    assert receiver == pytest.approx(ALPHA + nbytes / BETA, rel=1e-12) == expected
    assert sender == pytest.approx(expected, rel=1e-12)  # Hockney: the sender pays the transfer too


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_all_reduce_costs_2_n_minus_1_steps(n):
    count = 1024 * n  # divisible by n: every chunk is M/n bytes
    nbytes = 8 * count
    with VirtualCluster(n, hardware=UNIFORM) as cluster:
        clocks = cluster.run(_all_reduce, count, "ring")
    expected = 2 * (n - 1) * (ALPHA + nbytes / (n * BETA))
    assert expected == pytest.approx(analytic.ring_all_reduce(n, nbytes, ALPHA, BETA), rel=1e-12)
    for clock in clocks:
        assert clock == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_direct_all_reduce_is_one_shot(n):
    """algorithm="direct" sends all M bytes to each peer at once over dedicated links: α + M/β,
    analytic.direct_all_reduce's concurrent form (it described a two-shot scheme before)."""
    count = 1024 * n
    nbytes = 8 * count
    with VirtualCluster(n, hardware=UNIFORM) as cluster:
        clocks = cluster.run(_all_reduce, count, "direct")
        sent = cluster.stats().bytes.sum(axis=1)
    for clock in clocks:
        assert clock == pytest.approx(analytic.direct_all_reduce(n, nbytes, ALPHA, BETA, concurrent=True),
                                      rel=1e-12)
    assert sent.tolist() == [(n - 1) * nbytes] * n


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8])
def test_binomial_broadcast_costs_ceil_log2_n_hops(n):
    count = 4096
    nbytes = 8 * count
    with VirtualCluster(n, hardware=UNIFORM) as cluster:
        clocks = cluster.run(_broadcast, count)
    expected = math.ceil(math.log2(n)) * (ALPHA + nbytes / BETA) if n > 1 else 0.0
    assert max(clocks) == pytest.approx(expected, rel=1e-12, abs=1e-18)
    assert max(clocks) == pytest.approx(analytic.tree_broadcast(n, nbytes, ALPHA, BETA), rel=1e-12, abs=1e-18)


def test_compute_is_charged_as_a_roofline():
    laptop = get_hardware("laptop")
    spec = laptop.device
    with VirtualCluster(2, hardware="laptop") as cluster:
        flops_bound, memory_bound = cluster.run(_compute_pair)[0]
    assert flops_bound == pytest.approx(2e9 / spec.peak("float32"), rel=1e-12)
    assert memory_bound == pytest.approx(1e9 / spec.memory_bandwidth, rel=1e-12)


def _compute_pair(dev):
    return dev.compute(flops=2e9, bytes=1.0), dev.compute(flops=1.0, bytes=1e9)


def test_modelled_time_does_not_depend_on_how_busy_the_machine_is():
    mesh = Mesh({"dp": 2, "tp": 2})
    with VirtualCluster(mesh, hardware="h100-node") as cluster:
        quiet = cluster.run(_mixed)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        with VirtualCluster(mesh, hardware="h100-node") as cluster:
            busy = cluster.run(_mixed)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert busy == quiet  # exactly: the modelled clock follows program order, not the OS scheduler
    assert all(c > 0 for c in quiet)


def _traced(dev):
    x = np.arange(64, dtype=np.float32)
    dev.compute(flops=1e6)
    if dev.rank == 0:
        dev.send(x, 1)
    elif dev.rank == 1:
        dev.recv(0)
    dev.all_reduce(x, group="tp", algorithm="tree")  # messages, so the trace holds every byte the stats count


def test_trace_of_a_real_run_loads_as_chrome_json():
    mesh = Mesh({"dp": 2, "tp": 2})
    with VirtualCluster(mesh, hardware="h100-node") as cluster:
        cluster.run(_traced)
        trace = cluster.trace()
        stats = cluster.stats()
        assert len(cluster.trace(clear=True)) == len(trace)
        assert len(cluster.trace()) == 0
    kinds = {e.kind for e in trace.events}
    assert {"compute", "send", "recv", "collective"} <= kinds
    for clock in ("model", "wall"):
        doc = json.loads(json.dumps(trace.to_chrome(clock=clock)))
        events = doc["traceEvents"]
        names = {
            e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"
        }
        assert names[3] == "device 3 (dp=1, tp=1)"
        complete = [e for e in events if e.get("ph") == "X"]
        assert complete and all(e["dur"] >= 0 for e in complete)
        starts = {e["id"] for e in events if e.get("ph") == "s"}
        finishes = {e["id"] for e in events if e.get("ph") == "f"}
        assert starts and starts == finishes  # every send has its recv, each with one arrow
    summary = trace.summary()
    for (src, dst), nbytes in summary.link_bytes.items():
        assert nbytes == stats.bytes[src, dst]
    assert sum(summary.link_bytes.values()) == stats.total_bytes
    sends = trace.filter(kind="send")
    recvs = trace.filter(kind="recv")
    assert sorted(e.flow for e in sends) == sorted(e.flow for e in recvs)


def _matmul(dev):
    a = np.ones((64, 32), np.float32)
    b = np.ones((32, 16), np.float32)
    t0 = dev.clock
    c = dev.matmul(a, b)
    return float(c[0, 0]), dev.clock - t0


def test_matmul_kernel_charges_2mnk_flops():
    spec = get_hardware("laptop").device
    with VirtualCluster(1, hardware="laptop") as cluster:
        value, charged = cluster.run(_matmul)[0]
    assert value == 32.0
    flops = 2 * 64 * 16 * 32
    nbytes = 4 * (64 * 32 + 32 * 16 + 64 * 16)
    assert charged == pytest.approx(max(flops / spec.peak("float32"), nbytes / spec.memory_bandwidth),
                                    rel=1e-12)
