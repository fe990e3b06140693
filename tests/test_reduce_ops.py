"""One float64 per member is reduced as Python floats (collectives.ops.reduce_floats): it must give
the very bits numpy's path gives (shm.reduce_rows, then finalize), on every combination of signed
zeros, NaNs, infinities and subnormals — and so must an all_reduce of one float on a cluster."""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest

from virtualpar import VirtualCluster
from virtualpar.collectives.ops import REDUCE_OPS, finalize, reduce_floats
from virtualpar.collectives.shm import reduce_rows

EDGES = [0.0, -0.0, 1.0, -1.5, float("nan"), float("inf"), float("-inf"), 5e-324, 1e308, 3.0]


def bits(v: float) -> bytes:
    return struct.pack("<d", v)


def numpy_path(op: str, values: tuple[float, ...]) -> float:
    out = np.empty(1)
    with np.errstate(all="ignore"):  # (inf - inf, 1e308 * 3: the Python path does not warn either)
        reduce_rows(REDUCE_OPS[op].ufunc, np.array(values).reshape(-1, 1), out)
        return float(finalize(op, out, len(values))[0])


@pytest.mark.parametrize("op", sorted(REDUCE_OPS))
def test_python_floats_reduce_to_numpy_s_bits(op):
    for n in (1, 2, 3, 4):
        for values in (
            itertools.product(EDGES, repeat=n)
            if n < 4
            else itertools.islice(itertools.product(EDGES, repeat=4), 0, None, 7)
        ):
            got, want = reduce_floats(op, list(values), n), numpy_path(op, values)
            assert bits(got) == bits(want) or (got != got and want != want), (op, values, got, want)


def _one_float(dev, values, op, shape, algorithm):
    return dev.all_reduce(np.full(shape, values[dev.rank]), op=op, algorithm=algorithm)


@pytest.mark.parametrize("shape", [(1,), (), (1, 1)])
def test_a_one_float_all_reduce_gives_numpy_s_bits_on_every_device(shape):
    """Signed zeros and a NaN in the middle: max/min must choose as np.maximum/np.minimum would in
    rank order, which the shm algorithm (the default) promises on every path.  (The ring computes
    each element in another order: equal on every device, but not these bits.)"""
    rows = [[0.0, -0.0, -0.0, 0.0, 1.0], [-0.0, 0.0, float("nan"), -1.0, 2.0],
            [5e-324, -5e-324, 0.0, -0.0, 0.5]]
    with VirtualCluster(5, timeout=20) as cluster:
        for values, op in itertools.product(rows, sorted(REDUCE_OPS)):
            want = numpy_path(op, tuple(values))
            for algorithm in ("shm", None):
                got = cluster.run(_one_float, values, op, shape, algorithm)
                for g in got:
                    assert g.shape == shape and g.dtype == np.float64
                    v = float(g.reshape(-1)[0])
                    assert bits(v) == bits(want) or (v != v and want != want), (
                        values,
                        op,
                        algorithm,
                        v,
                        want,
                    )
