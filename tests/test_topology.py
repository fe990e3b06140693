"""Topology presets against closed forms, plus a brute-force reference for the routing rule."""

from __future__ import annotations

import math
import pickle

import networkx as nx
import pytest

from virtualpar.errors import MeshError
from virtualpar.mesh import TOPOLOGIES, Link, Route, Topology
from virtualpar.mesh import topology as topo_mod

# Powers of two keep sums of latencies exact, so closed forms can be compared with ==.
A, B = 0.25, 8.0


def ring_hops(i: int, j: int, n: int) -> int:
    d = abs(i - j)
    return min(d, n - d)


def brute_force_path(t: Topology, src: int, dst: int) -> tuple:
    """The documented rule by exhaustion: min latency, then hops, then lexicographic (devices < switches)."""
    g = t.graph

    def key(path):
        lat = 0.0
        for u, v in zip(path, path[1:]):
            lat += g.edges[u, v]["latency"]
        return (lat, len(path), tuple((0, x) if isinstance(x, int) else (1, x) for x in path))

    return tuple(min(nx.all_simple_paths(g, src, dst), key=key))


# -- presets: closed forms ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_fully_connected_every_pair_one_hop(n):
    t = Topology.fully_connected(n, latency=A, bandwidth=B)
    assert t.num_devices == n and t.devices == tuple(range(n)) and t.name == f"fully_connected({n})"
    assert t.graph.number_of_edges() == n * (n - 1) // 2
    for i in range(n):
        for j in range(n):
            if i != j:
                r = t.route(i, j)
                assert (r.path, r.links, r.latency, r.bandwidth) == ((i, j), ((i, j),), A, B)


def test_fully_connected_defaults_are_nvlink_class():
    r = Topology.fully_connected(8).route(0, 5)
    assert r.latency == topo_mod.NVLINK_LATENCY and r.bandwidth == topo_mod.NVLINK_BANDWIDTH == 450e9
    assert topo_mod.INFINIBAND_BANDWIDTH == 400e9 / 8  # NDR 400 Gb/s


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_ring_hops_and_costs(n):
    t = Topology.ring(n, latency=A, bandwidth=B)
    assert t.graph.number_of_edges() == {1: 0, 2: 1}.get(n, n)
    assert nx.number_of_selfloops(t.graph) == 0
    for i in range(n):
        for j in range(n):
            r = t.route(i, j)
            h = ring_hops(i, j, n)
            assert r.hops == h and r.latency == h * A
            assert r.bandwidth == (B if h else math.inf)


def test_ring8_half_way_and_time():
    r = Topology.ring(8, latency=A, bandwidth=B).route(0, 4)
    assert r.hops == 4 and r.latency == 4 * A and r.bandwidth == B
    assert r.path == (0, 1, 2, 3, 4)  # tie with 0,7,6,5,4 goes to the lexicographically smaller path
    assert r.time(64) == 4 * A + 64 / B
    assert Topology.ring(8, latency=A, bandwidth=B).route(4, 0).path == (4, 3, 2, 1, 0)


