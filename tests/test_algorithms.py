"""Collective algorithms vs the numpy oracle, on threads: values, bit-identity, bytes moved.

One test body per collective, run over world sizes 1, 2, 3, 4, 8 (3 and the non-powers of two
exercise the fold-in and uneven-chunk paths), dtypes, every registered algorithm and reduce op.
Byte counts are the closed forms of each algorithm, asserted exactly from ThreadComm counters.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from virtualpar.collectives import (
    ALGORITHMS,
    DEFAULT_ALGORITHMS,
    Comm,
    REDUCE_OPS,
    ThreadWorld,
    check_op,
    direct,
    get_algorithm,
    reference,
    ring,
    run_threaded,
)
from virtualpar.errors import P2PTimeout, UnmatchedMessages, UsageError

SIZES = [1, 2, 3, 4, 8]
DTYPES = [np.float32, np.float64, np.int64]
OPS = sorted(REDUCE_OPS)


def make_inputs(n: int, shape: tuple[int, ...], dtype, op: str = "sum", seed: int = 0) -> list:
    """Per-rank inputs, small or near 1 so that prod and sum neither overflow nor cancel."""
    rng = np.random.default_rng([seed, n, len(shape), *shape])
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-3, 4, size=shape).astype(dtype) for _ in range(n)]
    if op == "prod":
        return [rng.uniform(0.5, 1.5, size=shape).astype(dtype) for _ in range(n)]
    return [rng.uniform(1.0, 2.0, size=shape).astype(dtype) for _ in range(n)]


def assert_matches(got, expected, dtype) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if e is None:
            assert g is None
            continue
        assert isinstance(g, np.ndarray) and g.dtype == np.dtype(dtype) and g.shape == e.shape
        if np.issubdtype(dtype, np.integer):
            np.testing.assert_array_equal(g, e)
        else:
            tol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol)


def assert_bit_identical(outputs) -> None:
    first = outputs[0]
    for out in outputs[1:]:
        assert out.shape == first.shape and out.dtype == first.dtype
        assert out.tobytes() == first.tobytes()


def assert_unmodified(xs, copies) -> None:
    for x, c in zip(xs, copies):
        if x is not None:
            assert x.tobytes() == c.tobytes() and x.shape == c.shape


def split_sizes(total: int, n: int) -> list[int]:
    """Sizes of numpy.array_split pieces by its documented rule (the first total % n get one more)."""
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def run_cases(n: int, calls: list) -> tuple[list[list], list[list[int]], list[list[int]]]:
    """Run every ``call(comm)`` in sequence on one ThreadWorld (one thread start per test case).

    Returns ``outputs[case][rank]`` and the bytes and messages each rank sent during each case:
    a rank's own send counters are written only by its own thread, so the differences are exact.
    """
    world = ThreadWorld(n)

    def body(comm):
        r, rows = comm.rank, []
        for call in calls:
            nbytes, nmsgs = world.bytes_sent(r), int(world.messages[r].sum())
            out = call(comm)
            rows.append((out, world.bytes_sent(r) - nbytes, int(world.messages[r].sum()) - nmsgs))
        return rows

    per_rank = world.run(body)
    cases = range(len(calls))
    return tuple([[per_rank[r][k][i] for r in range(n)] for k in cases] for i in range(3))


def per_rank(fn, xs, *args):
    """The SPMD call ``fn(comm, xs[comm.rank], *args)`` as a function of the comm."""
    return lambda comm: fn(comm, xs[comm.rank], *args)


def tree_all_reduce_bytes(n: int, rank: int, nbytes: int) -> int:
    p = 1 << (n.bit_length() - 1)
    if rank >= p:
        return nbytes
    return int(math.log2(p)) * nbytes + (nbytes if rank < n - p else 0)


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", sorted(ALGORITHMS["all_reduce"]))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_all_reduce(algo, n, dtype, op):
    fn = ALGORITHMS["all_reduce"][algo]
    if op == "avg" and dtype == np.int64:
        with pytest.raises(UsageError, match="int64"):
            check_op(op, dtype)
        with pytest.raises(UsageError, match="sum"):
            reference.all_reduce(make_inputs(n, (4,), dtype), op)
        return
    shapes = [(), (2,), (10,), (4, 6)]  # 0-d, size < n, uneven chunks, n | size
    inputs = [make_inputs(n, shape, dtype, op) for shape in shapes]
    copies = [[x.copy() for x in xs] for xs in inputs]
    outputs, sent, _ = run_cases(n, [per_rank(fn, xs, op) for xs in inputs])
    for xs, xs0, got, sent_k in zip(inputs, copies, outputs, sent):
        assert_unmodified(xs, xs0)
        assert_matches(got, reference.all_reduce(xs, op), dtype)
        assert_bit_identical(got)
        assert len({id(g) for g in got} | {id(x) for x in xs}) == 2 * n  # fresh arrays
        m = xs[0].nbytes
        if algo == "ring":
            chunk = [k * xs[0].itemsize for k in split_sizes(xs[0].size, n)]
            expected = [2 * m - chunk[r] - chunk[(r + 1) % n] if n > 1 else 0 for r in range(n)]
            if xs[0].size % n == 0:
                assert [b * n for b in sent_k] == [2 * (n - 1) * m] * n
        elif algo == "direct":
            expected = [(n - 1) * m] * n
        elif algo == "shm":  # member r's memory is read: slice j by each peer j, its reduced slice r by all
            piece = [k * xs[0].itemsize for k in split_sizes(xs[0].size, n)]
            expected = [(m - piece[r]) + (n - 1) * piece[r] if n > 1 else 0 for r in range(n)]
            if xs[0].size % n == 0:
                assert [b * n for b in sent_k] == [2 * (n - 1) * m] * n
        else:
            expected = [tree_all_reduce_bytes(n, r, m) if n > 1 else 0 for r in range(n)]
        assert sent_k == expected


@pytest.mark.parametrize("algo", sorted(ALGORITHMS["all_reduce"]))
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_all_reduce_bit_identical_with_signed_zeros_and_nan_payloads(algo, n):
    # max(-0, +0) and NaN + NaN depend on operand order: every rank must still get the same bits.
    fn = ALGORITHMS["all_reduce"][algo]
    zeros = [np.array([0.0, -0.0] * 4)[r % 2 :][:7].copy() for r in range(n)]
    payloads = [np.full(6, np.nan).view(np.uint64) | np.uint64(r + 1) for r in range(n)]
    nans = [p.view(np.float64) for p in payloads]
    outputs, _, _ = run_cases(n, [per_rank(fn, zeros, "max"), per_rank(fn, nans, "sum")])
    for got in outputs:
        assert_bit_identical(got)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS["all_gather"]))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather(algo, n, dtype):
    fn = ALGORITHMS["all_gather"][algo]
    cases = [((3,), 0, False), ((2, 5), 0, True), ((4, 2), 1, True), ((0, 3), 0, False)]
    inputs = []
    for shape, dim, uneven in cases:
        xs = make_inputs(n, shape, dtype)
        if uneven:  # allgatherv: rank r contributes r + 1 slices along dim
            xs = [np.concatenate([x] * (r + 1), axis=dim) for r, x in enumerate(xs)]
        inputs.append(xs)
    copies = [[x.copy() for x in xs] for xs in inputs]
    calls = [per_rank(fn, xs, dim) for xs, (_, dim, _) in zip(inputs, cases)]
    outputs, sent, _ = run_cases(n, calls)
    for (shape, dim, uneven), xs, xs0, got, sent_k in zip(cases, inputs, copies, outputs, sent):
        assert_unmodified(xs, xs0)
        assert_matches(got, reference.all_gather(xs, dim), dtype)
        assert_bit_identical(got)
        total = sum(x.nbytes for x in xs)
        if algo == "ring":  # forwards every piece except its right neighbour's
            assert sent_k == [total - xs[(r + 1) % n].nbytes for r in range(n)]
        else:
            assert sent_k == [(n - 1) * xs[r].nbytes for r in range(n)]
        if not uneven:
            assert [b * n for b in sent_k] == [(n - 1) * total] * n


@pytest.mark.parametrize("algo", sorted(ALGORITHMS["reduce_scatter"]))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_reduce_scatter(algo, n, dtype, op):
    if op == "avg" and dtype == np.int64:
        with pytest.raises(UsageError, match="int64"):
            reference.reduce_scatter(make_inputs(n, (4,), dtype), 0, op)
        return
    cases = [((10,), 0), ((3,), 0), ((3, 8), 1), ((24,), 0)]
    inputs = [make_inputs(n, shape, dtype, op) for shape, _ in cases]
    copies = [[x.copy() for x in xs] for xs in inputs]
    calls = [per_rank(ALGORITHMS["reduce_scatter"][algo], xs, dim, op) for xs, (_, dim) in zip(inputs, cases)]
    outputs, sent, _ = run_cases(n, calls)
    for (shape, dim), xs, xs0, got, sent_k in zip(cases, inputs, copies, outputs, sent):
        assert_unmodified(xs, xs0)
        assert_matches(got, reference.reduce_scatter(xs, dim, op), dtype)
        assert all(g.flags.c_contiguous for g in got)
        m = xs[0].nbytes
        piece = [k * m // shape[dim] for k in split_sizes(shape[dim], n)]
        # the ring sends all but its own piece; shm's peers each read their own piece of ours: the same
        assert sent_k == [m - piece[r] if n > 1 else 0 for r in range(n)]
        if shape[dim] % n == 0:
            assert [b * n for b in sent_k] == [(n - 1) * m] * n


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast(n, dtype):
    cases = [(root, shape) for root in sorted({0, n - 1, n // 2}) for shape in [(), (5, 3)]]
    inputs = [make_inputs(n, shape, dtype) for _, shape in cases]
    bcast = ALGORITHMS["broadcast"]["tree"]
    calls = []
    for xs, (root, _) in zip(inputs, cases):
        only_root = [x if r == root else None for r, x in enumerate(xs)]  # non-roots pass None
        calls.append(per_rank(bcast, only_root, root))
    outputs, sent, _ = run_cases(n, calls)
    for (root, _), xs, got, sent_k in zip(cases, inputs, outputs, sent):
        assert_matches(got, reference.broadcast(xs, root), dtype)
        assert_bit_identical(got)
        assert got[root] is not xs[root]
        m = xs[0].nbytes
        assert sum(sent_k) == (n - 1) * m  # every non-root receives the array exactly once
        assert sent_k[root] == (math.ceil(math.log2(n)) * m if n > 1 else 0)  # one send per round


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_reduce(n, dtype, op):
    if op == "avg" and dtype == np.int64:
        with pytest.raises(UsageError):
            reference.reduce(make_inputs(n, (3,), dtype), 0, op)
        return
    cases = [(root, shape) for root in sorted({0, n - 1}) for shape in [(), (7,), (2, 3)]]
    inputs = [make_inputs(n, shape, dtype, op) for _, shape in cases]
    copies = [[x.copy() for x in xs] for xs in inputs]
    red = ALGORITHMS["reduce"]["tree"]
    calls = [per_rank(red, xs, root, op) for xs, (root, _) in zip(inputs, cases)]
    outputs, sent, _ = run_cases(n, calls)
    for (root, _), xs, xs0, got, sent_k in zip(cases, inputs, copies, outputs, sent):
        assert_unmodified(xs, xs0)
        assert_matches(got, reference.reduce(xs, root, op), dtype)
        assert sent_k == [0 if r == root else xs[0].nbytes for r in range(n)]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather(n, dtype):
    shapes = [((2, 3), 0), ((2, 3), 1), ((4,), 0)]
    cases = [(root, shape, dim) for root in sorted({0, n - 1}) for shape, dim in shapes]
    inputs = []
    for _, shape, dim in cases:
        xs = make_inputs(n, shape, dtype)
        uneven = [np.concatenate([x] * (r % 3 + 1), axis=dim) for r, x in enumerate(xs)]
        inputs.append(uneven)
    calls = [per_rank(direct.gather, xs, root, dim) for xs, (root, _, dim) in zip(inputs, cases)]
    outputs, sent, _ = run_cases(n, calls)
    for (root, _, dim), xs, got, sent_k in zip(cases, inputs, outputs, sent):
        assert_matches(got, reference.gather(xs, root, dim), dtype)
        assert sent_k == [0 if r == root else xs[r].nbytes for r in range(n)]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter(n, dtype):
    shapes = [((10, 4), 0), ((3, 10), 1), ((2,), 0), ((8, 3), 0)]
    cases = [(root, shape, dim) for root in sorted({0, n - 1}) for shape, dim in shapes]
    inputs = []
    for root, shape, _ in cases:
        x = make_inputs(1, shape, dtype, seed=root)[0]
        inputs.append([x if r == root else None for r in range(n)])  # x only on the root
    calls = [per_rank(direct.scatter, xs, root, dim) for xs, (root, _, dim) in zip(inputs, cases)]
    outputs, sent, _ = run_cases(n, calls)
    for (root, shape, dim), xs, got, sent_k in zip(cases, inputs, outputs, sent):
        assert_matches(got, reference.scatter(xs, root, dim), dtype)
        assert got[root] is not xs[root]
        x = xs[root]
        assert sent_k == [x.nbytes - got[root].nbytes if r == root else 0 for r in range(n)]
        if shape[dim] % n == 0:
            assert sent_k[root] * n == (n - 1) * x.nbytes


@pytest.mark.parametrize("algo", sorted(ALGORITHMS["all_to_all"]))
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all(algo, n, dtype):
    cases = [((8, 3), 0, 0), ((8, 3), 0, 1), ((5, 8), 1, 0), ((2, 2), 0, 1), ((3, 4, 7), 2, 0),
             ((0, 3), 0, 1)]
    inputs = [make_inputs(n, shape, dtype) for shape, _, _ in cases]
    copies = [[x.copy() for x in xs] for xs in inputs]
    calls = [per_rank(ALGORITHMS["all_to_all"][algo], xs, s, t) for xs, (_, s, t) in zip(inputs, cases)]
    outputs, sent, messages = run_cases(n, calls)
    results = zip(cases, inputs, copies, outputs, sent, messages)
    for (shape, split_dim, concat_dim), xs, xs0, got, sent_k, msgs in results:
        assert_unmodified(xs, xs0)
        assert_matches(got, reference.all_to_all(xs, split_dim, concat_dim), dtype)
        piece = [
            k * xs[0].nbytes // shape[split_dim] if shape[split_dim] else 0
            for k in split_sizes(shape[split_dim], n)
        ]
        assert sent_k == [xs[0].nbytes - piece[r] for r in range(n)]  # everything but its own piece
        assert msgs == [n - 1] * n


@pytest.mark.parametrize("n", SIZES + [5, 7])
def test_barrier_synchronizes_with_log_rounds_of_empty_messages(n):
    arrived: list[int] = []
    lock = threading.Lock()

    def body(comm):
        with lock:
            arrived.append(comm.rank)
        direct.barrier(comm)
        with lock:  # nobody leaves before everybody has entered
            return len(arrived)

    world = ThreadWorld(n)
    assert world.run(body) == [n] * n
    assert world.bytes.sum() == 0
    assert list(world.messages.sum(axis=1)) == [math.ceil(math.log2(n))] * n


# ---------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 5),
    rows=st.integers(0, 9),
    cols=st.integers(1, 4),
    dim=st.integers(0, 1),
    dtype=st.sampled_from(DTYPES),
)
def test_scatter_then_all_gather_is_identity(n, rows, cols, dim, dtype):
    x = np.arange(rows * cols, dtype=dtype).reshape(rows, cols)

    def body(comm):
        piece = direct.scatter(comm, x if comm.rank == 0 else None, 0, dim)
        return ring.all_gather(comm, piece, dim)

    for out in run_threaded(n, body):
        np.testing.assert_array_equal(out, x)
        assert out.dtype == x.dtype


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 5),
    shape=st.tuples(st.integers(0, 7), st.integers(1, 3)),
    dim=st.integers(0, 1),
    op=st.sampled_from(["sum", "prod", "max", "min"]),
    seed=st.integers(0, 2**16),
)
def test_reduce_scatter_then_all_gather_equals_all_reduce(n, shape, dim, op, seed):
    rng = np.random.default_rng(seed)
    xs = [rng.integers(-3, 4, size=shape).astype(np.int64) for _ in range(n)]

    def body(comm):
        piece = ring.reduce_scatter(comm, xs[comm.rank], dim, op)
        return ring.all_gather(comm, piece, dim), ring.all_reduce(comm, xs[comm.rank], op)

    for gathered, reduced in run_threaded(n, body):
        np.testing.assert_array_equal(gathered, reduced)


# ---------------------------------------------------------------------------------------------
def test_registry_and_ops_reject_the_unknown():
    assert set(DEFAULT_ALGORITHMS) == set(ALGORITHMS)
    assert get_algorithm("all_reduce") is ring.all_reduce
    with pytest.raises(UsageError, match="'ring', 'shm', 'tree'"):
        get_algorithm("all_reduce", "butterfly")
    with pytest.raises(UsageError, match="unknown collective"):
        get_algorithm("allreduce")
    with pytest.raises(UsageError, match="'avg', 'max'"):
        check_op("mean", np.float32)
    assert check_op("avg", np.float16).name == "avg"


def test_thread_comm_fails_instead_of_hanging():
    with pytest.raises(P2PTimeout, match="rank 1: no message from rank 0"):
        ThreadWorld(2, timeout=0.2).run(lambda c: c.recv(0) if c.rank == 1 else None)
    with pytest.raises(UnmatchedMessages, match="1 message"):
        run_threaded(2, lambda c: c.send(np.zeros(3), 1) if c.rank == 0 else None)

    def boom(comm):
        if comm.rank == 2:
            raise KeyError("rank two failed")
        return comm.recv((comm.rank + 1) % comm.size)  # would wait forever without the abort

    with pytest.raises(KeyError, match="rank two failed"):
        ThreadWorld(3, timeout=30).run(boom)


def test_thread_comm_copies_on_send_and_fills_out():
    def body(comm):
        if comm.rank == 0:
            x = np.arange(4.0)
            comm.send(x, 1)
            x[:] = -1  # must not affect what rank 1 receives
            return None
        out = np.empty(4)
        got = comm.recv(0, out=out)
        assert got is out
        return out

    world = ThreadWorld(2)
    assert isinstance(world.comms[0], Comm)
    np.testing.assert_array_equal(world.run(body)[1], np.arange(4.0))
    assert world.bytes[0, 1] == 32 and world.messages[0, 1] == 1 and world.bytes[1, 0] == 0
