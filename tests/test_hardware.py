"""Device specs (roofline), hardware presets and their topologies, and the α–β closed forms."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from virtualpar.errors import MeshError
from virtualpar.mesh.topology import Topology
from virtualpar.sim import analytic
from virtualpar.sim.hardware import HARDWARE, IDEAL_DEVICE, DeviceSpec, Hardware, dtype_name, get_hardware

REL = 1e-12


def spec(**kw) -> DeviceSpec:
    args = dict(name="toy", peak_flops={"float32": 1e12, "float64": 5e11, "bfloat16": 4e12},
                memory_bandwidth=1e11, memory_capacity=1e9)
    args.update(kw)
    return DeviceSpec(**args)


# --- DeviceSpec ----------------------------------------------------------------------------------

def test_peak_flops_mapping_is_stored_as_sorted_pairs_and_spec_is_hashable():
    s = spec()
    assert s.peak_flops == (("bfloat16", 4e12), ("float32", 1e12), ("float64", 5e11))
    assert hash(s) == hash(spec(peak_flops={"bfloat16": 4e12, "float64": 5e11, "float32": 1e12}))
    assert s == spec(peak_flops=(("float64", 5e11), ("float32", 1e12), ("bfloat16", 4e12)))


@pytest.mark.parametrize("dtype, expected", [
    ("float32", 1e12), (np.float32, 1e12), (np.dtype("f4"), 1e12), ("f8", 5e11), (np.float64, 5e11),
    ("bfloat16", 4e12),
    # no figure of their own -> the float32 figure
    ("int64", 1e12), (np.complex128, 1e12), ("float8", 1e12),
])
def test_peak_accepts_numpy_dtypes_and_names_and_falls_back_to_float32(dtype, expected):
    assert spec().peak(dtype) == expected


def test_dtype_name():
    assert dtype_name(np.float16) == "float16"
    assert dtype_name("i8") == "int64"
    assert dtype_name("bfloat16") == "bfloat16"
    with pytest.raises(TypeError):
        dtype_name(object())
    # cached per key: equal dtypes spelled differently, asked twice, and an unhashable spelling
    for _ in range(2):
        assert [dtype_name(d) for d in ("f4", np.float32, np.dtype("float32"), "float32")] == ["float32"] * 4
        assert dtype_name("bfloat16") == "bfloat16" and dtype_name(np.int8) == "int8"
        assert dtype_name([("a", "f8")]) == np.dtype([("a", "f8")]).name
        with pytest.raises(TypeError):
            dtype_name(object())


def test_roofline_compute_bound():
    # 2 TFLOP at 1 TFLOP/s = 2 s; 10 GB at 100 GB/s = 0.1 s -> compute wins
    assert spec().compute_time(2e12, 1e10, "float32") == pytest.approx(2.0, rel=REL)
    # the same flops in bfloat16 run 4x faster
    assert spec().compute_time(2e12, 1e10, "bfloat16") == pytest.approx(0.5, rel=REL)


def test_roofline_memory_bound():
    # 1 GFLOP at 1 TFLOP/s = 1 ms; 100 GB at 100 GB/s = 1 s -> memory wins
    assert spec().compute_time(1e9, 1e11, "float32") == pytest.approx(1.0, rel=REL)


def test_roofline_matmul_by_hand():
    # C = A @ B, all n x n float64: 2 n^3 flops, 3 n^2 * 8 bytes of traffic
    n = 1024
    flops, nbytes = 2 * n**3, 3 * n * n * 8
    expected = max(flops / 5e11, nbytes / 1e11)
    assert spec().compute_time(flops, nbytes, np.float64) == pytest.approx(expected, rel=REL)
    assert expected == pytest.approx(2 * n**3 / 5e11, rel=REL)  # large matmuls are compute-bound


def test_ideal_device_is_free():
    assert IDEAL_DEVICE.compute_time(1e30, 1e30, "float64") == 0.0
    assert IDEAL_DEVICE.compute_time() == 0.0
    assert IDEAL_DEVICE.peak("int8") == math.inf


@pytest.mark.parametrize("kw", [
    dict(peak_flops={"float64": 1e12}),           # no float32 fallback
    dict(peak_flops={"float32": 0.0}),
    dict(peak_flops={"float32": -1.0}),
    dict(memory_bandwidth=0),
    dict(memory_bandwidth=float("nan")),
    dict(memory_capacity=-5),
])
def test_device_spec_rejects_bad_figures(kw):
    with pytest.raises(ValueError):
        spec(**kw)


def test_compute_time_rejects_negative_work():
    with pytest.raises(ValueError, match="flops"):
        spec().compute_time(-1.0, 0.0)
    with pytest.raises(ValueError, match="nbytes"):
        spec().compute_time(0.0, -1.0)


# --- Hardware and presets ------------------------------------------------------------------------

def _all_edges(topo: Topology) -> list[tuple[float, float]]:
    return [(d["latency"], d["bandwidth"]) for _, _, d in topo.graph.edges(data=True)]


def test_registry_has_the_presets():
    assert {"laptop", "h100-node", "h100-cluster"} <= set(HARDWARE)
    for name, hw in HARDWARE.items():
        assert isinstance(hw, Hardware) and hw.name == name


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_every_preset_builds_eight_devices(name):
    hw = HARDWARE[name]
    topo = hw.topology(8)
    assert topo.num_devices == 8
    # 8 devices fit in one node of every preset: fully connected with the intra figures
    assert topo == Topology.fully_connected(8, latency=hw.intra_latency, bandwidth=hw.intra_bandwidth)
    for s in range(8):
        for d in range(8):
            if s != d:
                r = topo.route(s, d)
                assert (r.latency, r.bandwidth, len(r.links)) == (hw.intra_latency, hw.intra_bandwidth, 1)


@pytest.mark.parametrize("n", [16, 32])
def test_h100_cluster_spans_nodes(n):
    hw = HARDWARE["h100-cluster"]
    topo = hw.topology(n)
    assert topo.num_devices == n
    assert topo == Topology.hierarchical(n // 8, 8, hw.intra_latency, hw.intra_bandwidth,
                                         hw.inter_latency, hw.inter_bandwidth)
    inside = topo.route(0, 7)
    assert (inside.latency, inside.bandwidth) == (hw.intra_latency, hw.intra_bandwidth)
    across = topo.route(3, n - 1)
    assert across.latency == pytest.approx(4 * hw.inter_latency, rel=REL)  # 4 hops via the core switch
    assert across.bandwidth == hw.inter_bandwidth


def test_preset_figures_match_their_datasheets():
    h100 = HARDWARE["h100-node"].device
    assert h100.peak("bfloat16") == h100.peak("float16") == pytest.approx(989.4e12, rel=REL)
    assert h100.peak("float64") == h100.peak("float32") == pytest.approx(67e12, rel=REL)
    assert h100.memory_bandwidth == pytest.approx(3.35e12, rel=REL)
    assert HARDWARE["h100-node"].intra_bandwidth == pytest.approx(450e9, rel=REL)
    assert HARDWARE["h100-cluster"].inter_bandwidth == pytest.approx(400e9 / 8, rel=REL)  # 400 Gb/s
    laptop = HARDWARE["laptop"]
    assert 100e9 <= laptop.device.peak("float32") <= 1e12
    assert 1e9 <= laptop.intra_bandwidth <= 10e9 and 5e-6 <= laptop.intra_latency <= 50e-6


def test_single_node_hardware_refuses_more_devices_than_a_node():
    with pytest.raises(MeshError, match=r"'h100-node'.*at most 8.*got 16"):
        HARDWARE["h100-node"].topology(16)


def test_cluster_refuses_ragged_last_node():
    with pytest.raises(MeshError, match=r"12 devices.*multiple of 8"):
        HARDWARE["h100-cluster"].topology(12)


def test_cluster_with_fewer_devices_than_a_node_is_one_node():
    hw = HARDWARE["h100-cluster"]
    assert hw.topology(4) == Topology.fully_connected(4, latency=hw.intra_latency,
                                                      bandwidth=hw.intra_bandwidth)
    assert hw.topology(1).num_devices == 1


@pytest.mark.parametrize("n", [0, -1, 2.0, True])
def test_topology_rejects_bad_device_counts(n):
    with pytest.raises(MeshError):
        HARDWARE["laptop"].topology(n)


def test_laptop_takes_any_number_of_devices():
    assert HARDWARE["laptop"].topology(13).num_devices == 13


def test_uniform_hardware():
    hw = Hardware.uniform(3e-6, 7e9)
    assert hw.device == IDEAL_DEVICE
    topo = hw.topology(5)
    assert topo.graph.number_of_edges() == 10
    assert set(_all_edges(topo)) == {(3e-6, 7e9)}
    assert Hardware.uniform(1e-6, 1e9, device=spec()).device == spec()


def test_hardware_validation():
    with pytest.raises(ValueError, match="both"):
        Hardware("x", IDEAL_DEVICE, 1e-6, 1e9, devices_per_node=4, inter_latency=1e-6)
    with pytest.raises(ValueError, match="devices_per_node"):
        Hardware("x", IDEAL_DEVICE, 1e-6, 1e9, inter_latency=1e-6, inter_bandwidth=1e9)
    with pytest.raises(ValueError, match="devices_per_node"):
        Hardware("x", IDEAL_DEVICE, 1e-6, 1e9, devices_per_node=0)
    with pytest.raises(ValueError, match="intra_bandwidth"):
        Hardware("x", IDEAL_DEVICE, 1e-6, 0.0)


def test_get_hardware():
    assert get_hardware("laptop") is HARDWARE["laptop"]
    custom = Hardware.uniform(1e-6, 1e9)
    assert get_hardware(custom) is custom
    for bad in ("h100", "LAPTOP", 3, None):
        with pytest.raises(ValueError) as info:
            get_hardware(bad)
        msg = str(info.value)
        assert repr(bad) in msg and all(repr(name) in msg for name in HARDWARE)


@pytest.mark.parametrize("obj", [IDEAL_DEVICE, spec(), *HARDWARE.values(), Hardware.uniform(2e-6, 3e9)])
def test_pickle_round_trip(obj):
    back = pickle.loads(pickle.dumps(obj))
    assert back == obj and hash(back) == hash(obj)


# --- analytic closed forms, checked against the step counts written out by hand -------------------

A, B, M = 5e-6, 2e9, 3 * 2**20


def test_analytic_n1_costs_nothing():
    for f in (analytic.ring_all_reduce, analytic.ring_all_gather, analytic.ring_reduce_scatter,
              analytic.tree_broadcast, analytic.direct_all_reduce, analytic.two_shot_all_reduce):
        assert f(1, M, A, B) == 0.0


def test_analytic_small_cases_by_hand():
    assert analytic.p2p(M, A, B) == pytest.approx(A + M / B, rel=REL)
    # n=4 ring all-reduce: 3 reduce-scatter + 3 all-gather steps of M/4 bytes
    assert analytic.ring_all_reduce(4, M, A, B) == pytest.approx(6 * (A + M / 4 / B), rel=REL)
    assert analytic.ring_all_gather(4, M, A, B) == pytest.approx(3 * (A + M / 4 / B), rel=REL)
    assert analytic.ring_reduce_scatter(4, M, A, B) == analytic.ring_all_gather(4, M, A, B)
    # n=5 binomial broadcast: rounds 0->1; 0->2,1->3; 0->4 = 3 rounds; depth of rank 3 (0->1->3) = 2
    assert analytic.tree_broadcast(5, M, A, B) == pytest.approx(3 * (A + M / B), rel=REL)
    assert analytic.tree_broadcast(5, M, A, B, concurrent=True) == pytest.approx(2 * (A + M / B), rel=REL)
    assert analytic.two_shot_all_reduce(4, M, A, B) == pytest.approx(6 * (A + M / 4 / B), rel=REL)
    assert analytic.two_shot_all_reduce(4, M, A, B,
                                        concurrent=True) == pytest.approx(2 * (A + M / 4 / B), rel=REL)
    # one-shot: the whole M to each of the 3 peers
    assert analytic.direct_all_reduce(4, M, A, B) == pytest.approx(3 * (A + M / B), rel=REL)
    assert analytic.direct_all_reduce(4, M, A, B, concurrent=True) == pytest.approx(A + M / B, rel=REL)


@pytest.mark.parametrize("n", range(1, 17))
def test_tree_broadcast_step_counts(n):
    rounds, k = 0, 1  # count rounds until 2^rounds >= n; depth = max popcount below n
    while k < n:
        rounds, k = rounds + 1, 2 * k
    depth = max(bin(r).count("1") for r in range(n))
    assert analytic.tree_broadcast(n, M, A, B) == pytest.approx(rounds * (A + M / B), rel=REL)
    assert analytic.tree_broadcast(n, M, A, B, concurrent=True) == pytest.approx(depth * (A + M / B), rel=REL)


@pytest.mark.parametrize("args",
                         [(0, M, A, B), (2, -1, A, B), (2, M, -1e-6, B), (2, M, A, 0.0), (2.0, M, A, B)])
def test_analytic_rejects_bad_arguments(args):
    with pytest.raises(ValueError):
        analytic.ring_all_reduce(*args)


def test_uniform_hardware_is_named_in_the_one_spelling_of_units():
    """It was named uniform(α=1.6e-05s, β=2.5e+10B/s)."""
    from virtualpar.sim import Hardware

    assert Hardware.uniform(latency=1.6e-05, bandwidth=25e9).name == "uniform(α=16 µs, β=25 GB/s)"
    assert Hardware.uniform(latency=0.0, bandwidth=float("inf")).name == "uniform(α=0 s, β=inf B/s)"
    assert Hardware.uniform(latency=1e-6, bandwidth=1e9, name="mine").name == "mine"
