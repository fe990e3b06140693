"""Traces of real runs at their edges: ids across resets, a full log, pickled payloads on the
links, kernels on the wall clock, the pipeline timeline per cluster, hardware that cannot be."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

from virtualpar import Mesh, UsageError, VirtualCluster
from virtualpar.mesh import Topology
from virtualpar.runtime import cluster as cluster_module
from virtualpar.runtime.config import ClusterConfig
from virtualpar.sim.hardware import DeviceSpec, Hardware


def _ring_exchange(dev):
    right, left = (dev.rank + 1) % dev.size, (dev.rank - 1) % dev.size
    req = dev.isend(np.ones(4), right)
    dev.recv(left)
    req.wait()


def _leave_one_unreceived(dev):
    if dev.rank == 0:
        dev.send(np.ones(2), 1)


def test_flow_ids_stay_unique_across_resets():
    """A reset restarted message numbers, so the second run's sends reused the first run's ids and
    the Chrome writer kept one arrow of each pair."""
    with VirtualCluster(3) as cluster:
        cluster.run(_ring_exchange)
        with pytest.raises(Exception, match="never received"):
            cluster.run(_leave_one_unreceived)
        cluster.run(_ring_exchange)
        trace = cluster.trace()
    for kind in ("send", "recv"):
        flows = [e.flow for e in trace.events if e.kind == kind]
        assert len(flows) == len(set(flows)) and len(flows) >= 6, (kind, flows)
    sends = {e.flow for e in trace.events if e.kind == "send"}
    recvs = {e.flow for e in trace.events if e.kind == "recv"}
    assert {f for f in sends & recvs if f.endswith("@1")}  # the run after the reset, told apart


def test_a_full_event_log_is_reported(monkeypatch):
    monkeypatch.setattr(cluster_module, "ClusterConfig", functools.partial(ClusterConfig, max_events=5))
    with VirtualCluster(2) as cluster:
        cluster.run(lambda dev: [dev.compute(flops=1e6) for _ in range(8)])
        with pytest.warns(RuntimeWarning,
                          match=r"device 0 dropped 3 events, device 1 dropped 3 events past the 5"):
            trace = cluster.trace(clear=True)
        assert len(trace.events) == 10
        cluster.run(lambda dev: dev.compute(flops=1e6))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # cleared: nothing dropped since
            assert len(cluster.trace().events) == 2


def _sends(dev, wrap):
    if dev.rank == 0:
        reqs = [dev.isend({"a": np.ones(1 << 17)} if wrap else np.ones(1 << 17), 1) for _ in range(4)]
        for r in reqs:
            r.wait()
    else:
        for _ in range(4):
            dev.recv(0)
    return dev.clock


def test_a_pickled_payload_occupies_the_link_as_an_array_does():
    """Four 1 MiB dicts left at once (all at t = 0): 4 MiB through one link in one transfer time."""
    clocks = {}
    for wrap in (False, True):
        with VirtualCluster(2, hardware="h100-node") as cluster:
            clocks[wrap] = cluster.run(_sends, wrap)
    sender_array, sender_dict = clocks[False][0], clocks[True][0]
    assert sender_dict == pytest.approx(sender_array, rel=0.01)  # the pickle is a few bytes longer
    assert clocks[True][1] == pytest.approx(clocks[False][1], rel=0.01)


def _timed_matmul(dev):
    a = np.ones((400, 400))
    before = dev.wall
    dev.matmul(a, a)
    return before, dev.wall


def test_a_matmul_slice_on_the_wall_clock_covers_the_kernel():
    with VirtualCluster(1) as cluster:
        before, after = cluster.run(_timed_matmul)[0]
        (event,) = cluster.trace().filter(kind="compute").events
    assert before <= event.wall_start < before + 0.5 * (after - before)  # it began with the kernel
    assert event.wall_end <= after


def test_trace_filter_takes_numpy_ranks():
    with VirtualCluster(2) as cluster:
        cluster.run(lambda dev: dev.compute(flops=1.0))
        trace = cluster.trace()
    assert [e.rank for e in trace.filter(rank=np.int64(1)).events] == [1]
    assert len(trace.filter(rank=[np.int64(0), 1]).events) == 2


@pytest.mark.parametrize("make, said", [
    (lambda: Hardware("bad", "h100", 1e-6, 1e9), "device must be a DeviceSpec"),
    (lambda: DeviceSpec("d", 5, 1e12, 1e9), "peak_flops must be a mapping"),
    (lambda: DeviceSpec("d", [("float32",)], 1e12, 1e9), "peak_flops must be a mapping"),
    (lambda: Hardware("x", DeviceSpec("d", {"float32": 1e12}, 1e9, 1e9), float("inf"), 1e9),
     "intra_latency must be a finite number >= 0; got inf"),
    (lambda: Hardware("x", DeviceSpec("d", {"float32": 1e12}, 1e9, 1e9), True, 1e9),
     "intra_latency must be a number"),
    (lambda: DeviceSpec("d", {"float32": True}, 1e9, 1e9), r"peak_flops\['float32'\] must be a number"),
])
def test_hardware_that_cannot_be_is_refused_where_it_is_made(make, said):
    with pytest.raises(ValueError, match=said):
        make()


def test_a_mesh_topology_and_a_hardware_preset_are_not_both_taken():
    mesh = Mesh({"x": 4}, topology=Topology.ring(4, 1e-3, 1e6))
    with pytest.raises(UsageError,
                       match=r"own topology \(ring\(4\)\) and hardware='h100-node' brings another"):
        VirtualCluster(mesh, hardware="h100-node")
    with VirtualCluster(mesh) as cluster:  # its own links, modelled
        assert cluster.run(lambda dev: dev.barrier() or dev.clock)[0] > 1e-3


def test_a_pipeline_timeline_is_the_one_of_the_cluster_asked_for():
    """timeline(cluster=...) ignored the cluster: it showed the last step run anywhere, even for a
    cluster the operation never ran on."""
    from virtualpar import nn
    from virtualpar.pipeline import Pipeline, PipelinedOperation

    model = nn.Sequential(nn.Linear(4, 4, dtype=np.float64), nn.Linear(4, 4, seed=1, dtype=np.float64))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    op = PipelinedOperation(Pipeline(model, cuts=[1]), "gpipe", microbatches=2)
    with VirtualCluster(2) as first, VirtualCluster(2) as second, VirtualCluster(2) as idle:
        first.execute(op, x, y)
        on_first = op.timeline(cluster=first, clock="wall")
        second.execute(op, x, y)
        assert op.timeline(cluster=first, clock="wall") == on_first  # still the first cluster's step
        assert op.timeline(cluster=second, clock="wall") == op.timeline(clock="wall")  # the last one anywhere
        with pytest.raises(UsageError, match="has not run on this cluster"):
            op.timeline(cluster=idle)
