"""The per-message fast paths keep every observable result: cached routes give bit-identical clocks,
recorded texts read as before, lazily built events and timeout errors say the same things.

References are independent: the α–β formulas evaluated with a fresh ``topology.route()`` per
message, f-strings of what a record must say, and ``Event`` objects built directly.
"""

from __future__ import annotations

import math
import random
import time

import networkx as nx
import numpy as np
import pytest

from virtualpar import VirtualCluster
from virtualpar.errors import MeshError, P2PTimeout, PayloadError, UsageError
from virtualpar.mesh.topology import Topology
from virtualpar.runtime.event_log import EventLog
from virtualpar.runtime.recorder import FlightRecorder, OpTexts
from virtualpar.sim.clock import DeviceClock
from virtualpar.trace.event import Event
from virtualpar.transport.shm import RECORD_BYTES, RECORD_SLOTS

from ._timing import raises_within


# -- the modelled clock: route figures cached per peer ---------------------------------------------

class RefClock:
    """The clock's formulas with a fresh route and link lookup per message (the uncached reference)."""

    def __init__(self, rank: int, topo: Topology) -> None:
        self.rank, self.topo, self.now, self.busy = rank, topo, 0.0, {}

    def on_send(self, dst: int, n: int) -> float:
        links = self.topo.route(self.rank, dst).links
        if not links:
            return self.now
        depart = max(self.now, self.busy.get(links[0], 0.0))
        self.busy[links[0]] = depart + (n / self.topo.link(*links[0]).bandwidth if n else 0.0)
        return depart

    def on_recv(self, src: int, n: int, stamp: float) -> float:
        route = self.topo.route(src, self.rank)
        if not route.links:
            self.now = max(self.now, stamp)
            return self.now
        last = route.links[-1]
        arrival = stamp + route.latency + (n / route.bandwidth if n else 0.0)
        arrival = max(arrival, self.busy.get(last, 0.0) + (n / self.topo.link(*last).bandwidth if n else 0.0))
        self.busy[last] = arrival
        self.now = max(self.now, arrival)
        return arrival

    def send_done(self, dst: int, n: int, stamp: float) -> float:
        end = stamp + self.topo.route(self.rank, dst).time(n)
        self.now = max(self.now, end)
        return end


def _uneven() -> Topology:
    """Two switches; every link has its own figures, so first, last and bottleneck links all differ."""
    g = nx.Graph()
    for u, v, lat, bw in [(0, "s0", 1e-6, 50e9), (1, "s0", 1.5e-6, 40e9), ("s0", "s1", 3e-6, 5e9),
                          (2, "s1", 0.7e-6, 30e9), (3, "s1", 0.9e-6, 20e9), (0, 1, 0.5e-6, 80e9)]:
        g.add_edge(u, v, latency=lat, bandwidth=bw)
    return Topology(g, name="uneven")