def test_torus_4x4_hop_counts():
    rows = cols = 4
    t = Topology.torus2d(rows, cols, latency=A, bandwidth=B)
    assert t.graph.number_of_edges() == 2 * rows * cols  # every device has degree 4
    for s in range(16):
        for d in range(16):
            expect = ring_hops(s // cols, d // cols, rows) + ring_hops(s % cols, d % cols, cols)
            r = t.route(s, d)
            assert r.hops == expect and r.latency == expect * A
    assert max(t.route(0, d).hops for d in range(16)) == 4


@pytest.mark.parametrize("rows,cols", [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (3, 3), (1, 5), (4, 2)])
def test_torus_small_sizes_no_selfloops_no_duplicates(rows, cols):
    t = Topology.torus2d(rows, cols, latency=A, bandwidth=B)
    per_ring = {1: 0, 2: 1}
    assert nx.number_of_selfloops(t.graph) == 0
    expected_edges = rows * per_ring.get(cols, cols) + cols * per_ring.get(rows, rows)
    assert t.graph.number_of_edges() == expected_edges
    for s in range(rows * cols):
        for d in range(rows * cols):
            hops = ring_hops(s // cols, d // cols, rows) + ring_hops(s % cols, d % cols, cols)
            assert t.route(s, d).hops == hops


def test_hierarchical_same_and_cross_node():
    ia, ib, ea, eb = 0.125, 64.0, 0.5, 4.0
    t = Topology.hierarchical(3, 4, ia, ib, ea, eb)
    assert t.num_devices == 12 and t.name == "hierarchical(3x4)"
    assert t.graph.number_of_nodes() == 12 + 3 + 1
    assert t.graph.number_of_edges() == 3 * 6 + 12 + 3
    for s in range(12):
        for d in range(12):
            r = t.route(s, d)
            if s == d:
                continue
            if s // 4 == d // 4:
                assert (r.hops, r.latency, r.bandwidth, r.path) == (1, ia, ib, (s, d))
            else:
                assert (r.hops, r.latency, r.bandwidth) == (4, 4 * ea, eb)
                assert r.path == (s, f"node{s // 4}-switch", "core-switch", f"node{d // 4}-switch", d)


def test_hierarchical_defaults_cross_node_is_infiniband():
    r = Topology.hierarchical(2, 8).route(0, 8)
    assert r.bandwidth == topo_mod.INFINIBAND_BANDWIDTH
    assert r.latency == pytest.approx(4 * topo_mod.INFINIBAND_LATENCY)
    assert Topology.hierarchical(2, 8).route(0, 7).bandwidth == topo_mod.NVLINK_BANDWIDTH


def test_hierarchical_prefers_switch_when_it_is_faster():
    # 2 * inter latency < intra latency: the minimum-latency route leaves the NVLink mesh.
    t = Topology.hierarchical(2, 2, intra_latency=1.0, intra_bandwidth=100.0,
                              inter_latency=0.25, inter_bandwidth=2.0)
    r = t.route(0, 1)
    assert r.path == (0, "node0-switch", 1) and r.latency == 0.5 and r.bandwidth == 2.0


def test_tie_on_latency_goes_to_fewer_hops():
    # Through the switch costs 2 * 0.25 = 0.5, exactly the direct NVLink latency: 1 hop wins.
    t = Topology.hierarchical(2, 2, intra_latency=0.5, intra_bandwidth=100.0,
                              inter_latency=0.25, inter_bandwidth=2.0)
    assert t.route(0, 1).path == (0, 1) and t.route(1, 0).bandwidth == 100.0
    g = nx.Graph()  # here the 2-hop path (0, 1, 3) is lexicographically smaller, yet loses on hops
    g.add_edge(0, 3, latency=0.5, bandwidth=B)
    g.add_edge(0, 1, latency=0.25, bandwidth=B)
    g.add_edge(1, 3, latency=0.25, bandwidth=B)
    g.add_node(2)
    g.add_edge(2, 3, latency=A, bandwidth=B)
    assert Topology(g).route(0, 3).path == (0, 3)


def test_tie_on_latency_and_hops_prefers_devices_then_smaller_names():
    g = nx.Graph()
    for u, v in [(0, "b-sw"), ("b-sw", 3), (0, "a-sw"), ("a-sw", 3), (0, 2), (2, 3), (0, 1)]:
        g.add_edge(u, v, latency=A, bandwidth=B)
    t = Topology(g)
    assert t.route(0, 3).path == (0, 2, 3) and t.route(3, 0).path == (3, 2, 0)
    g.remove_node(2)
    g.add_node(2)
    g.add_edge(2, 1, latency=A, bandwidth=B)
    assert Topology(g).route(0, 3).path == (0, "a-sw", 3)


# -- routing rule --------------------------------------------------------------------------------------

@pytest.mark.parametrize("build", [
    lambda: Topology.ring(6, A, B),
    lambda: Topology.torus2d(3, 3, A, B),
    lambda: Topology.torus2d(2, 4, A, B),
    lambda: Topology.hierarchical(2, 3, 0.5, 8.0, 0.125, 2.0),
    lambda: Topology.hierarchical(3, 2, 0.125, 8.0, 0.5, 2.0),
])
def test_routes_match_brute_force(build):
    t = build()
    for s in t.devices:
        for d in t.devices:
            if s < d:
                assert t.route(s, d).path == brute_force_path(t, s, d)
                assert t.route(d, s).path == t.route(s, d).path[::-1]


def test_routes_deterministic_cached_and_symmetric():
    t1, t2 = Topology.torus2d(4, 4), Topology.torus2d(4, 4)
    for s in range(16):
        for d in range(16):
            assert t1.route(s, d) == t2.route(s, d)
            assert t1.route(s, d) is t1.route(s, d)
            assert t1.route(s, d).latency == t1.route(d, s).latency
            assert t1.route(s, d).bandwidth == t1.route(d, s).bandwidth


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_self_route(name):
    t = TOPOLOGIES[name](2, 2) if name in ("torus2d", "hierarchical") else TOPOLOGIES[name](4)
    r = t.route(3, 3)
    assert r == Route(3, 3, (3,), (), 0.0, math.inf)
    assert r.hops == 0 and r.time(10**9) == 0.0


def test_route_links_are_consecutive_path_pairs_and_bottleneck():
    g = nx.Graph()
    g.add_edge(0, "sw", latency=0.5, bandwidth=10.0)
    g.add_edge("sw", 1, latency=0.25, bandwidth=3.0)
    g.add_edge(0, 1, latency=2.0, bandwidth=100.0)
    t = Topology(g, name="tiny")
    r = t.route(1, 0)
    assert r.path == (1, "sw", 0) and r.links == ((1, "sw"), ("sw", 0))
    assert r.latency == 0.75 and r.bandwidth == 3.0 and r.time(6) == 0.75 + 2.0
    assert t.link("sw", 1) == Link(0.25, 3.0) == t.link(1, "sw")
    assert Link(0.25, 4.0).time(8) == 2.25


# -- structure ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("t", [Topology.fully_connected(5), Topology.ring(7), Topology.torus2d(3, 4),
                               Topology.hierarchical(3, 2)], ids=lambda t: t.name)
