"""Point-to-point messages between real device processes: send/recv, isend/irecv, out=, tags, FIFO.

Arrays of every dtype and layout must arrive with their exact shape, dtype and bytes (raw, not
pickled: the byte counters see exactly ``x.nbytes``); messages larger than a channel's ring stream
through it in chunks; two devices that both send 32 MiB before receiving must not deadlock.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import numpy as np
import pytest

from virtualpar import VirtualCluster
from virtualpar.errors import DeviceError, P2PTimeout, PayloadError, UnmatchedMessages, UsageError

TIMEOUT = 20.0  # a deadlock fails within this many seconds instead of hanging the suite
MiB = 1 << 20


@pytest.fixture(scope="module")
def pair():
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def eight():
    with VirtualCluster(8, timeout=TIMEOUT) as c:
        yield c


def digest(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).view(np.uint8).reshape(-1).tobytes()).hexdigest()


def big(nbytes: int, seed: int) -> np.ndarray:
    """A float64 array of ``nbytes`` whose every element differs (so a misplaced chunk shows)."""
    return np.arange(nbytes // 8, dtype=np.float64) * (seed + 1) + seed


# -- arrays of many dtypes, shapes and layouts ----------------------------------------------------
DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16",
          "float32", "float64", "complex64", "complex128", ">i4", ">f8", "<U5", "S3", "datetime64[ns]",
          "timedelta64[s]"]
SHAPES = [(), (0,), (0, 3), (1,), (7,), (3, 4, 5), (1, 1, 1, 1, 1, 2)]
LAYOUTS = ["c", "fortran", "strided", "transposed"]


def make_array(dtype: str, shape: tuple[int, ...], layout: str) -> np.ndarray:
    """Deterministic values in ``dtype``, laid out C-contiguous or as a non-contiguous view."""
    def base(s: tuple[int, ...]) -> np.ndarray:
        return (np.arange(int(np.prod(s, dtype=np.int64))) % 97 + 1).astype(dtype).reshape(s)
    if layout == "c":
        return base(shape)
    if layout == "fortran":
        return np.asfortranarray(base(shape))
    if layout == "strided":
        return base(shape[:-1] + (2 * shape[-1],))[..., ::2]
    return base(shape[::-1]).T  # transposed


def p2p_cases() -> list[tuple[str, tuple[int, ...], str]]:
    cases = []
    for dtype in DTYPES:
        for shape in SHAPES:
            for layout in LAYOUTS if len(shape) >= 2 else ["c", "strided"] if shape else ["c"]:
                cases.append((dtype, shape, layout))
    return cases


def send_all(dev, cases) -> list[Any]:
    if dev.rank == 0:
        for i, case in enumerate(cases):
            dev.send(make_array(*case), 1, tag=i % 3)
        return []
    # dtype and bytes are described here: pickling the result back to the driver may change byte order
    return [describe(dev.recv(0, tag=i % 3)) for i in range(len(cases))]


def describe(y: Any) -> Any:
    if not isinstance(y, np.ndarray):
        return type(y).__name__
    return y.dtype.str, y.shape, bool(y.flags.c_contiguous), y, digest(y)


def test_arrays_of_every_dtype_shape_and_layout(pair):
    cases = p2p_cases()
    pair.reset_stats()
    got = pair.run(send_all, cases)[1]
    stats = pair.stats()
    problems = []
    for case, desc in zip(cases, got):
        x = make_array(*case)
        if isinstance(desc, str):
            problems.append(f"{case}: received a {desc}, not an array")
            continue
        dtype, shape, contiguous, y, dig = desc
        if dtype != x.dtype.str or shape != x.shape:
            problems.append(f"{case}: sent {x.shape} {x.dtype.str}, received {shape} {dtype}")
        elif not contiguous:
            problems.append(f"{case}: received a non-contiguous array")
        elif dig != digest(x) or not np.array_equal(y, x):
            problems.append(f"{case}: values differ")
    assert not problems, f"{len(problems)} of {len(cases)} messages wrong:\n  " + "\n  ".join(problems[:30])
    # arrays travel raw: exactly their nbytes are counted, one message each, nothing in the other direction
    assert stats.bytes[0, 1] == sum(make_array(*c).nbytes for c in cases)
    assert stats.messages[0, 1] == len(cases) and stats.bytes[1, 0] == 0


def large_with_out(dev, nbytes: int) -> Any:
    if dev.rank == 0:
        dev.send(big(nbytes, 3), 1, tag=7)
        dev.send(big(nbytes, 4), 1, tag=8)
        return None
    out = np.full(nbytes // 8, -1.0)
    into = dev.recv(0, tag=7, out=out)
    fresh = dev.recv(0, tag=8)
    return into is out, digest(out), fresh.dtype.str, fresh.shape, digest(fresh)


def test_large_message_streams_through_the_ring_and_into_out(pair):
    nbytes = 16 * MiB  # four times the 4 MiB ring of a 2-device cluster
    assert nbytes > pair.layout.ring_bytes
    pair.reset_stats()
    is_out, d_out, dtype, shape, d_fresh = pair.run(large_with_out, nbytes)[1]
    assert is_out, "recv(out=...) must return the very array it was given"
    assert d_out == digest(big(nbytes, 3))
    assert (dtype, shape, d_fresh) == ("<f8", (nbytes // 8,), digest(big(nbytes, 4)))
    assert pair.stats().bytes[0, 1] == 2 * nbytes


def small_out(dev) -> Any:
    if dev.rank == 0:
        for k in range(3):
            dev.send(np.arange(6, dtype=np.int32).reshape(2, 3) * k, 1)
        return None
    out = np.zeros((2, 3), np.int32)
    results = []
    for _ in range(3):
        y = dev.recv(0, out=out)
        results.append((y is out, y.copy()))
    return results


def test_recv_into_out_reuses_the_buffer(pair):
    got = pair.run(small_out)[1]
    for k, (same, y) in enumerate(got):
        assert same
        np.testing.assert_array_equal(y, np.arange(6, dtype=np.int32).reshape(2, 3) * k)


def wrong_out(dev) -> Any:
    if dev.rank == 0:
        dev.send(np.zeros(5, np.float64), 1)
        return None
    return dev.recv(0, out=np.zeros(4, np.float64))


def test_recv_into_out_of_the_wrong_shape_raises_usage_error(pair):
    with pytest.raises(UsageError, match="shape"):
        pair.run(wrong_out)
    assert pair.run(small_out)[1][2][0]  # the cluster is usable afterwards


# -- ordering and tags -----------------------------------------------------------------------------
def interleaved(dev, nbytes: int) -> Any:
    sequence = [(1, "a0"), (2, "b0"), (1, "a1"), (2, "b1"), (1, "a2"), (2, "b2")]
    if dev.rank == 0:
        for tag, label in sequence:
            dev.send({"label": label,
                      "data": np.full(nbytes // 8, float(ord(label[0]) * 10 + int(label[1])))}, 1, tag=tag)
        return None
    got = [dev.recv(0, tag=2) for _ in range(3)] + [dev.recv(0, tag=1) for _ in range(3)]
    return [(m["label"], float(m["data"][0]), float(m["data"][-1]), m["data"].size) for m in got]


@pytest.mark.parametrize("nbytes", [64, MiB], ids=["small", "1MiB-each-6MiB-total"])
def test_fifo_per_tag_with_interleaved_tags(pair, nbytes):
    """Messages tagged 1 and 2 are received in the opposite order of sending: FIFO holds per (src, tag)."""
    got = pair.run(interleaved, nbytes)[1]
    assert [g[0] for g in got] == ["b0", "b1", "b2", "a0", "a1", "a2"]
    for label, first, last, size in got:
        value = float(ord(label[0]) * 10 + int(label[1]))
        assert first == last == value and size == nbytes // 8


def nonblocking(dev) -> Any:
    x = np.arange(1000, dtype=np.int64)
    if dev.rank == 0:
        assert dev.recv(1, tag=6) == "go"  # device 1 has posted its irecv and tested it by now
        req = dev.isend(x, 1, tag=5)
        sent = req.wait()
        return sent, req.test()
    req = dev.irecv(0, tag=5)
    before = req.test()  # nothing can have been sent yet: device 0 waits for our "go"
    dev.send("go", 0, tag=6)
    polls = 0
    while not req.test():
        polls += 1
        time.sleep(0.0002)
    value = req.wait()
    again = req.wait()
    return before, req.test(), value, again is value


def test_isend_irecv_wait_and_test(pair):
    (sent, sent_done), (before, after, value, idempotent) = pair.run(nonblocking)
    assert sent is None and sent_done is True
    assert before is False, "test() reported a message that cannot have been sent yet"
    assert after is True and idempotent
    np.testing.assert_array_equal(value, np.arange(1000, dtype=np.int64))


def many_outstanding(dev, k: int) -> Any:
    peer = 1 - dev.rank
    recvs = [dev.irecv(peer, tag=t) for t in reversed(range(k))]  # posted in the reverse order
    sends = [dev.isend(np.full(1000, dev.rank * 100 + t), peer, tag=t) for t in range(k)]
    values = [int(r.wait()[0]) for r in recvs]
    for s in sends:
        s.wait()
    return values


def test_many_outstanding_requests_match_by_tag(pair):
    k = 6
    r0, r1 = pair.run(many_outstanding, k)
    assert r0 == [100 + t for t in reversed(range(k))]
    assert r1 == [t for t in reversed(range(k))]


def waiting_for_any(dev) -> Any:
    """Device 0 waits for whichever of three receives can complete; device 1 sends their messages
    one at a time, each after device 0's go (so which one can complete is certain)."""
    if dev.rank == 1:
        for tag in (7, 5, 77):
            # busy while device 0's wait times out (asleep in a receive, it would be a Deadlock)
            if tag == 77:
                time.sleep(0.6)
            dev.recv(0, tag=1)
            dev.send(tag, 0, tag=tag)
        return None
    stray = dev.irecv(1, tag=3)  # device 1 never sends tag 3
    with pytest.raises(UsageError, match="wait_any needs a non-empty list of this device's requests"):
        dev.wait_any([])
    with pytest.raises(UsageError, match="wait_any needs a non-empty list"):
        dev.wait_any([stray, "not a request"])
    first = dev.isend(np.ones(2), 0, tag=4)  # to itself: complete at once
    got = [dev.wait_any([stray, first])]
    dev.recv(0, tag=4)
    reqs = [dev.irecv(1, tag=t) for t in (5, 6, 7)]
    six = reqs[1]
    for _ in range(2):
        dev.send("go", 1, tag=1)
        k = dev.wait_any(reqs)
        got.append((k, reqs.pop(k).wait()))  # (a completed request stays ready: the caller drops it)
    late = dev.irecv(1, tag=77)
    with pytest.raises(P2PTimeout, match=r"wait for any of 2 requests: <Request recv from 1 tag=6 pending>, "
                                         r"<Request recv from 1 tag=77 pending> did "
                                         r"not complete within 0.2 s"):
        dev.wait_any([six, late], timeout=0.2)
    dev.send("go", 1, tag=1)
    got.append(dev.wait_any([six, late]))
    got.append(late.wait())
    for r in (stray, six):  # withdrawn, so that the run ends with nothing left posted
        from virtualpar.transport.leftovers import withdraw

        withdraw(dev._core.endpoint, r._inner)
    return got