TOPOLOGIES = {
    "fully_connected": lambda: Topology.fully_connected(4, latency=7e-6, bandwidth=3e9),
    "ring": lambda: Topology.ring(5, latency=1.3e-6, bandwidth=25e9),
    "hierarchical": lambda: Topology.hierarchical(2, 3, 1e-6, 100e9, 2e-6, 10e9),
    "uneven": _uneven,
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_cached_routes_give_bit_identical_clocks(name, seed):
    topo = TOPOLOGIES[name]()
    n = topo.num_devices
    rng = random.Random(seed)
    if name == "uneven":  # the reference would not notice a cache of the wrong link's figures otherwise
        route = topo.route(0, 3)
        bws = {topo.link(*route.links[0]).bandwidth, topo.link(*route.links[-1]).bandwidth, route.bandwidth}
        assert len(bws) == 3
    fast = [DeviceClock(r, topo) for r in range(n)]
    ref = [RefClock(r, topo) for r in range(n)]
    inbox: list[list[tuple[int, int, float]]] = [[] for _ in range(n)]
    for _ in range(400):
        r = rng.randrange(n)
        action = rng.random()
        if action < 0.45:  # post a send (to oneself sometimes)
            dst, size = rng.randrange(n), rng.choice([0, 1, 4096, 3 * 2**20 + 5])
            stamp = fast[r].on_send(dst, size)
            assert stamp == ref[r].on_send(dst, size)
            inbox[dst].append((r, size, stamp))
            if rng.random() < 0.5:  # the sender waits on it
                assert fast[r].on_send_done(dst, size, stamp) == ref[r].send_done(dst, size, stamp)
        elif action < 0.9 and inbox[r]:  # receive any pending message, in this device's program order
            src, size, stamp = inbox[r].pop(rng.randrange(len(inbox[r])))
            assert fast[r].on_recv(src, size, stamp) == ref[r].on_recv(src, size, stamp)
        else:
            t = fast[r].now + rng.random() * 1e-4
            fast[r].advance_to(t)
            ref[r].now = max(ref[r].now, t)
        assert fast[r].now == ref[r].now
    for r in range(n):
        for (u, v), t in ref[r].busy.items():
            assert fast[r].busy_until(u, v) == t


def test_route_time_is_the_routes_time():
    topo = _uneven()
    for r in range(topo.num_devices):
        clock = DeviceClock(r, topo)
        for dst in range(topo.num_devices):
            for size in (0, 1, 4096, 12 * 2**20):
                assert clock.route_time(dst, size) == topo.route(r, dst).time(size)
        with pytest.raises(MeshError, match="nbytes must be >= 0"):
            clock.route_time(1 - r % 2, -1)


@pytest.mark.parametrize("peer", [True, np.int64(1), 1.0, 9, -1])
def test_bad_peers_are_rejected_even_after_a_good_one_was_cached(peer):
    clock = DeviceClock(0, Topology.fully_connected(3))
    clock.on_recv(1, 8, clock.on_send(1, 8))  # caches peer 1 both ways
    with pytest.raises(MeshError, match="must be a device"):
        clock.on_send(peer, 8)
    with pytest.raises(MeshError, match="must be a device"):
        clock.on_recv(peer, 8, 0.0)


def test_send_done_and_recv_validate_like_before():
    clock = DeviceClock(0, Topology.fully_connected(2))
    with pytest.raises(UsageError, match="got nan"):
        clock.on_send_done(1, 8, math.nan)
    with pytest.raises(UsageError, match="nbytes must be a number >= 0; got -1"):
        clock.on_send(1, -1)
    with pytest.raises(UsageError, match="finite"):
        clock.on_recv(1, 8, math.inf)
    assert clock.on_send(1, 8.0) == 0.0  # a float byte count still works (numbers.Real)


# -- the flight recorder --------------------------------------------------------------------------

class _Arena:
    """Process-local stand-in for the shared arena: numpy views of one bytearray."""

    def __init__(self, nbytes: int) -> None:
        self.buf = bytearray(nbytes)

    def view(self, offset: int, count: int, dtype: type = np.uint8) -> np.ndarray:
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=offset)


class _Layout:
    def recorder_offset(self, rank: int) -> int:
        return rank * (64 + RECORD_SLOTS * RECORD_BYTES)


def _recorder() -> FlightRecorder:
    arena = _Arena(2 * (64 + RECORD_SLOTS * RECORD_BYTES))
    return FlightRecorder(arena, _Layout(), 1)  # type: ignore[arg-type]


def test_recorder_round_trip_with_text_or_encoded_text():
    rec = _recorder()
    a = rec.start(7, "send to 0 tag=2 array(shape=(4,), float32)", 0.5, run=3)
    b = rec.start(8, "recv from 0 tag=2".encode(), 0.75, run=3)
    rec.finish(a, 1.25)
    rec.finish(b, 2.5, failed=True)
    first, second = rec.records()
    assert (first.rank, first.seq, first.state, first.run, first.model_start, first.model_end,
            first.text) == \
        (1, 7, "done", 3, 0.5, 1.25, "send to 0 tag=2 array(shape=(4,), float32)")
    assert (second.seq, second.state, second.model_start, second.model_end, second.text) == \
        (8, "failed", 0.75, 2.5, "recv from 0 tag=2")
    assert 0 < first.wall_start <= first.wall_end