def test_every_edge_has_figures_and_graph_is_frozen(t):
    assert t.graph.number_of_edges() > 0
    for u, v, data in t.graph.edges(data=True):
        assert data["latency"] >= 0 and data["bandwidth"] > 0
        assert all(isinstance(n, str) or 0 <= n < t.num_devices for n in (u, v))
    with pytest.raises(nx.NetworkXError):
        t.graph.add_edge(0, 1, latency=0.0, bandwidth=1.0)
    with pytest.raises(AttributeError):
        t.foo = 1  # type: ignore[attr-defined]


def test_registry_and_pickle_and_equality():
    assert set(TOPOLOGIES) == {"fully_connected", "ring", "torus2d", "hierarchical"}
    assert TOPOLOGIES["ring"](8) == Topology.ring(8)
    t = Topology.hierarchical(2, 4)
    t.route(0, 5)
    u = pickle.loads(pickle.dumps(t))
    assert u == t and hash(u) == hash(t) and u.name == t.name and u.route(0, 5) == t.route(0, 5)
    assert Topology.ring(4) != Topology.fully_connected(4)
    assert Topology.ring(3) == Topology.fully_connected(3)  # a 3-ring *is* K3 with the same figures
    assert Topology.ring(4, latency=1.0) != Topology.ring(4)
    g = nx.cycle_graph(4)
    nx.set_edge_attributes(g, topo_mod.NVLINK_LATENCY, "latency")
    nx.set_edge_attributes(g, topo_mod.NVLINK_BANDWIDTH, "bandwidth")
    custom = Topology(g)
    assert custom == Topology.ring(4) and custom.name == "custom(4)"
    g.add_edge(0, 2, latency=0.0, bandwidth=1.0)  # the topology copied the graph
    assert custom.graph.number_of_edges() == 4