def test_wait_any_sleeps_until_one_can_complete_and_names_its_requests_on_timeout(pair):
    assert pair.run(waiting_for_any)[0] == [1, (2, 7), (0, 5), 1, 77]


def probe_then_receive(dev) -> Any:
    """Devices 1 and 2 send device 0 a message each; once both are in, device 0 probes any source,
    then receives from any source: the receive must take the message the probe reported."""
    from virtualpar import ANY_SOURCE, ANY_TAG

    if dev.rank:
        # busy while device 0's probe times out (asleep, it would be a Deadlock)
        time.sleep(0.4 if dev.rank == 1 else 0.0)
        dev.send(dev.rank, 0, tag=dev.rank)
        return None
    with pytest.raises(UsageError, match="src=9 is out of range"):
        dev.iprobe(9)
    with pytest.raises(UsageError, match="tag must be an int"):
        dev.iprobe(1, tag=-5)
    with pytest.raises(P2PTimeout,
                       match=r"probe for a message from 1 \(tag 4\) to probe found none within 0.1 s"):
        dev.probe(1, 4, timeout=0.1)
    dev.probe(1, 1), dev.probe(2, 2)  # both in
    st = dev.iprobe(ANY_SOURCE, ANY_TAG)
    got = dev.recv(ANY_SOURCE, ANY_TAG)
    return st.source, st.tag, st.nbytes, got, dev.recv(3 - st.source, ANY_TAG)