def test_recorder_keeps_the_last_slots_and_cuts_long_text_like_before():
    rec = _recorder()
    long = "é" * 150  # 300 UTF-8 bytes: the cut falls inside a character
    for seq in range(1, RECORD_SLOTS + 11):
        slot = rec.start(seq, long if seq == RECORD_SLOTS + 10 else f"op {seq}", float(seq))
        if seq % 2:
            rec.finish(slot, seq + 0.5)
    recs = rec.records()
    assert [r.seq for r in recs] == list(range(11, RECORD_SLOTS + 11))
    assert [r.state for r in recs[:2]] == ["done", "started"]
    assert recs[-1].text == long.encode()[:208].decode("utf-8", "replace") and recs[-1].state == "started"
    assert recs[-2].text == f"op {RECORD_SLOTS + 9}" and recs[-2].model_end == RECORD_SLOTS + 9.5


def test_recorder_rewrites_a_slots_text_whenever_it_changes():
    """A slot skips its text only when handed the very bytes it holds; every record still reads right."""
    rec = _recorder()
    texts = [f"op {k}".encode() for k in range(5)]  # the same objects each time, as OpTexts hands them out
    expected = {}
    seq = 0
    for period in (2, 3, 4, 1, 5):  # loops whose period divides the slots, and ones that do not
        for k in range(3 * RECORD_SLOTS):
            seq += 1
            raw = texts[k % period]
            if k % 7 == 0:
                raw = bytes(raw)  # equal bytes in a new object: written again
            if k % 11 == 0:
                raw = raw.decode()  # a str (collectives): always written
            rec.start(seq, raw, float(seq))
            expected[seq] = raw if isinstance(raw, str) else raw.decode()
        assert [(r.seq, r.text) for r in rec.records()] == [
            (q, expected[q]) for q in range(seq - RECORD_SLOTS + 1, seq + 1)
        ]


def test_op_texts_name_what_was_sent_even_as_dtypes_change():
    texts = OpTexts(limit=3)
    aligned = np.dtype({"names": ["a", "b"], "formats": ["i1", "i4"]}, align=True)
    packed = np.dtype({"names": ["a", "b"], "formats": ["i1", "i4"], "offsets": [0, 4], "itemsize": 8})
    assert aligned == packed and str(aligned) != str(packed)  # why structured dtypes are never kept
    cases = [
        (np.zeros((4, 8), np.float32), 1, 0), (np.zeros((4, 8), np.float64), 1, 0),
        (np.zeros((4, 8), np.float32), 1, 0), (np.zeros(3, np.dtype(">i4")), 2, 7),
        ({"a": 1}, 1, 0), ([1, 2], 1, 0), (np.zeros(2, aligned), 1, 0), (np.zeros(2, packed), 1, 0),
        (np.zeros((4, 8), np.float32), 1, 0), (3, 2, 5),
    ]
    for x, dst, tag in cases:
        what = f"array(shape={x.shape}, {x.dtype})" if isinstance(x, np.ndarray) else type(x).__name__
        text, raw = texts.send(x, dst, tag)
        assert text == f"send to {dst} tag={tag} {what}" and raw == text.encode()
    for src, tag in [(0, 3), (1, 3), (0, 3), (0, 4), (2, 0), (0, 3)]:
        assert texts.recv(src, tag) == (f"recv from {src} tag={tag}", f"recv from {src} tag={tag}".encode())