# -- errors --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,match", [
    (lambda: Topology.fully_connected(0), r"fully_connected: n must be a positive integer; got 0"),
    (lambda: Topology.ring(-2), r"ring: n .* got -2"),
    (lambda: Topology.torus2d(0, 3), r"torus2d: rows .* got 0"),
    (lambda: Topology.torus2d(2, 2.5), r"torus2d: cols .* got 2.5"),
    (lambda: Topology.hierarchical(2, 0), r"devices_per_node .* got 0"),
    (lambda: Topology.ring(4, latency=-1e-6), r"latency must be .* >= 0; got -1e-06"),
    (lambda: Topology.ring(4, latency=math.nan), r"latency .* got nan"),
    (lambda: Topology.fully_connected(4, bandwidth=0), r"bandwidth must be > 0 .* got 0"),
    (lambda: Topology.hierarchical(2, 2, inter_bandwidth=-5.0), r"hierarchical inter: bandwidth .* got -5.0"),
    (lambda: Topology.torus2d(2, 2, bandwidth=math.nan), r"bandwidth .* got nan"),
])
def test_preset_errors(call, match):
    with pytest.raises(MeshError, match=match):
        call()


@pytest.mark.parametrize("src,dst,match", [
    (0, 8, r"destination must be a device 0..7 .* got 8"),
    (-1, 0, r"source must be a device 0..7 .* got -1"),
    ("core-switch", 0, r"source .* got 'core-switch'"),
    (0, "node1-switch", r"destination .* got 'node1-switch'"),
    (True, 0, r"source .* got True"),
])
def test_route_endpoint_errors(src, dst, match):
    with pytest.raises(MeshError, match=match):
        Topology.hierarchical(2, 4).route(src, dst)


def _graph(*edges, nodes=()):
    g = nx.Graph()
    g.add_nodes_from(nodes)
    for u, v in edges:
        g.add_edge(u, v, latency=1.0, bandwidth=1.0)
    return g


def test_custom_graph_errors():
    with pytest.raises(MeshError, match=r"no path between device 0 and device 2 .*\[2, 3\]"):
        Topology(_graph((0, 1), (2, 3)), name="split")
    with pytest.raises(MeshError, match=r"ints 0..n-1 .* got \[0, 2\]"):
        Topology(_graph((0, "sw"), ("sw", 2)))
    with pytest.raises(MeshError, match=r"switch nodes must be strings; got \[\(1, 2\)\]"):
        Topology(_graph((0, (1, 2))))
    with pytest.raises(MeshError, match=r"self-loop on node 0"):
        Topology(_graph((0, 0), (0, 1)))
    g = nx.Graph()
    g.add_edge(0, 1, latency=1.0)
    with pytest.raises(MeshError, match=r"edge \(0, 1\) needs 'latency' and 'bandwidth'"):
        Topology(g)
    with pytest.raises(MeshError, match=r"undirected networkx.Graph; got DiGraph"):
        Topology(nx.DiGraph(_graph((0, 1))))
    with pytest.raises(MeshError, match=r"no link between 0 and 2"):
        Topology.ring(4).link(0, 2)
    with pytest.raises(MeshError, match=r"nbytes must be >= 0; got -1"):
        Topology.ring(4).route(0, 1).time(-1)
    assert Topology(_graph(nodes=[0])).route(0, 0).latency == 0.0