@pytest.mark.parametrize("shuffle", [None, 1, 2, 3, 4, 5, 6])
def test_a_receive_takes_the_message_the_probe_before_it_reported(shuffle):
    """In shuffled mode an any-source receive picks among the ready sources by the seed: it must
    pick what the probe just before it reported (MPI promises that receive gets that message)."""
    with VirtualCluster(3, timeout=TIMEOUT, shuffle=shuffle) as c:
        src, tag, nbytes, got, other = c.run(probe_then_receive)[0]
    assert (src, tag, got, other) == (src, src, src, 3 - src) and nbytes > 0


def both_send_first(dev, nbytes: int) -> Any:
    peer = 1 - dev.rank
    dev.send(big(nbytes, dev.rank), peer)  # blocking, and larger than the ring: must not deadlock
    y = dev.recv(peer)
    return digest(y)


def test_both_devices_send_32mib_before_receiving(pair):
    nbytes = 32 * MiB
    got = pair.run(both_send_first, nbytes)
    assert got == [digest(big(nbytes, 1)), digest(big(nbytes, 0))]


# -- pickled objects -------------------------------------------------------------------------------
OBJECTS = [
    {"a": 1, "b": [1, 2, 3], "nested": {"x": (1, "s"), "y": None}},
    [1, "two", 3.0, None, (4, 5)],
    ("tuple", 1),
    None,
    "a string",
    12345678901234567890,
    list(range(200_000)),  # a pickle larger than one 256 KiB copy chunk
]