def test_event_log_builds_the_same_events():
    log = EventLog(rank=2)
    log.add("send", "send", 0.1, 0.2, 1.0, 1.5, 4, {"nbytes": 64, "peer": 1, "flow": "2>1#1"})
    log.add("compute", "mm", 0.3, 0.4, 1.5, 2.0, 4, {"args": (("flops", 8.0),)})
    assert len(log) == 2
    assert list(log) == [
        Event(rank=2, kind="send", name="send", wall_start=0.1, wall_end=0.2, model_start=1.0, model_end=1.5,
              seq=4, nbytes=64, peer=1, flow="2>1#1"),
        Event(rank=2, kind="compute", name="mm", wall_start=0.3, wall_end=0.4, model_start=1.5, model_end=2.0,
              seq=4, args=(("flops", 8.0),)),
    ]
    log.clear()
    assert list(log) == [] and len(log) == 0


def test_event_log_builds_each_kind_of_event_it_keeps():
    log = EventLog(rank=3, t0=10.0)
    traced = ((1, 3), (4,), "float64", "shm")
    log.message("send", 10.5, 1.0, 1.5, 4, 64, 1, (3, 1, 17, 0))
    log.message("recv", 10.5, 1.0, 1.5, 5, 64, 1, (1, 3, 9, 2))
    log.message("send", 10.5, 1.0, 1.5, 6, 8, 2, None)
    log.collective("all_reduce", 10.5, 1.5, 2.0, 7, 96, traced, 3)
    log.compute("mm", 10.5, 2.0, 2.5, 8, 8.0, 16.0)
    events = list(log)
    assert [(e.kind, e.name, e.seq, e.wall_start) for e in events] == [
        ("send", "send", 4, 0.5), ("recv", "recv", 5, 0.5), ("send", "send", 6, 0.5),
        ("collective", "all_reduce", 7, 0.5), ("compute", "mm", 8, 0.5)]
    assert [(e.nbytes, e.peer, e.flow) for e in events[:3]] == [(64, 1, "3>1#17"), (64, 1, "1>3#9@2"),
                                                                (8, 2, None)]
    assert (events[3].nbytes, events[3].group, events[3].shape, events[3].dtype, events[3].args) == \
        (96, (1, 3), (4,), "float64", (("algorithm", "shm"), ("group_seq", 3)))
    assert events[4].args == (("flops", 8.0), ("bytes", 16.0)) and events[4].model_end == 2.5


def test_keeping_events_leaves_nothing_for_the_garbage_collector():
    """A kept event holds no container made for it: a tuple per event made the collector run every
    ~230 events and walk the growing log, ~1 µs per event (runtime/event_log.py)."""
    import gc

    log, traced = EventLog(rank=0), ((0, 1), (), "float64", "shm")
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for i in range(1000):
            log.message("send", 0.0, 1.0, 2.0, i, 4096, 1, (0, 1, i, 0))
            log.collective("barrier", 0.0, 1.0, 2.0, i, 0, traced, i)
            log.compute("mm", 0.0, 1.0, 2.0, i, 8.0, 16.0)
        grown = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert len(log) == 3000 and grown < 30, grown  # (~9000 with a tuple per event and per fields)
    assert not any(gc.is_tracked(slot) for slot in log._flat if slot is not traced)


# -- through a cluster ------------------------------------------------------------------------------

def mixed_sends(dev):
    """Device 0 sends arrays of changing dtype and a dict; device 1 receives them."""
    payloads = [np.arange(3.0), np.arange(3, dtype=np.int32), {"k": 1}, np.arange(3.0)]
    if dev.rank == 0:
        for x in payloads:
            dev.send(x, 1, tag=5)
    elif dev.rank == 1:
        for _ in payloads:
            dev.recv(0, tag=5)
    return dev.clock


def unpicklable_after_a_loop(dev):
    """Device 0: a loop of sends and receives, then a send that cannot be pickled (op #7)."""
    import threading

    if dev.rank == 0:
        for _ in range(3):
            dev.send(np.zeros(2), 1)
            dev.recv(1)
        dev.send(threading.Lock(), 1)
    elif dev.rank == 1:
        for _ in range(3):
            dev.recv(0)
            dev.send(np.ones(2), 0)


