"""Transport paths that the runtime tests do not force: ring wrap-around with tiny rings, the
rendezvous fallback when the kernel refuses cross-memory reads, the receive-buffer pool, the
small-message fast paths against the general path, and no lost wake-ups (with the safety-net wake slice raised
to 60 s, a lost post would hang a wait)."""

from __future__ import annotations

import gc
import multiprocessing as mp

import numpy as np
import pytest

import virtualpar.transport.endpoint as ep
import virtualpar.transport.rendezvous as rendezvous
import virtualpar.transport.waiting as waiting
from virtualpar import VirtualCluster
from virtualpar.errors import Deadlock
from virtualpar.transport.endpoint import Endpoint
from virtualpar.transport.requests import SentRequest
from virtualpar.transport.shm import Layout, SharedArena

SIZES = [0, 1, 7, 8, 100, 4096, 5000, 70000, 300000, 1 << 20]


def _payload(size: int, kind: int, i: int):
    if kind == 2:
        return {"i": i, "b": bytes(range(256)) * (size // 256)}
    x = (np.arange(size, dtype=np.int64) * 7 + i).astype(np.uint8)
    return x.reshape(-1, 1)[::2] if kind == 1 and size else x  # kind 1: non-contiguous


def _plan(seed: int, n: int):
    rng = np.random.default_rng(seed)
    return [(*map(int, rng.choice(n, 2, replace=False)), int(rng.integers(3)), int(rng.choice(SIZES)),
             int(rng.integers(3)), i)
            for i in range(150)]


def exchange(dev, seed: int):
    """Everyone isends its share of a random plan first, then receives; returns the number of bad messages."""
    plan = _plan(seed, dev.size)
    sends = [dev.isend(_payload(sz, k, i), d, tag) for s, d, tag, sz, k, i in plan if s == dev.rank]
    bad = 0
    for s, d, tag, sz, k, i in plan:
        if d == dev.rank:
            y, x = dev.recv(s, tag), _payload(sz, k, i)
            ok = y == x if k == 2 else isinstance(y,
                                                  np.ndarray) and y.shape == x.shape and np.array_equal(y, x)
            bad += not ok
    for req in sends:
        req.wait()
    return bad


@pytest.mark.parametrize("ring_bytes,cross_memory,n",
                         [(4096, True, 3), (4096, False, 2), (65536, False, 4), (8192, True, 8)])
def test_random_traffic_arrives_intact_in_order(monkeypatch, ring_bytes, cross_memory, n):
    monkeypatch.setattr(waiting, "_WAKE_SLICE", 60.0)  # a lost wake-up would now hang until the op timeout
    if not cross_memory:
        # EPERM: every offer falls back to the ring
        monkeypatch.setattr(rendezvous, "read_remote", lambda *args: 1)
    with VirtualCluster(n, ring_bytes=ring_bytes, timeout=20) as c:
        for seed in range(2):
            assert c.run(exchange, seed) == [0] * n


def exchange_by_tag(dev, seed: int):
    """``exchange``, but each device receives the highest tag's messages first (FIFO per source
    and tag still holds): in strict mode a send's offer then waits while later ones are taken."""
    plan = _plan(seed, dev.size)
    sends = [dev.isend(_payload(sz, k, i), d, tag) for s, d, tag, sz, k, i in plan if s == dev.rank]
    bad = 0
    for s, d, tag, sz, k, i in sorted(plan, key=lambda m: (-m[2], m[5])):
        if d == dev.rank:
            y, x = dev.recv(s, tag), _payload(sz, k, i)
            bad += not (
                y == x
                if k == 2
                else isinstance(y, np.ndarray) and y.shape == x.shape and np.array_equal(y, x)
            )
    for req in sends:
        req.wait()
    return bad


@pytest.mark.parametrize("ring_bytes,cross_memory,n", [(4096, True, 3), (65536, False, 4), (8192, True, 5)])
def test_random_traffic_in_strict_mode_received_tag_by_tag(monkeypatch, ring_bytes, cross_memory, n):
    monkeypatch.setattr(waiting, "_WAKE_SLICE", 60.0)
    if not cross_memory:
        monkeypatch.setattr(rendezvous, "read_remote", lambda *args: 1)
    with VirtualCluster(n, ring_bytes=ring_bytes, eager_limit=0, timeout=20) as c:
        for seed in range(2):
            assert c.run(exchange_by_tag, seed) == [0] * n


def _collectives(dev):
    x = np.arange(6.0) + dev.rank
    return (dev.all_reduce(x).tolist(), dev.all_gather(x[:2]).tolist(),
            dev.broadcast(x if dev.rank == 1 else None, root=1).tolist())


@pytest.mark.parametrize("ring_bytes,cross_memory,n", [(4096, False, 3), (8192, True, 5)])
def test_the_scan_of_heads_and_tails_delivers_everything(monkeypatch, ring_bytes, cross_memory, n):
    """Progress finds sources with unread bytes by comparing every inbound ring's head with its tail
    (building channels as they appear): with tiny rings (partial receives), without cross-memory
    reads (streamed offers), for collectives and the host endpoint too."""
    monkeypatch.setattr(waiting, "_WAKE_SLICE", 60.0)
    if not cross_memory:
        monkeypatch.setattr(rendezvous, "read_remote", lambda *args: 1)
    with VirtualCluster(n, ring_bytes=ring_bytes, timeout=20) as c:
        assert c.run(exchange, 7) == [0] * n
        x = [np.arange(6.0) + r for r in range(n)]
        want = (sum(x).tolist(), np.concatenate([v[:2] for v in x]).tolist(), x[1].tolist())
        assert c.run(_collectives) == [want] * n
        c.put(n - 1, "k", np.arange(3))  # the host endpoint scans too
        assert c.get(n - 1, "k").tolist() == [0, 1, 2]


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


def test_pooled_buffers_start_half_a_page_past_a_page_boundary(pair):
    """Results and receives land 2 KiB away (mod 4 KiB) from the page-aligned scratch and rings
    they are copied from, and from the page + 16 arrays numpy allocates (see ``pool.mid_page``)."""
    from virtualpar.transport.pool import BufferPool

    pool = BufferPool()
    for nbytes in (64 << 10, (512 << 10) + 8, 3 << 20):
        arr = pool.array((nbytes // 8,), np.dtype(np.float64))
        assert arr.ctypes.data % 4096 == 2048 and arr.nbytes == nbytes // 8 * 8
    assert _xfer(pair, np.ones(1 << 16)).ctypes.data % 4096 == 2048  # a 512 KiB receive
    small = pool.array((8,), np.dtype(np.float64))  # below min_bytes: a plain array
    assert small.base is None


def test_the_pool_reserve_serves_one_lease_of_any_size_up_to_its_own():
    """A request that no idle buffer fits takes a prefix of the warm reserve (the same pages, half a
    page past a boundary), one lease at a time; the reserve is free again when that lease's array
    dies; a larger request, or one while it is lent, gets a fresh buffer."""
    from virtualpar.transport.pool import BufferPool

    pool = BufferPool()
    pool.reserve(1 << 20)
    home = pool._reserve.ctypes.data
    assert pool.reserve_bytes == 1 << 20 and home % 4096 == 2048
    a = pool.array((100_000,), np.dtype(np.float64))  # 800,000 bytes: a prefix of the reserve
    b = pool.array((100_000,), np.dtype(np.float64))  # the reserve is lent: fresh
    big = pool.array((200_000,), np.dtype(np.float64))  # 1.6 MB > the reserve: fresh
    assert a.ctypes.data == home and b.ctypes.data != home and big.ctypes.data != home
    a[:], b[:] = 1.0, 2.0
    assert (a == 1.0).all() and (b == 2.0).all()  # no overlap
    view = a[5:10]
    del a
    gc.collect()
    c = pool.array((9_000,), np.dtype(np.float64))  # 72,000 bytes: a view of the lent one still lives
    assert c.ctypes.data != home and (view == 1.0).all()
    c_addr = c.ctypes.data
    del view, c
    gc.collect()
    d = pool.array((9_000,), np.dtype(np.float64))  # c's buffer, idle now, fits exactly
    # no idle buffer of 400,000 bytes: the reserve, free again
    e = pool.array((50_000,), np.dtype(np.float64))
    assert d.ctypes.data == c_addr and e.ctypes.data == home
    raw = pool.raw(4096 * 20)  # the raw interface, as receives of pickles use it
    assert raw.ctypes.data != home  # (lent to e)
    del e
    gc.collect()
    raw2 = pool.raw(4096 * 20 + 1)
    assert raw2.ctypes.data == home
    pool.give_back(raw2)
    raw3 = pool.raw(70_000)
    assert raw3.ctypes.data == home
    pool.give_back(raw3)
    # 400,000 bytes: no idle buffer that size, the reserve
    lease = pool.array((50_000,), np.dtype(np.float64))
    assert lease.ctypes.data == home
    del lease
    gc.collect()  # the reserve comes back as the reserve, not also as an idle 400,000-byte buffer:
    again = pool.array((50_000,), np.dtype(np.float64))
    other = pool.array((20_000,), np.dtype(np.float64))
    lo, hi = sorted([(again.ctypes.data, again.nbytes), (other.ctypes.data, other.nbytes)])
    assert again.ctypes.data == home and lo[0] + lo[1] <= hi[0]  # no two live arrays on one buffer
    pool.reserve(1000)  # below min_bytes: no reserve
    assert pool.reserve_bytes == 0


def test_a_reset_gives_back_a_partly_received_pickles_buffer(pair):
    """A reset dropped partial receives with their raw buffers: the reserve, lent to a pickle,
    stayed lent for the rest of the cluster's life."""
    import types

    from virtualpar.transport.channel import KIND_ARRAY, KIND_PICKLE

    a, b = pair
    b.pool.reserve(1 << 20)
    home = b.pool._reserve.ctypes.data
    pickled = types.SimpleNamespace(header=types.SimpleNamespace(kind=KIND_PICKLE),
                                    target=b.pool.raw(100_000), buf=b"")
    array = types.SimpleNamespace(header=types.SimpleNamespace(kind=KIND_ARRAY), target=np.empty(9), buf=b"")
    b._partial.update({0: pickled, 1: array})
    assert pickled.target.ctypes.data == home
    b.reset()
    assert b._partial == {} and pickled.buf is None and pickled.target is None
    assert array.buf == b""  # an array's buffer goes back through its own lease
    assert b.pool.raw(200_000).ctypes.data == home and b.pool.idle_bytes == 0
    assert _xfer(pair, np.arange(5.0)).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]  # and the pair still works


def _run_script(seed: int, fast: bool, monkeypatch) -> tuple[list, list, np.ndarray, np.ndarray, int]:
    """Drive two endpoints of a 4 KiB-ring pair through a random interleaving of sends, receives
    (some into ``out=``) and progress; returns (sent messages, received values, byte and message
    counters of endpoint 0, sends the fast path completed).  ``fast=False`` turns the small-message fast paths
    off."""
    monkeypatch.setattr(ep, "SMALL", ep.SMALL if fast else -1)
    layout = Layout(2, 4096)
    arena = SharedArena.create(layout.total_bytes)
    arena.unlink()
    bells = [mp.get_context("fork").Semaphore(0) for _ in range(layout.endpoints)]
    a, b = Endpoint(0, arena, layout, bells), Endpoint(1, arena, layout, bells)
    rng = np.random.default_rng(seed)
    sent: list[tuple[int, object]] = []
    sends, recvs = [], []
    posted = {t: 0 for t in range(3)}

    def message(i: int):
        size = int(rng.choice([0, 1, 8, 100, 1000, 1024, 1025, 3000, 5000, 70000],
                              p=[.1, .1, .1, .2, .2, .1, .05, .05, .05, .05]))
        k = int(rng.integers(3))
        if k == 0:
            return {"i": i, "pad": b"x" * size}
        x = (np.arange(size, dtype=np.int64) * 3 + i).astype(np.uint8 if k == 1 else np.int32)
        return x.reshape(2, -1) if size % 2 == 0 and size else x

    def post(tag: int) -> None:
        mine = [m for t,
                m in sent if t == tag][posted[tag]] if posted[tag] < sum(t == tag for t, _ in sent) else None
        out = np.empty_like(mine) if isinstance(mine, np.ndarray) and rng.integers(2) else None
        recvs.append((tag, posted[tag], out, b.irecv(0, tag, out)))
        posted[tag] += 1

    for i in range(200):
        op = int(rng.integers(5))
        if op <= 1:
            tag = int(rng.integers(3))
            sent.append((tag, message(i)))
            sends.append(a.isend(sent[-1][1], 1, tag))
        elif op == 2:
            tag = int(rng.integers(3))
            if posted[tag] < sum(t == tag for t, _ in sent):
                post(tag)
        elif op == 3:
            (a if rng.integers(2) else b).progress()
        else:
            b.progress()
            a.progress()
    for tag in range(3):
        while posted[tag] < sum(t == tag for t, _ in sent):
            post(tag)
    for _ in range(10000):
        if all(r.done for *_, r in recvs) and all(s.done for s in sends):
            break
        a.progress()
        b.progress()
    values = []
    for tag, nth, out, r in recvs:
        v = r.wait(0)
        assert out is None or v is out
        values.append((tag, nth, v))
    return (
        sent,
        values,
        a._bytes_row.copy(),
        a._msgs_row.copy(),
        sum(isinstance(s, SentRequest) for s in sends),
    )


def _same(x, y) -> bool:
    if isinstance(x, np.ndarray):
        return isinstance(y,
                          np.ndarray) and x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)
    return x == y


@pytest.mark.parametrize("seed", range(4))
def test_fast_path_keeps_fifo_matching_and_counters_of_the_general_path(monkeypatch, seed):
    """Fast-path frames interleaved with queued sends, streamed and rendezvous messages and
    unexpected messages: the n-th receive of a tag gets the n-th send of that tag (the FIFO
    reference), with the fast paths on and off alike, and the byte counters agree."""
    results = [_run_script(seed, fast, monkeypatch) for fast in (True, False)]
    assert results[0][4] > 5 and results[1][4] == 0  # both paths were taken, and only with fast=True
    for sent, values, nbytes, msgs, _ in results:
        by_tag = {t: [m for tag, m in sent if tag == t] for t in range(3)}
        assert len(values) == len(sent)
        for tag, nth, v in values:
            assert _same(by_tag[tag][nth], v), (tag, nth)
        expected = sum(m.nbytes if isinstance(m, np.ndarray) else 0 for _, m in sent)
        assert msgs[1] == len(sent) and nbytes[1] >= expected  # pickles count their pickled size
    assert results[0][2][1] == results[1][2][1] and results[0][3][1] == results[1][3][1]


def _reversed_receives(dev, count: int):
    """Device 0 isends ``count`` large messages to device 1, one tag each, arrays and pickles in
    turn; device 1 receives them last tag first.  Before any receive is posted, strict mode must
    leave the sends that went as offers unfinished."""
    def payload(i):
        return np.full(1000, float(i)) if i % 2 == 0 else {"i": i, "b": bytes(9000)}

    if dev.rank == 0:
        reqs = [dev.isend(payload(i), 1, tag=i) for i in range(count)]
        dev.barrier()
        early = sum(r.test() for r in reqs)
        dev.barrier()
        for r in reqs:
            r.wait()
        return early
    dev.barrier()
    dev.barrier()
    bad = 0
    for i in reversed(range(count)):
        got, want = dev.recv(0, tag=i), payload(i)
        bad += not (np.array_equal(got, want) if i % 2 == 0 else got == want)
    return bad


@pytest.mark.parametrize("count", [2, 10])
@pytest.mark.parametrize("read", ["cross memory", "refused", "refused at first"])
def test_strict_mode_completes_sends_in_the_order_their_receives_come(monkeypatch, count, read):
    """MPI's rendezvous sends complete as their receives are posted, in any order.  Offers used to
    wait in line on their channel, so a receive posted for a later tag found nothing and strict
    mode named a deadlock in a correct program.  With more sends than offer slots (7) the rest are
    streamed, and still done only once a receive took them (their receiver says so); a refused
    offer (the kernel will not let the receiver read) is streamed behind a header of its own, after
    later offers — whether the refusals are permanent or a transient one."""
    if read == "refused":
        monkeypatch.setattr(rendezvous, "read_remote", lambda *args: 1)  # EPERM: permanent
    elif read == "refused at first":  # a transient error on every other read
        calls = []
        real = rendezvous.read_remote

        def flaky(*args):
            calls.append(1)
            return 14 if len(calls) % 2 else real(*args)  # EFAULT, not permanent: the next offer is tried

        monkeypatch.setattr(rendezvous, "read_remote", flaky)
    with VirtualCluster(2, eager_limit=0, timeout=20) as c:
        early, bad = c.run(_reversed_receives, count)
        assert bad == 0
        assert early == 0  # none finished before its receive was posted, streamed or not
        # still strict after the refusals: a send still waits for its receive (one refusal used to
        # make every later send to that peer eager, for good)
        with pytest.raises(Deadlock, match="device 0 waits send to 1 .* device 1 waits send to 0"):
            c.run(_both_send_first)


def _both_send_first(dev):
    """Unsafe: both devices send before they receive, which only buffering lets through."""
    dev.send(np.ones(1000), 1 - dev.rank, tag=1)
    return dev.recv(1 - dev.rank, tag=1)


def _send_large_twice(dev):
    """Two 1 MiB messages from device 0 (offers: the 64 KiB ring cannot hold them); then whether
    device 0 would still offer the next one."""
    for i in range(2):
        if dev.rank == 0:
            dev.send(np.full(1 << 17, float(i)), 1)
        else:
            assert (dev.recv(0) == i).all()
    return dev._core.endpoint.rendezvous.offer_to[1] if dev.rank == 0 else None


@pytest.mark.parametrize("errno_, offers_later", [(14, True), (1, False)])
def test_only_a_refusal_for_good_stops_the_offers(monkeypatch, errno_, offers_later):
    """A transient error (EFAULT) streams that one message; EPERM, which the kernel will repeat,
    makes the sender stream its later large messages at once (no offer, no refusal, no round trip)."""
    calls = []
    real = rendezvous.read_remote

    def first_fails(*args):
        calls.append(1)
        return errno_ if len(calls) == 1 else real(*args)

    monkeypatch.setattr(rendezvous, "read_remote", first_fails)
    with VirtualCluster(2, ring_bytes=1 << 16, timeout=20) as c:
        assert c.run(_send_large_twice)[0] is offers_later


def test_a_message_both_ends_hold_is_listed_once_and_a_queued_send_as_it_is():
    """The sender lists a send whose header left ("still being sent") and one still queued ("not
    yet sent"); the receiver lists the message it holds.  The pair is one entry, the receiver's,
    marked once — the queued send's entry came first and took the mark (it read "... an isend not
    waited on ... from an isend not waited on")."""
    from virtualpar.transport.leftovers import IN_FLIGHT, merge_ends

    note = ": an isend not waited on (its bytes move only while the sender waits or sends)"
    found = [(0, 1, 5, f"24 bytes {IN_FLIGHT}{note}"), (0, 1, 5, f"24 bytes not yet sent{note}"),
             (1, 0, 2, "array(1,) float64"), (0, 1, 5, "array(3,) float64")]
    assert merge_ends(found) == [(0, 1, 5, f"24 bytes not yet sent{note}"), (1, 0, 2, "array(1,) float64"),
                                 (0, 1, 5, "array(3,) float64 from an isend not waited on")]