def send_objects(dev) -> Any:
    if dev.rank == 0:
        for obj in OBJECTS:
            dev.send(obj, 1, tag=3)
        dev.send({"array": np.arange(5.0), "list": [np.int8(3)]}, 1, tag=3)
        return None
    got = [dev.recv(0, tag=3) for _ in OBJECTS]
    mixed = dev.recv(0, tag=3)
    return got, mixed


def test_pickled_python_objects(pair):
    got, mixed = pair.run(send_objects)[1]
    assert got == OBJECTS
    assert [type(g) for g in got] == [type(o) for o in OBJECTS]
    np.testing.assert_array_equal(mixed["array"], np.arange(5.0))
    assert mixed["list"] == [3] and mixed["list"][0].dtype == np.int8


# -- eight devices ---------------------------------------------------------------------------------
def ring_exchange(dev, nbytes: int) -> Any:
    n, r = dev.size, dev.rank
    dev.send(big(nbytes, r), (r + 1) % n, tag=1)  # everyone sends first: buffered, so no deadlock
    dev.send(np.array([r], np.int64), (r - 1) % n, tag=2)  # and the other way round, with another tag
    from_left = dev.recv((r - 1) % n, tag=1)
    from_right = dev.recv((r + 1) % n, tag=2)
    return digest(from_left), from_right


@pytest.mark.parametrize("nbytes", [800, 3 * MiB], ids=["small", "3MiB-over-the-2MiB-ring"])
def test_ring_exchange_over_8_devices(eight, nbytes):
    assert nbytes < eight.layout.ring_bytes or nbytes > eight.layout.ring_bytes
    eight.reset_stats()
    got = eight.run(ring_exchange, nbytes)
    n = 8
    for r, (d, right) in enumerate(got):
        assert d == digest(big(nbytes, (r - 1) % n)), f"device {r} got the wrong array from its left"
        assert isinstance(right, np.ndarray) and right.shape == (1,) and int(right[0]) == (r + 1) % n, right
    stats = eight.stats()
    want = np.zeros((n, n), np.int64)
    for r in range(n):
        want[r, (r + 1) % n] += nbytes
        want[r, (r - 1) % n] += 8
    np.testing.assert_array_equal(stats.bytes, want)


def bad_peer(dev, dst: Any) -> None:
    dev.send(np.zeros(1), dst)


@pytest.mark.parametrize("dst", [8, -1, 1.5], ids=["too-large", "negative", "float"])
def test_bad_destination_is_a_usage_error(eight, dst):
    with pytest.raises(UsageError, match="dst"):
        eight.run(bad_peer, dst)


def zero_d(dev) -> Any:
    if dev.rank == 0:
        dev.send(np.array(2.5), 1)
        dev.send(np.array(7, np.int64), 1)
        return None
    plain = dev.recv(0)
    out = np.zeros((), np.int64)
    into = dev.recv(0, out=out)
    return plain.shape, float(plain.reshape(-1)[0]), into is out, int(out)


def test_zero_d_array_keeps_its_shape(pair):
    assert pair.run(zero_d)[1] == ((), 2.5, True, 7)