def unsent_recv(dev):
    if dev.rank == 0:
        dev.send(np.zeros(1, np.uint8), 1)  # received: op #1
    elif dev.rank == 1:
        dev.recv(0)
        dev.recv(0, tag=4, timeout=0.3)  # never sent: times out after its own budget, not the cluster's


def test_records_through_a_cluster_name_each_op():
    with VirtualCluster(2, trace=False, check_collectives=False) as c:
        c.run(mixed_sends)
        sent = [r.text for r in c.flight_records(0) if r.text.startswith("send")]
        got = [r.text for r in c.flight_records(1) if r.text.startswith("recv")]
        assert sent == ["send to 1 tag=5 array(shape=(3,), float64)",
                        "send to 1 tag=5 array(shape=(3,), int32)",
                        "send to 1 tag=5 dict", "send to 1 tag=5 array(shape=(3,), float64)"]
        assert got == ["recv from 0 tag=5"] * 4
        assert all(r.state == "done" for r in c.flight_records(0) + c.flight_records(1))


def test_a_send_recorded_after_posting_keeps_program_order_and_records_a_failure():
    with VirtualCluster(2, trace=False, check_collectives=False) as c:
        with pytest.raises(PayloadError, match="op #7"):
            c.run(unpicklable_after_a_loop)
        recs = [r for r in c.flight_records(0) if r.text.startswith(("send", "recv"))]
        assert [r.seq for r in recs] == list(range(1, 8))
        assert [r.text for r in recs] == ["send to 1 tag=0 array(shape=(2,), float64)",
                                          "recv from 1 tag=0"] * 3 + \
            ["send to 1 tag=0 lock"]
        assert [r.state for r in recs] == ["done"] * 6 + ["failed"]
        assert all(a.wall_end <= b.wall_start for a, b in zip(recs, recs[1:-1]))


def test_a_recv_timeout_names_its_budget_peer_tag_and_op():
    with VirtualCluster(2, timeout=5.0, trace=False, check_collectives=False, detect_deadlocks=False) as c:
        with raises_within(P2PTimeout, bound=4.0) as info:
            c.run(unsent_recv)
        err = info.value
        assert "device 1 (world=1): recv from device 0 (tag 4) did not complete within 0.3 s (op #2)" in str(
            err
        )
        assert "device 0 (world=0) last ops:" in str(
            err
        ) and "send to 1 tag=0 array(shape=(1,), uint8) [done" in str(err)
        assert (err.rank, err.peer, err.tag, err.op_seq) == (1, 0, 4, 2)
        mine = err.flight_records[1][-1]
        assert mine.state == "started" and mine.text == "recv from 0 tag=4"


def test_event_log_keeps_wall_times_since_t0_and_counts_what_the_cap_drops():
    log = EventLog(rank=1, cap=2, t0=100.0)
    before = time.monotonic()
    log.collective("barrier", before, 1.0, 2.0, 7, 0, ((0, 1), None, None, "shm"), 1)
    log.message("send", before, 2.0, 3.0, 8, 8, 0, None)
    log.message("recv", before, 3.0, 4.0, 9, 8, 0, None)  # past the cap
    log.compute("mm", before, 4.0, 5.0, 10, 8.0, 16.0)  # likewise
    log.keep("compute", "mm", before, 4.0, 5.0, 10, {})  # likewise
    assert len(log) == 2 and log.dropped == 3
    first, second = list(log)
    assert (first.kind, first.name, first.seq, first.model_start,
            first.model_end) == ("collective", "barrier", 7, 1.0, 2.0)
    assert (
        first.wall_start == pytest.approx(before - 100.0)
        and before - 100.0 <= first.wall_end <= time.monotonic() - 100.0
    )
    assert (second.kind, second.nbytes, second.peer) == ("send", 8, 0)
    assert EventLog(rank=0).cap is None  # no cap unless given
