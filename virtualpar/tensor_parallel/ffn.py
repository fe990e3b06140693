"""``FeedForward``: y = relu(x·W1 + b1)·W2 + b2 under a ``FeedForwardShardingPolicy``, fwd and bwd.

x and y are (b, s, m); W1 (m, h), b1 (h,), W2 (h, m), b2 (m,).  As for MatMul, each policy is a
forward program over :mod:`.autodiff`; its backward is the vjp.  Notation: T = b·s tokens, s_ =
itemsize; collectives are listed in the order they run (the backward's is autograd's reverse
topological order of the forward); FLOPs counted as in :mod:`.autodiff` (2 per multiply-add, 1 per
element for bias, ReLU, ReLU mask, bias-gradient sum).  The unsharded block does 4Tmh + 2Th + Tm
flops forward and 8Tmh + 2Th + Tm backward; each policy divides it as stated.  Bytes are sent per
device.

``unsharded``  everything replicated; no collective.
``megatron``   (arXiv 1909.08053 §3) over axes A, t = |A|: x [R, R, R], W1 [R, S(A)], b1 [S(A)],
    W2 [S(A), R], b2 [R], y [R, R, R].  y = g(relu(f(x)·W1_l + b1_l)·W2_l) + b2.
    fwd: one all_reduce(A) of Tms_ bytes: sends 2(t−1)/t·Tms_; 4Tmh/t + 2Th/t + Tm flops.
    bwd: f's vjp, one all_reduce(A) of dx, Tms_: sends 2(t−1)/t·Tms_; 8Tmh/t + 2Th/t + Tm flops.
``sequence_parallel`` (arXiv 2205.05198 §4.2.2) over axes A: x and y [R, S(A), R] (sharded on the
    sequence), the weights as megatron.  y = reduce_scatter_s(relu(all_gather_s(x)·W1_l + b1_l)·W2_l)
    + f(b2): the all_reduce becomes all_gather + reduce_scatter; b2, replicated but added to
    different tokens on each device, passes through f.
    fwd: all_gather(A) of (T/t)ms_: sends (t−1)(T/t)ms_; reduce_scatter(A) of Tms_: sends
    (t−1)/t·Tms_; 4Tmh/t + 2Th/t + Tm/t flops.
    bwd: all_reduce(A) of db2 2(t−1)/t·ms_, all_gather(A) of dy (t−1)(T/t)ms_, reduce_scatter(A)
    of dx (t−1)/t·Tms_; 8Tmh/t + 2Th/t + Tm/t flops.
``gspmd``      (arXiv 2105.04663 §3.4, 2-D) over axes X (p) and Y (q): x and y [S(X), R, S(Y)],
    W1 [S(X), S(Y)], b1 [S(Y)], W2 [S(Y), S(X)], b2 [S(Y)].  all_gather x over Y (m), all_gather
    W1 over X (m), einsum, bias, activation, all_gather W2 over X (m), einsum (a partial sum over
    Y), reduce_scatter over Y (m), bias.  b1 and b2 are shared by the X members' different
    batch rows: each passes through f over X.
    fwd: sends (q−1)·(T/p)(m/q)s_ + 2·(p−1)(m/p)(h/q)s_ + (q−1)/q·(T/p)ms_;
    4Tmh/(pq) + 2Th/(pq) + Tm/(pq) flops.
    bwd: all_reduce(X) of db2 2(p−1)/p·(m/q)s_; all_gather(Y) of dy (q−1)(T/p)(m/q)s_;
    reduce_scatter(X) of dW2 (p−1)/p·(h/q)ms_; all_reduce(X) of db1 2(p−1)/p·(h/q)s_;
    reduce_scatter(X) of dW1 (p−1)/p·(h/q)ms_; reduce_scatter(Y) of dx (q−1)/q·(T/p)ms_;
    8Tmh/(pq) + 2Th/(pq) + Tm/(pq) flops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ShardingError
from ..kernels import matmul_backward_flops, matmul_flops
from . import autodiff as ad
from .costs import Collective, PhaseCost, PolicyCost, gather_bytes, reduce_bytes, scatter_bytes
from ..sharding import TensorSharding
from .layer_op import ShardedLayer
from .layout import Layout, axes_size, check_layout, check_roles, format_layout, role_axes

__all__ = ["FeedForwardShardingPolicy", "FeedForward", "FFN_POLICIES"]

R: tuple[str, ...] = ()
Axes = tuple[tuple[str, ...], ...]  # per dim, the mesh axes that shard it (a TensorSharding's .axes)


def _dense(dev: Any, x, w1, b1, w2):
    return ad.matmul(ad.relu(ad.add_bias(ad.matmul(x, w1, dev), b1, dev), dev), w2, dev)


def _unsharded(dev: Any, x, w1, b1, w2, b2, r: dict):
    return ad.add_bias(_dense(dev, x, w1, b1, w2), b2, dev)


def _megatron(dev: Any, x, w1, b1, w2, b2, r: dict):
    return ad.add_bias(ad.g(_dense(dev, ad.f(x, dev, r["t"]), w1, b1, w2), dev, r["t"]), b2, dev)


def _sequence_parallel(dev: Any, x, w1, b1, w2, b2, r: dict):
    z = _dense(dev, ad.all_gather(x, dev, 1, r["t"]), w1, b1, w2)
    return ad.add_bias(ad.reduce_scatter(z, dev, 1, r["t"]), ad.f(b2, dev, r["t"]), dev)


def _gspmd(dev: Any, x, w1, b1, w2, b2, r: dict):
    X, Y = r["x"], r["y"]
    xg = ad.all_gather(x, dev, 2, Y)
    w1g = ad.all_gather(w1, dev, 0, X)
    h = ad.relu(ad.add_bias(ad.matmul(xg, w1g, dev), ad.f(b1, dev, X), dev), dev)
    z = ad.matmul(h, ad.all_gather(w2, dev, 1, X), dev)
    return ad.add_bias(ad.reduce_scatter(z, dev, 2, Y), ad.f(b2, dev, X), dev)


def _megatron_layouts(r: dict, seq: bool) -> tuple[Axes, ...]:
    t = r["t"]
    act = (R, t, R) if seq else (R, R, R)
    return (act, (R, t), (t,), (t, R), (R,), act)


# name -> (roles, program, per-dim axes of (x, W1, b1, W2, b2, y) from the roles)
FFN_POLICIES: dict[str, tuple[tuple[str, ...], Callable, Callable[[dict], tuple[Axes, ...]]]] = {
    "unsharded": ((), _unsharded, lambda r: ((R, R, R), (R, R), (R,), (R, R), (R,), (R, R, R))),
    "megatron": (("t",), _megatron, lambda r: _megatron_layouts(r, False)),
    "sequence_parallel": (("t",), _sequence_parallel, lambda r: _megatron_layouts(r, True)),
    "gspmd": (("x", "y"), _gspmd, lambda r: ((r["x"], R, r["y"]), (r["x"], r["y"]), (r["y"],),
                                             (r["y"], r["x"]), (r["y"],), (r["x"], R, r["y"]))),
}


@dataclass(frozen=True)
class FeedForwardShardingPolicy:
    """A named FFN policy with its mesh axes per role (``t``; or ``x`` and ``y`` for gspmd)."""

    name: str
    roles: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def named(cls, name: str, mesh: Any, **roles: Any) -> "FeedForwardShardingPolicy":
        if name not in FFN_POLICIES:
            raise ShardingError(
                f"unknown FeedForward policy {name!r}; expected one of {sorted(FFN_POLICIES)}", policy=name
            )
        if not hasattr(mesh, "axis_names"):
            raise ShardingError(
                f"policy {name!r} needs a Mesh (for its axes), got {type(mesh).__name__} {mesh!r}",
                policy=name,
            )
        needed = FFN_POLICIES[name][0]
        unknown = sorted(set(roles) - set(needed))
        if unknown:
            raise ShardingError(
                f"policy {name!r} takes roles {needed}, got unexpected {unknown}", policy=name
            )
        axes = tuple(mesh.axis_names)
        full: dict[str, tuple[str, ...]] = {}
        if name in ("megatron", "sequence_parallel"):
            full = {"t": axes}
        elif name == "gspmd":
            if len(axes) < 2:
                raise ShardingError(
                    f"policy 'gspmd' needs a mesh with at least 2 axes; got axes {axes}", policy=name
                )
            full = {"x": axes[:1], "y": axes[1:]}
        full.update(role_axes(name, roles))
        full = check_roles(name, full, mesh, FFN_POLICIES[name][2], ("x", "W1", "b1", "W2", "b2", "y"))
        return cls(name, tuple(sorted(full.items())))

    @property
    def role_axes(self) -> dict[str, tuple[str, ...]]:
        return dict(self.roles)

    def layouts(self) -> tuple[Layout, ...]:
        """(x, W1, b1, W2, b2, y) layouts, as sharding specs."""
        return tuple(TensorSharding.from_axes(axes) for axes in FFN_POLICIES[self.name][2](self.role_axes))

    def check(self, b: int, s: int, m: int, h: int, mesh: Any) -> None:
        shapes = ((b, s, m), (m, h), (h,), (h, m), (m,), (b, s, m))
        for label, lay, shape in zip(("x", "W1", "b1", "W2", "b2", "y"), self.layouts(), shapes):
            check_layout(f"{label} ({self.name})", lay, shape, mesh)

    def forward(self, dev: Any, x, w1, b1, w2, b2):
        return FFN_POLICIES[self.name][1](dev, x, w1, b1, w2, b2, self.role_axes)

    def __str__(self) -> str:
        names = ("x", "W1", "b1", "W2", "b2", "y")
        return f"{self.name}: " + " ".join(
            f"{n}{format_layout(lay)}" for n, lay in zip(names, self.layouts())
        )

    def cost(self, b: int, s: int, m: int, h: int, mesh: Any, itemsize: int) -> PolicyCost:
        """The closed forms of the module docstring."""
        r, e, T = self.role_axes, itemsize, b * s
        # x·W1 and a·W2 (kernels.matmul_flops), their backward's input and weight parts; the
        # elementwise terms (2Th: bias and ReLU of the hidden, Tm: bias of the output) are
        # autodiff's kernels, one FLOP per element
        mm = matmul_flops(T, m, h) + matmul_flops(T, h, m)
        mm_back = sum(matmul_backward_flops(T, m, h)) + sum(matmul_backward_flops(T, h, m))
        if self.name == "unsharded":
            return PolicyCost(PhaseCost((), mm + 2 * T * h + T * m),
                              PhaseCost((), mm_back + 2 * T * h + T * m))
        if self.name in ("megatron", "sequence_parallel"):
            A, t = r["t"], axes_size(mesh, r["t"])
            if self.name == "megatron":
                ar = Collective("all_reduce", A, reduce_bytes(T * m * e, t))
                return PolicyCost(PhaseCost((ar,), (mm + 2 * T * h) // t + T * m),
                                  PhaseCost((ar,), (mm_back + 2 * T * h) // t + T * m))
            ag = Collective("all_gather", A, gather_bytes(T // t * m * e, t))
            rs = Collective("reduce_scatter", A, scatter_bytes(T * m * e, t))
            return PolicyCost(PhaseCost((ag, rs), (mm + 2 * T * h + T * m) // t),
                              PhaseCost((Collective("all_reduce", A, reduce_bytes(m * e, t)), ag, rs),
                                        (mm_back + 2 * T * h + T * m) // t))
        X, Y = r["x"], r["y"]
        p, q = axes_size(mesh, X), axes_size(mesh, Y)
        w_piece = (m // p) * (h // q) * e
        fwd = (Collective("all_gather", Y, gather_bytes((T // p) * (m // q) * e, q)),
               Collective("all_gather", X, gather_bytes(w_piece, p)),
               Collective("all_gather", X, gather_bytes(w_piece, p)),
               Collective("reduce_scatter", Y, scatter_bytes((T // p) * m * e, q)))
        bwd = (Collective("all_reduce", X, reduce_bytes((m // q) * e, p)),
               Collective("all_gather", Y, gather_bytes((T // p) * (m // q) * e, q)),
               Collective("reduce_scatter", X, scatter_bytes((h // q) * m * e, p)),
               Collective("all_reduce", X, reduce_bytes((h // q) * e, p)),
               Collective("reduce_scatter", X, scatter_bytes((h // q) * m * e, p)),
               Collective("reduce_scatter", Y, scatter_bytes((T // p) * m * e, q)))
        pq = p * q
        return PolicyCost(PhaseCost(fwd, (mm + 2 * T * h + T * m) // pq),
                          PhaseCost(bwd, (mm_back + 2 * T * h + T * m) // pq))


@dataclass(frozen=True)
class FeedForward(ShardedLayer):
    """The FFN block under ``policy`` (a ``FeedForwardShardingPolicy``, or a policy's name whose axes come
    from the mesh it runs on): an operation, ``cluster.execute(FeedForward("megatron"), x, w1, b1, w2, b2)``,
    with the weights resident after ``op.place(cluster, w1=..., b1=..., w2=..., b2=...)``
    (:mod:`.layer_op`); and a layer for :mod:`.runner` (inputs x, W1, b1, W2, b2)."""

    policy: FeedForwardShardingPolicy | str
    input_names = ("x", "w1", "b1", "w2", "b2")

    def bind(self, mesh: Any) -> "FeedForward":
        """This block with a concrete policy for ``mesh`` (itself when it has one)."""
        if isinstance(self.policy, FeedForwardShardingPolicy):
            return self
        return FeedForward(FeedForwardShardingPolicy.named(self.policy, mesh))

    def _policy(self) -> FeedForwardShardingPolicy:
        if isinstance(self.policy, FeedForwardShardingPolicy):
            return self.policy
        raise ShardingError(f"FeedForward({self.policy!r}) takes its mesh axes from a mesh: run it with "
                            f"cluster.execute, or use FeedForward({self.policy!r}).bind(mesh)",
                            policy=self.policy)

    def output_shape(self, shapes: Any) -> tuple[int, int, int]:
        """(b, s, m) for x (b, s, m), W1 (m, h), b1 (h,), W2 (h, m), b2 (m,); anything else is refused."""
        x, w1, b1, w2, b2 = (tuple(s) for s in shapes)
        ok = len(x) == 3 and len(w1) == 2 and len(w2) == 2 and b1 == (w1[-1],) and b2 == (x[-1],) \
            and w1[0] == x[-1] and w2 == (w1[-1], x[-1])
        if not ok:
            raise ShardingError(f"FeedForward of x {x}, W1 {w1}, b1 {b1}, W2 {w2}, b2 {b2}: expected "
                                "x (b, s, m), W1 (m, h), b1 (h,), W2 (h, m), b2 (m,)")
        return x

    def input_layouts(self) -> tuple[Layout, ...]:
        return self._policy().layouts()[:5]

    def output_layout(self) -> Layout:
        return self._policy().layouts()[5]

    def forward(self, dev: Any, x, w1, b1, w2, b2):
        return self._policy().forward(dev, x, w1, b1, w2, b2)