def _self_and_ring(dev):
    x = np.full(4, float(dev.rank))
    dev.send(x, dev.rank, tag=1)
    x[:] = -1  # the queued message is a copy
    mine = dev.recv(dev.rank, tag=1)
    right, left = (dev.rank + 1) % dev.size, (dev.rank - 1) % dev.size
    passed = dev.sendrecv(np.array([dev.rank]), right, left, sendtag=2)
    return mine, int(passed[0])


def test_messages_to_oneself_and_sendrecv():
    with VirtualCluster(3) as cluster:
        out = cluster.run(_self_and_ring)
    for r, (mine, passed) in enumerate(out):
        np.testing.assert_array_equal(mine, np.full(4, float(r)))
        assert passed == (r - 1) % 3


def _self_fails_after_queueing(dev):
    dev.send(np.array([111.0]), dev.rank)
    raise RuntimeError("after queueing a message to itself")


def _self_round_trip(dev):
    dev.send(np.array([222.0]), dev.rank)
    return float(dev.recv(dev.rank)[0])


def _leave_to_self(dev):
    dev.send(np.array([333.0]), dev.rank, tag=4)


def _post_and_leave(dev, any_source: bool):
    if dev.rank == 1:
        dev.irecv(-1, tag=-1) if any_source else dev.irecv(0, tag=5)


def _send_to_one(dev, v: float):
    if dev.rank == 0:
        dev.send(np.array([v]), 1, tag=5)
        return None
    return float(dev.recv(0, tag=5)[0])


def test_nothing_left_unmatched_by_a_run_reaches_the_next():
    """A message queued to oneself by a failed run, or left queued by a finished one, and a receive
    posted and never waited on, each would hand the next run a stale value (or steal its message)."""
    with VirtualCluster(2) as cluster:
        with pytest.raises(DeviceError, match="after queueing"):
            cluster.run(_self_fails_after_queueing)
        assert cluster.run(_self_round_trip) == [222.0, 222.0]  # not the failed run's 111
        with pytest.raises(UnmatchedMessages,
                           match=r"^2 messages were sent and never received by the end of the "
                                                    r"run:\n  device 0 -> device 0, tag 4: array\(1,\) "
                                                    r"float64 sent to itself"):
            cluster.run(_leave_to_self)
        assert cluster.run(_self_round_trip) == [222.0, 222.0]
        for any_source, who in ((False, "device 0, tag 5"), (True, "any device, any tag")):
            with pytest.raises(UnmatchedMessages,
                               match=rf"^1 receive was posted and never completed by the end of "
                                                        rf"the run:\n  device 1 <- {who}: a receive "
                                                        r"posted and never matched"):
                cluster.run(_post_and_leave, any_source)
            assert cluster.run(_send_to_one, 1.0) == [None, 1.0]  # the message reaches this run's receive
            assert cluster.run(_send_to_one, 2.0) == [None, 2.0]


def _self_into_wrong_buffer(dev, shape, dtype):
    dev.send(np.array([1.5]), dev.rank)
    return dev.recv(dev.rank, out=np.zeros(shape, dtype))


def test_a_receive_from_oneself_into_a_buffer_follows_the_peer_rule():
    """No broadcasting of a (1,) message over a (3,) buffer, no casting float64 to float32."""
    with VirtualCluster(2) as cluster:
        for shape, dtype in (((3,), np.float64), ((1,), np.float32)):
            with pytest.raises(UsageError,
                               match=rf"recv buffer has shape \({shape[0]},\) and dtype {np.dtype(dtype)}, "
                                                 r"but the message holds shape \(1,\) and dtype float64 "
                                                 r"\(last op #\d: recv from \d tag=0\)"):
                cluster.run(_self_into_wrong_buffer, shape, dtype)
        assert [float(v[0]) for v in cluster.run(_self_into_wrong_buffer, (1,), np.float64)] == [1.5, 1.5]


def _any_source(dev):
    from virtualpar import ANY_SOURCE, ANY_TAG, Status

    if dev.rank == 0:
        got = []
        for _ in range(3 * (dev.size - 1)):
            st = Status()
            value = dev.recv(ANY_SOURCE, ANY_TAG, status=st)
            got.append((st.source, st.tag, int(value[0])))
        dev.barrier()  # collective messages are never taken by a wildcard receive
        req = dev.irecv(ANY_SOURCE, 7)
        value = req.wait()
        return got, (req.status.source, req.status.tag, int(value[0]))
    for i in range(3):
        dev.send(np.array([dev.rank * 10 + i]), 0, tag=i)
    dev.barrier()
    if dev.rank == dev.size - 1:  # after the barrier, so no ANY_TAG receive above can take it
        dev.send(np.array([99]), 0, tag=7)
    return None