def _detour_graph() -> nx.Graph:
    """0--1 directly (latency 1.0), and 0--2--1 at 0.25 each: the direct link is not the route."""
    g = nx.Graph()
    g.add_edge(0, 1, latency=1.0, bandwidth=B)
    g.add_edge(0, 2, latency=A, bandwidth=2 * B)
    g.add_edge(2, 1, latency=A, bandwidth=4 * B)
    return g


@pytest.mark.parametrize("build", [
    lambda: Topology.fully_connected(6, A, B),
    lambda: Topology.ring(7, A, B),
    lambda: Topology.torus2d(3, 4, A, B),
    lambda: Topology.hierarchical(2, 3, 0.5, 8.0, 0.125, 2.0),
    lambda: Topology.hierarchical(2, 2, intra_latency=1.0, intra_bandwidth=100.0, inter_latency=0.25,
                                  inter_bandwidth=50.0),
    lambda: Topology(_detour_graph(), name="detour"),
])
def test_figures_are_the_routes_figures_for_every_pair(build):
    """Devices read direct links' figures from numpy tables; every answer must be the route's."""
    t = build()
    for s in range(t.num_devices):
        for d in range(t.num_devices):
            r = t.route(s, d)
            assert t.figures(s, d) == (r.latency, r.bandwidth), (t.name, s, d)


def test_a_direct_link_longer_than_a_detour_is_not_read_from_the_table():
    t = Topology(_detour_graph())
    assert t.figures(0, 1) == (2 * A, 2 * B)  # via device 2; the bottleneck is the 0--2 link
    assert t.route(0, 1).path == (0, 2, 1)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_fully_connected_builds_its_graph_only_when_asked_and_equals_the_eager_one(n):
    from virtualpar.mesh import presets

    lazy = Topology.fully_connected(n, latency=2e-6, bandwidth=3e11)
    eager = Topology(presets.fully_connected(n, 2e-6, 3e11)[0], name=f"fully_connected({n})")
    for s in range(n):  # what devices read: the direct-link tables, no graph
        for d in range(n):
            assert lazy.figures(s, d) == eager.figures(s, d)
    assert all(lazy.route(s, d) == eager.route(s, d) for s in range(n) for d in range(n))  # as devices ask
    if n > 1:
        assert lazy.link(0, n - 1) == Link(2e-6, 3e11)
    assert lazy._graph is None and repr(lazy) == repr(eager)
    copy = pickle.loads(pickle.dumps(lazy))  # a recipe, not n(n-1)/2 edges
    assert len(pickle.dumps(lazy)) < 300
    for topo in (lazy, copy):
        assert topo == eager and hash(topo) == hash(eager)
        assert all(topo.route(s, d) == eager.route(s, d) for s in range(n) for d in range(n))
        assert nx.utils.graphs_equal(topo.graph, eager.graph)
    with pytest.raises(MeshError, match="positive integer"):
        Topology.fully_connected(0)
    with pytest.raises(MeshError, match="bandwidth"):
        Topology.fully_connected(3, bandwidth=0)


@pytest.mark.parametrize("build", [lambda: Topology.fully_connected(6), lambda: Topology.hierarchical(2, 3),
                                   lambda: Topology.ring(5), lambda: Topology.torus2d(2, 3)])
def test_figures_many_equals_figures_pair_by_pair(build):
    topo = build()
    n = topo.num_devices
    src = [s for s in range(n) for _ in range(n)]
    dst = [d for _ in range(n) for d in range(n)]
    lat, bw = topo.figures_many(src, dst)
    assert [(float(a), float(b)) for a, b in zip(lat, bw)] == [topo.figures(s, d) for s, d in zip(src, dst)]
    assert [x.size for x in topo.figures_many([], [])] == [0, 0]
    with pytest.raises(MeshError, match="devices 0.."):
        topo.figures_many([0, n], [1, 0])
    with pytest.raises(MeshError, match="equal-length"):
        topo.figures_many([0, 1], [1])
