"""Differentiable collectives: each primitive's vjp against a single-process numpy reference.

Every device r holds its own x_r and its own cotangent dy_r; the expected input cotangent is
worked out in numpy from the convention of virtualpar.tensor_parallel.autodiff."""

from __future__ import annotations

import numpy as np
import pytest
from autograd import make_vjp

from virtualpar import Mesh, VirtualCluster
from virtualpar.tensor_parallel import autodiff as ad

N = 4  # a 1-D mesh "t" of 4 devices, plus a 3-device one for the non-power-of-two ring


def _vjp_on_device(dev, name, xs, dys, dim):
    x, dy = xs[dev.rank], dys[dev.rank]
    prim = {
        "f": lambda v: ad.f(v, dev, "t"),
        "g": lambda v: ad.g(v, dev, "t"),
        "all_gather": lambda v: ad.all_gather(v, dev, dim, "t"),
        "all_gather_invariant": lambda v: ad.all_gather_invariant(v, dev, dim, "t"),
        "reduce_scatter": lambda v: ad.reduce_scatter(v, dev, dim, "t"),
        "all_to_all": lambda v: ad.all_to_all(v, dev, dim, 1 - dim, "t"),
    }[name]
    vjp, y = make_vjp(prim)(x)
    return y, vjp(dy)


@pytest.fixture(scope="module", params=[4, 3], ids=["n4", "n3"])
def cluster(request):
    with VirtualCluster(Mesh({"t": request.param})) as c:
        yield c


def _expected(name, xs, dys, dim, n):
    """(forward outputs, input cotangents) per device, from numpy alone."""
    split = lambda a: np.split(a, n, axis=dim)  # noqa: E731
    if name == "f":
        return xs, [sum(dys)] * n
    if name == "g":
        return [sum(xs)] * n, dys
    if name in ("all_gather", "all_gather_invariant"):
        full = np.concatenate(xs, axis=dim)
        if name == "all_gather":  # contributions: sum them, keep my slice
            return [full] * n, split(sum(dys))
        return [full] * n, [split(dys[r])[r] for r in range(n)]  # invariant: my slice of my (identical) dy
    if name == "reduce_scatter":
        return split(sum(xs)), [np.concatenate(dys, axis=dim)] * n
    if name == "all_to_all":  # piece j of x_r (split on dim) goes to j, concatenated along 1-dim
        outs = [np.concatenate([np.split(xs[s], n, axis=dim)[r] for s in range(n)],
                               axis=1 - dim) for r in range(n)]
        grads = [np.concatenate([np.split(dys[s], n, axis=1 - dim)[r] for s in range(n)],
                                axis=dim) for r in range(n)]
        return outs, grads
    raise KeyError(name)


@pytest.mark.parametrize("name",
                         ["f", "g", "all_gather", "all_gather_invariant", "reduce_scatter", "all_to_all"])
@pytest.mark.parametrize("dim", [0, 1])
def test_vjp_matches_numpy(cluster, name, dim):
    n = cluster.size
    rng = np.random.default_rng([len(name), dim, n])
    in_shape = [6 * n, 4 * n]
    out_shape = list(in_shape)
    if name in ("all_gather", "all_gather_invariant"):
        out_shape[dim] *= n
    elif name == "reduce_scatter":
        out_shape[dim] //= n
    elif name == "all_to_all":
        out_shape[dim] //= n
        out_shape[1 - dim] *= n
    xs = [rng.standard_normal(in_shape) for _ in range(n)]
    dys = [rng.standard_normal(out_shape) for _ in range(n)]
    if name in ("g", "all_gather_invariant"):  # their outputs are invariant: one cotangent on every device
        dys = [dys[0]] * n
    want_y, want_dx = _expected(name, xs, dys, dim, n)
    got = cluster.run(_vjp_on_device, name, xs, dys, dim)
    for r, (y, dx) in enumerate(got):
        np.testing.assert_allclose(y, want_y[r], rtol=1e-13, atol=1e-13,
                                   err_msg=f"{name} forward on device {r}")
        np.testing.assert_allclose(dx, want_dx[r], rtol=1e-13, atol=1e-13,
                                   err_msg=f"{name} vjp on device {r}")


def _composed(dev, x, dy):
    """y = g(f(x)·w_r): each device scales the replicated x by its own w_r = r+1, then all_reduce.
    Forward: y = Σ_r (r+1)·x.  Backward by composition: dx = Σ_r (r+1)·dy (f sums the contributions)."""
    def fwd(v):
        return ad.g(ad.f(v, dev, "t") * float(dev.rank + 1), dev, "t")
    vjp, y = make_vjp(fwd)(x)
    return y, vjp(dy)


def test_f_and_g_compose_into_the_replicated_gradient(cluster):
    n = cluster.size
    x, dy = np.arange(6.0), np.linspace(-1, 1, 6)
    scale = n * (n + 1) / 2
    for y, dx in cluster.run(_composed, x, dy):
        np.testing.assert_allclose(y, scale * x, rtol=1e-15)
        np.testing.assert_allclose(dx, scale * dy, rtol=1e-15)


def _gather_then_same_work(dev, x_full, dy, invariant):
    """Every device gathers its block of x and computes the same y = sum of squares from it."""
    x = x_full[dev.group_rank("t") * 2:(dev.group_rank("t") + 1) * 2]
    gather = ad.all_gather_invariant if invariant else ad.all_gather

    def fwd(v):
        full = gather(v, dev, 0, "t")
        return full * full
    vjp, _ = make_vjp(fwd)(x)
    return vjp(dy)


def test_the_wrong_gather_is_off_by_the_group_size(cluster):
    """Identical downstream work makes the gathered copies invariant: the invariant gather's slice
    gives the true gradient 2x; the varying gather's reduce_scatter sums n identical copies."""
    n = cluster.size
    x = np.arange(2.0 * n) + 1
    dy = np.ones(2 * n)
    right = np.concatenate(cluster.run(_gather_then_same_work, x, dy, True))
    wrong = np.concatenate(cluster.run(_gather_then_same_work, x, dy, False))
    np.testing.assert_allclose(right, 2 * x, rtol=1e-15)
    np.testing.assert_allclose(wrong, n * 2 * x, rtol=1e-15)