def test_receives_from_any_source_and_tag_report_who_sent_what():
    with VirtualCluster(4) as cluster:
        (got, last), *_ = cluster.run(_any_source)
    assert sorted(got) == sorted((r, i, r * 10 + i) for r in (1, 2, 3) for i in range(3))
    for r in (1, 2, 3):  # FIFO per source: each sender's messages in the order it sent them
        assert [t for s, t, _ in got if s == r] == [0, 1, 2]
    assert last == (3, 7, 99)


def _posted_before(dev):
    from virtualpar import ANY_SOURCE

    if dev.rank == 0:
        wild = dev.irecv(ANY_SOURCE, 5)   # posted first: the first matching message is its
        specific = dev.irecv(1, 5)
        dev.barrier()
        return int(wild.wait()[0]), int(specific.wait()[0])
    dev.barrier()
    if dev.rank == 1:
        dev.send(np.array([1]), 0, tag=5)
        dev.send(np.array([2]), 0, tag=5)
    return None


def test_the_earliest_posted_receive_takes_a_message():
    with VirtualCluster(2) as cluster:
        assert cluster.run(_posted_before)[0] == (1, 2)


def _subclasses(dev):
    masked = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    dev.send(masked, 1 - dev.rank)
    from_peer = dev.recv(1 - dev.rank)
    dev.send(masked, dev.rank)
    from_self = dev.recv(dev.rank)
    return [(type(v).__name__, v.mask.tolist(), v.data.tolist()) for v in (from_peer, from_self)]


def _reduce_masked(dev):
    return dev.all_reduce(np.ma.masked_array([1.0, 2.0], mask=[False, True]))


def test_an_ndarray_subclass_keeps_its_own_state_or_is_refused():
    """A masked array sent as raw bytes arrived as a plain array without its mask."""
    with VirtualCluster(2) as cluster:
        assert cluster.run(_subclasses) == [[("MaskedArray", [False, True], [1.0, 2.0])] * 2] * 2
        with pytest.raises(PayloadError,
                           match=r"all_reduce on group world=\(0,1\): needs a plain numpy array, got "
                                               r"MaskedArray, an ndarray subclass whose own state"):
            cluster.run(_reduce_masked)


def _numpy_ranks(dev):
    peer, me = np.int64(1 - dev.rank), np.int32(dev.rank)  # as np.arange / np.roll give them
    req = dev.irecv(peer, tag=np.int64(2))
    dev.isend(np.array([dev.rank]), peer, tag=np.int64(2)).wait()
    dev.send(np.array([10 + dev.rank]), me, tag=np.int64(1))
    mine = int(dev.recv(me, tag=np.int64(1))[0])
    if dev.rank == 0:
        dev.send(np.array([5.0]), peer, tag=np.uint8(3))
    else:
        assert dev.recv(peer, tag=np.int16(3))[0] == 5.0
    return int(req.wait()[0]), mine, int(dev.sendrecv(np.array([dev.rank]), peer, peer)[0])


def test_numpy_integers_are_ranks_and_tags(pair):
    """They passed the argument check, then failed as "route destination must be a device 0..1 ...;
    got np.int64(1)", or (from oneself) as "a receive from this device itself needs a tag"."""
    assert pair.run(_numpy_ranks) == [(1, 10, 1), (0, 11, 0)]


def _wait_shorter(dev):
    if dev.rank == 1:
        time.sleep(1.0)
        return None
    dev.irecv(1).wait(timeout=0.3)


def test_a_wait_names_its_own_timeout():
    """wait(timeout=0.3) gave up after 0.3 s but said "did not complete within 20 s" (the cluster's)."""
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        t0 = time.monotonic()
        with pytest.raises(P2PTimeout, match=r"recv from device 1 \(tag 0\) did not complete within 0.3 s"):
            c.run(_wait_shorter)
        assert time.monotonic() - t0 < TIMEOUT / 2


def _self_in_posting_order(dev):
    from virtualpar import ANY_SOURCE, ANY_TAG, Status

    r1, r2 = dev.irecv(dev.rank, tag=1), dev.irecv(dev.rank, tag=1)
    dev.send(np.array([1]), dev.rank, tag=1)
    dev.send(np.array([2]), dev.rank, tag=1)
    second, first = int(r2.wait()[0]), int(r1.wait()[0])  # waited in the other order
    dev.send(np.arange(3), dev.rank, tag=4)
    st = Status()
    anyone = dev.recv(ANY_SOURCE, 4, status=st).tolist()  # ANY_SOURCE includes this device
    dev.send("hello", dev.rank, tag=9)
    st2 = Status()
    anytag = dev.recv(dev.rank, ANY_TAG, status=st2)
    return first, second, anyone, (st.source, st.tag, st.nbytes), anytag, (st2.source, st2.tag)


def test_messages_to_oneself_match_as_messages_from_a_peer():
    """Receives from oneself took their message when waited on, not when posted (two irecvs waited
    in reverse order got (2, 1)); ANY_SOURCE never took a message a device sent itself (a Deadlock
    while it sat queued); ANY_TAG from oneself was refused; and Status stayed empty."""
    with VirtualCluster(2) as cluster:
        for r, got in enumerate(cluster.run(_self_in_posting_order)):
            assert got == (1, 2, [0, 1, 2], (r, 4, 24), "hello", (r, 9))
        with pytest.raises(UsageError, match=r"recv from itself \(tag 5\) at op #\d+ has no message"):
            cluster.run(lambda dev: dev.recv(dev.rank, 5))  # only this device could send it: no hang
        with pytest.raises(UsageError, match=r"recv from itself \(tag 6\) at op #\d+ has no message"):
            cluster.run(lambda dev: dev.irecv(dev.rank, 6).wait())
        assert cluster.run(lambda dev: dev.rank) == [0, 1]  # the withdrawn receives took nothing with them


def _isend_and_return(dev, n):
    if dev.rank == 0:
        dev.isend(np.ones(n), 1)  # never waited on
        return None
    return float(dev.recv(0)[0])


def test_an_isend_never_waited_on_says_so():
    """A large one cannot finish once its sender returned; the report said only 'bytes still being sent'."""
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        assert c.run(_isend_and_return, 10) == [None, 1.0]  # a small one is in the ring once posted
        with pytest.raises(UnmatchedMessages,
                           match=r"device 0 -> device 1, tag 0: 8388608 bytes still being sent: "
                                                    "an isend not waited on"):
            c.run(_isend_and_return, 1 << 20)
        assert c.run(_isend_and_return, 10) == [None, 1.0]


def _poll_and_status(dev):
    from virtualpar import Status

    req = dev.irecv(1 - dev.rank, tag=9)
    polled = "completed"
    try:
        req.wait(timeout=0)  # a poll: nothing was sent yet (the peer sends only after the barrier)
    except P2PTimeout:
        polled = "timed out"
    dev.barrier()
    dev.send({"k": list(range(5))}, dev.rank, tag=4)
    st = Status()
    dev.recv(dev.rank, tag=4, status=st)
    dev.send(np.zeros(1), 1 - dev.rank, tag=9)
    req.wait()
    return polled, st.nbytes > 0


def test_wait_with_timeout_zero_polls_and_a_pickled_self_message_has_its_size():
    """wait(timeout=0) became a UsageError (a poll had raised P2PTimeout); a pickled object sent to
    oneself reported nbytes 0 where a peer's reports its pickle's size."""
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        assert c.run(_poll_and_status) == [("timed out", True), ("timed out", True)]


def _late_send_and_two_tries(dev):
    if dev.rank == 0:
        time.sleep(0.5)
        dev.send(np.arange(3.0), 1)
        return None
    try:
        dev.recv(0, timeout=0.1)
    except P2PTimeout as exc:
        said = str(exc)
    return said, dev.recv(0, timeout=TIMEOUT).tolist()


def _give_up_before_it_comes(dev):
    if dev.rank == 0:
        time.sleep(0.5)
        dev.send(np.ones(2), 1)
        return
    try:
        dev.recv(0, timeout=0.1)
    except P2PTimeout:
        pass


def test_a_receive_that_timed_out_is_withdrawn():
    """The dead receive stayed posted and took the late message: the retry then waited forever."""
    with VirtualCluster(2, timeout=TIMEOUT) as c:
        _, (said, got) = c.run(_late_send_and_two_tries)
        assert got == [0.0, 1.0, 2.0] and "The receive is withdrawn" in said
        with pytest.raises(UnmatchedMessages, match="1 message"):  # given up on and never received: reported
            c.run(_give_up_before_it_comes)


def test_one_device_receiving_from_any_source_raises_at_once():
    """Only the device itself could send: it waited out the whole timeout (60 s by default)."""
    from virtualpar import ANY_SOURCE

    with VirtualCluster(1, timeout=TIMEOUT) as c:
        start = time.monotonic()
        with pytest.raises(UsageError, match="would wait forever"):
            c.run(lambda dev: dev.recv(ANY_SOURCE))
        assert time.monotonic() - start < TIMEOUT / 2


def _strict_send_to_self(dev, n):
    dev.send(np.ones(n), dev.rank)
    return dev.recv(dev.rank).size


def test_strict_mode_refuses_a_blocking_send_to_itself_above_the_limit():
    """MPI blocks there forever; the loopback buffered it, so strict mode missed the very case it is for."""
    with VirtualCluster(2, eager_limit=64, timeout=TIMEOUT) as c:
        assert c.run(_strict_send_to_self, 8) == [8, 8]  # 64 bytes: eager
        with pytest.raises(UsageError, match=r"send to itself \(tag 0\) of 72 bytes .* above eager_limit=64"):
            c.run(_strict_send_to_self, 9)
        assert c.run(lambda dev: (dev.isend(np.ones(9), dev.rank), dev.recv(dev.rank).size)[1]) == [9, 9]


def test_an_isend_whose_header_arrived_is_one_unmatched_message():
    def offer(dev):
        if dev.rank == 0:
            dev.isend(np.ones(1 << 21), 1, tag=9)  # larger than the ring: offered, never taken

    with VirtualCluster(2, timeout=TIMEOUT) as c:
        with pytest.raises(UnmatchedMessages) as info:
            c.run(offer)
    assert len(info.value.messages) == 1
    assert "1 message was sent" in str(info.value) and "float64 from an isend not waited on" in str(
        info.value
    )


def _blocking_send_then_barrier(dev):
    if dev.rank == 0:
        dev.send(np.ones(1 << 17), 1, tag=4)  # 1 MiB past a 256 KiB ring: offered, and taken by the receiver
    dev.barrier()


def test_a_completed_blocking_send_is_not_called_an_isend():
    """It was described as '(offered, never taken) from an isend not waited on'."""
    with VirtualCluster(2, timeout=TIMEOUT, ring_bytes=256 << 10) as c:
        with pytest.raises(UnmatchedMessages) as info:
            c.run(_blocking_send_then_barrier)
    assert str(info.value).endswith("device 0 -> device 1, tag 4: array(131072,) float64")


def _give_up_mid_message(dev):
    if dev.rank == 1:
        # 5 x 48 KiB fill the ring
        reqs = [dev.isend(np.full(12 << 10, i, np.float32), 0, tag=5) for i in range(5)]
        reqs.append(dev.isend(np.full(12 << 10, 42, np.float32), 0, tag=3))  # then this one, half in
        time.sleep(1.0)
        for r in reqs:
            r.wait()
        return None
    time.sleep(0.3)
    try:
        dev.recv(1, tag=3, timeout=0.3)
    except P2PTimeout:
        pass
    got = dev.recv(1, tag=3, timeout=TIMEOUT)  # the message the timed-out receive had begun to take
    for _ in range(5):
        dev.recv(1, tag=5)
    return float(got[0]), got.size


def test_a_receive_that_timed_out_mid_message_hands_it_to_the_next():
    """It had matched a message still arriving: that message went to the dead receive, lost."""
    with VirtualCluster(2, timeout=TIMEOUT, ring_bytes=256 << 10) as c:
        assert c.run(_give_up_mid_message)[0] == (42.0, 12 << 10)


def test_identical_unreceived_messages_are_counted_each():
    def two_alike(dev):
        if dev.rank == 0:
            dev.send(np.ones(3), 1, tag=5)
            dev.send(np.ones(3), 1, tag=5)

    with VirtualCluster(2, timeout=TIMEOUT) as c:
        with pytest.raises(UnmatchedMessages, match=r"^2 messages were sent") as info:
            c.run(two_alike)
    assert len(info.value.messages) == 2 and info.value.returned == {0: None, 1: None}


def test_irecv_from_any_source_on_one_device_raises_at_wait():
    from virtualpar import ANY_SOURCE

    with VirtualCluster(1, timeout=TIMEOUT) as c:
        with pytest.raises(UsageError, match="would wait forever"):
            c.run(lambda dev: dev.irecv(ANY_SOURCE).wait())
