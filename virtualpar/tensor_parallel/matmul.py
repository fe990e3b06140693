"""``MatMul`` (C = A·B, A (m, k), B (k, n)) under a ``MatMulShardingPolicy``, forward and backward.

Each policy is a forward program on one device written with the differentiable primitives of
:mod:`.autodiff`; its backward (dA, dB) is the vjp of that program, so the backward collectives
below are *derived*, not written.  Notation: s = itemsize; |X| = product of the sizes of mesh axes
X; "sends" = bytes each device sends (ring algorithms; see :mod:`.costs`).  dC arrives in C's
layout (a replicated dC identical on every device); dA and dB leave in A's and B's layouts.

``unsharded``      A [R, R], B [R, R] → C [R, R].  Every device does the whole product.
    fwd: no collective; 2mnk flops.  bwd: no collective; 4mnk flops (dA = dC·Bᵀ, dB = Aᵀ·dC).
``matched_inner``  A [R, S(K)], B [S(K), R] → C [R, R].  Local (m, k/q)·(k/q, n) is a partial sum
    of C, q = |K|; g = all_reduce over K.  fwd: all_reduce(K) of mns bytes: sends 2(q−1)/q·mns;
    2mnk/q flops.  bwd: g's vjp is the identity, dA = dC·B_lᵀ and dB = A_lᵀ·dC are already the
    local shards: no collective; 4mnk/q flops.
``row``            Megatron's row-parallel linear (arXiv 1909.08053, eq. 3): the activation arrives
    sharded on k, the weight row-sharded; identical in layouts, program and cost to matched_inner.
``unmatched_inner`` A [R, S(KA)], B [S(KB), R] → C [R, R], KA ≠ KB.  all_gather A over KA and B
    over KB into invariant copies, multiply.  fwd: sends (|KA|−1)·m(k/|KA|)s + (|KB|−1)·(k/|KB|)ns;
    2mnk flops.  bwd: the invariant gathers' vjp is a local slice: no collective; 4mnk flops.
``outer``          A [S(M), S(K)], B [S(K), R] → C [R, R], p = |M|, q = |K|.  all_gather A and B
    over K (k), multiply (m/p, k)·(k, n), all_gather C over M (m).  B's gathered copy is
    consumed by different rows on the M members, so it passes through f over M first.
    fwd: sends (q−1)(m/p)(k/q)s + (q−1)(k/q)ns + (p−1)(m/p)ns; 2mnk/p flops.
    bwd: slices, then f's vjp: all_reduce(M) of (k/q)ns bytes: sends 2(p−1)/p·(k/q)ns; 4mnk/p flops.
``full``           A [S(M), S(K)], B [S(K), S(M)] → C [S(M), R]: m, n and k all sharded.
    all_gather B over M (n) into varying copies, (m/p, k/q)·(k/q, n) is a partial sum over K, g.
    fwd: sends (p−1)(k/q)(n/p)s + 2(q−1)/q·(m/p)ns; 2mnk/(pq) flops.  bwd: dB's copies are
    contributions summed by the gather's vjp, reduce_scatter(M) of (k/q)ns bytes: sends
    (p−1)/p·(k/q)ns; 4mnk/(pq) flops.
``column``         A [R, R], B [R, S(N)] → C [R, S(N)], t = |N| (Megatron's column-parallel
    linear).  fwd: f (identity), no collective; 2mnk/t flops.  bwd: dA's contributions summed by
    f's vjp: all_reduce(N) of mks bytes: sends 2(t−1)/t·mks; 4mnk/t flops.

Inference from the input layouts (total: every pair of layouts has a policy): both replicated → unsharded;
A [R, S(K)], B [S(K), R] → matched_inner; A [R, S(KA)], B [S(KB), R], KA ≠ KB → unmatched_inner;
A [S(M), S(K)], B [S(K), R] → outer; A [S(M), S(K)], B [S(K), S(M)] → full; A [R, R], B [R, S(N)]
→ column.  Anything else is a ShardingError listing what was received and these patterns.
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
from .layout import Layout, as_sharding, axes_size, check_layout, check_roles, format_layout, role_axes

__all__ = ["MatMulShardingPolicy", "MATMUL_POLICIES", "infer_matmul_policy"]

R: tuple[str, ...] = ()
Axes = tuple[tuple[str, ...], ...]  # per dim, the mesh axes that shard it (a TensorSharding's .axes)


def _unsharded(dev: Any, a, b, r: dict):
    return ad.matmul(a, b, dev)


def _matched_inner(dev: Any, a, b, r: dict):
    return ad.g(ad.matmul(a, b, dev), dev, r["k"])


def _unmatched_inner(dev: Any, a, b, r: dict):
    return ad.matmul(
        ad.all_gather_invariant(a, dev, 1, r["ka"]), ad.all_gather_invariant(b, dev, 0, r["kb"]), dev
    )


def _outer(dev: Any, a, b, r: dict):
    a_k = ad.all_gather_invariant(a, dev, 1, r["k"])
    b_k = ad.all_gather_invariant(ad.f(b, dev, r["m"]), dev, 0, r["k"])
    return ad.all_gather_invariant(ad.matmul(a_k, b_k, dev), dev, 0, r["m"])


def _full(dev: Any, a, b, r: dict):
    return ad.g(ad.matmul(a, ad.all_gather(b, dev, 1, r["m"]), dev), dev, r["k"])


def _column(dev: Any, a, b, r: dict):
    return ad.matmul(ad.f(a, dev, r["n"]), b, dev)


# name -> (roles needed, program, per-dim axes of (A, B, C) from the roles)
MATMUL_POLICIES: dict[str, tuple[tuple[str, ...], Callable, Callable[[dict], tuple[Axes, Axes, Axes]]]] = {
    "unsharded": ((), _unsharded, lambda r: ((R, R), (R, R), (R, R))),
    "matched_inner": (("k",), _matched_inner, lambda r: ((R, r["k"]), (r["k"], R), (R, R))),
    "row": (("k",), _matched_inner, lambda r: ((R, r["k"]), (r["k"], R), (R, R))),
    "unmatched_inner": (("ka", "kb"), _unmatched_inner, lambda r: ((R, r["ka"]), (r["kb"], R), (R, R))),
    "outer": (("m", "k"), _outer, lambda r: ((r["m"], r["k"]), (r["k"], R), (R, R))),
    "full": (("m", "k"), _full, lambda r: ((r["m"], r["k"]), (r["k"], r["m"]), (r["m"], R))),
    "column": (("n",), _column, lambda r: ((R, R), (R, r["n"]), (R, r["n"]))),
}


def _default_roles(name: str, axes: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    if name in ("matched_inner", "row"):
        return {"k": axes}
    if name == "column":
        return {"n": axes}
    if name in ("unmatched_inner", "outer", "full"):
        if len(axes) < 2:
            raise ShardingError(
                f"policy {name!r} needs a mesh with at least 2 axes; got axes {axes}", policy=name
            )
        first, second = ("ka", "kb") if name == "unmatched_inner" else ("m", "k")
        return {first: axes[:1], second: axes[1:]}
    return {}


@dataclass(frozen=True)
class MatMulShardingPolicy:
    """A named policy with its mesh axes per role (``k``, ``ka``/``kb``, ``m``, ``n``)."""

    name: str
    roles: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def named(cls, name: str, mesh: Any, **roles: Any) -> "MatMulShardingPolicy":
        """The policy ``name``; roles not given default to the mesh's axes (see ``_default_roles``)."""
        if name not in MATMUL_POLICIES:
            raise ShardingError(f"unknown MatMul policy {name!r}; expected one of {sorted(MATMUL_POLICIES)}",
                                policy=name)
        if not hasattr(mesh, "axis_names"):
            raise ShardingError(f"policy {name!r} needs a Mesh (for its axes), got {type(mesh).__name__} "
                                f"{mesh!r}", policy=name)
        needed = MATMUL_POLICIES[name][0]
        unknown = sorted(set(roles) - set(needed))
        if unknown:
            raise ShardingError(f"policy {name!r} takes roles {needed}, got unexpected {unknown}",
                                policy=name)
        full = _default_roles(name, tuple(mesh.axis_names)) if set(roles) != set(needed) else {}
        full.update(role_axes(name, roles))
        for role in needed:
            if not full.get(role):
                raise ShardingError(
                    f"policy {name!r}: role {role!r} needs at least one mesh axis, got {full.get(role)!r}"
                )
        full = check_roles(name, full, mesh, MATMUL_POLICIES[name][2], ("A", "B", "C"))
        if name == "unmatched_inner" and full["ka"] == full["kb"]:
            raise ShardingError(f"unmatched_inner: A's k and B's k are both sharded over {full['ka']}; "
                                "expected different axes (same axes: use matched_inner)", policy=name)
        return cls(name, tuple(sorted(full.items())))

    @classmethod
    def for_layouts(cls, a: Layout | str, b: Layout | str, name: str | None = None) -> "MatMulShardingPolicy":
        """The policy that takes A in layout ``a`` and B in ``b`` (text like ``"[R, S(x)]"`` is
        parsed); with ``name``, a ShardingError unless that policy is the one these layouts mean."""
        a, b = as_sharding(a).axes, as_sharding(b).axes
        found = infer_matmul_policy(a, b)  # (refuses layouts that are not 2-d)
        if name is None or name == found.name or (name == "row" and found.name == "matched_inner"):
            return found if name is None else cls(name, found.roles)
        if name in MATMUL_POLICIES:
            roles, _, axes_of = MATMUL_POLICIES[name]
            want = axes_of({role: ("K",) if role.startswith("k") else (role.upper(),) for role in roles})
            expected = f"A{format_layout(want[0])} B{format_layout(want[1])}"
        else:
            expected = f"one of {sorted(MATMUL_POLICIES)}"
        raise ShardingError(f"policy {name!r} expects {expected}; received A{format_layout(a)} "
                            f"B{format_layout(b)}, which is {found.name}", policy=name, a=format_layout(a),
                            b=format_layout(b))

    @property
    def role_axes(self) -> dict[str, tuple[str, ...]]:
        return dict(self.roles)

    def layouts(self) -> tuple[Layout, Layout, Layout]:
        """(A, B, C) layouts, as sharding specs."""
        return tuple(TensorSharding.from_axes(axes) for axes in MATMUL_POLICIES[self.name][2](self.role_axes))

    def check(self, m: int, k: int, n: int, mesh: Any) -> None:
        a, b, c = self.layouts()
        for label, lay, shape in (("A", a, (m, k)), ("B", b, (k, n)), ("C", c, (m, n))):
            check_layout(f"{label} ({self.name})", lay, shape, mesh)

    def forward(self, dev: Any, a: Any, b: Any) -> Any:
        """The per-device program (differentiable with autograd)."""
        return MATMUL_POLICIES[self.name][1](dev, a, b, self.role_axes)

    def __str__(self) -> str:
        a, b, c = self.layouts()
        return f"{self.name}: A{format_layout(a)} @ B{format_layout(b)} -> C{format_layout(c)}"

    def cost(self, m: int, k: int, n: int, mesh: Any, itemsize: int) -> PolicyCost:
        """The closed forms of the module docstring, for these shapes on ``mesh``."""
        r, s = self.role_axes, itemsize
        size = {role: axes_size(mesh, axes) for role, axes in r.items()}
        mnk = matmul_flops(m, k, n)  # the forward
        back = sum(matmul_backward_flops(m, k, n))  # the backward: dA = dC·Bᵀ and dB = Aᵀ·dC
        if self.name == "unsharded":
            return PolicyCost(PhaseCost((), mnk), PhaseCost((), back))
        if self.name in ("matched_inner", "row"):
            q = size["k"]
            return PolicyCost(
                PhaseCost((Collective("all_reduce", r["k"], reduce_bytes(m * n * s, q)),), mnk // q),
                PhaseCost((), back // q),
            )
        if self.name == "unmatched_inner":
            qa, qb = size["ka"], size["kb"]
            fwd = (Collective("all_gather", r["ka"], gather_bytes(m * (k // qa) * s, qa)),
                   Collective("all_gather", r["kb"], gather_bytes((k // qb) * n * s, qb)))
            return PolicyCost(PhaseCost(fwd, mnk), PhaseCost((), back))
        if self.name == "outer":
            p, q = size["m"], size["k"]
            fwd = (Collective("all_gather", r["k"], gather_bytes((m // p) * (k // q) * s, q)),
                   Collective("all_gather", r["k"], gather_bytes((k // q) * n * s, q)),
                   Collective("all_gather", r["m"], gather_bytes((m // p) * n * s, p)))
            bwd = (Collective("all_reduce", r["m"], reduce_bytes((k // q) * n * s, p)),)
            return PolicyCost(PhaseCost(fwd, mnk // p), PhaseCost(bwd, back // p))
        if self.name == "full":
            p, q = size["m"], size["k"]
            fwd = (Collective("all_gather", r["m"], gather_bytes((k // q) * (n // p) * s, p)),
                   Collective("all_reduce", r["k"], reduce_bytes((m // p) * n * s, q)))
            bwd = (Collective("reduce_scatter", r["m"], scatter_bytes((k // q) * n * s, p)),)
            return PolicyCost(PhaseCost(fwd, mnk // (p * q)), PhaseCost(bwd, back // (p * q)))
        t = size["n"]  # column
        return PolicyCost(
            PhaseCost((), mnk // t),
            PhaseCost((Collective("all_reduce", r["n"], reduce_bytes(m * k * s, t)),), back // t),
        )


def infer_matmul_policy(a: Layout | str | Axes, b: Layout | str | Axes) -> MatMulShardingPolicy:
    """The policy whose input layouts are ``a`` and ``b`` (specs, their text, or per-dim axes; see
    the module docstring)."""
    a, b = as_sharding(a).axes, as_sharding(b).axes
    if len(a) != 2 or len(b) != 2:
        raise ShardingError(f"a MatMul takes 2-d layouts for A (m, k) and B (k, n); got A{format_layout(a)} "
                            f"B{format_layout(b)}", a=format_layout(a), b=format_layout(b))
    (am, ak), (bk, bn) = a, b
    found: tuple[str, dict] | None = None
    if not (am or ak or bk or bn):
        found = ("unsharded", {})
    elif not am and ak and ak == bk and not bn:
        found = ("matched_inner", {"k": ak})
    elif not am and ak and bk and ak != bk and not bn:
        found = ("unmatched_inner", {"ka": ak, "kb": bk})
    elif am and ak and ak == bk and not bn:
        found = ("outer", {"m": am, "k": ak})
    elif am and ak and ak == bk and bn == am:
        found = ("full", {"m": am, "k": ak})
    elif not (am or ak or bk) and bn:
        found = ("column", {"n": bn})
    if found is None:
        raise ShardingError(
            f"no MatMul policy takes A{format_layout(a)} @ B{format_layout(b)}; expected one of: "
            "A[R, R] B[R, R] (unsharded); A[R, S(K)] B[S(K), R] (matched_inner); A[R, S(KA)] B[S(KB), R] "
            "(unmatched_inner); A[S(M), S(K)] B[S(K), R] (outer); A[S(M), S(K)] B[S(K), S(M)] (full); "
            "A[R, R] B[R, S(N)] (column)", a=format_layout(a), b=format_layout(b))
    return MatMulShardingPolicy(found[0], tuple(sorted(found[1].items())))


@dataclass(frozen=True)
class MatMul(ShardedLayer):
    """C = A·B under ``policy`` (a ``MatMulShardingPolicy``, or a policy's name whose axes come from the
    mesh it runs on): an operation, ``cluster.execute(MatMul("column"), a, b)``, with B resident after
    ``op.place(cluster, b=B)`` (:mod:`.layer_op`); and a layer for :mod:`.runner` (inputs A, B; output C)."""

    policy: MatMulShardingPolicy | str
    input_names = ("a", "b")

    def bind(self, mesh: Any) -> "MatMul":
        """This MatMul with a concrete policy for ``mesh`` (itself when it has one)."""
        if isinstance(self.policy, MatMulShardingPolicy):
            return self
        return MatMul(MatMulShardingPolicy.named(self.policy, mesh))

    def _policy(self) -> MatMulShardingPolicy:
        if isinstance(self.policy, MatMulShardingPolicy):
            return self.policy
        raise ShardingError(f"MatMul({self.policy!r}) takes its mesh axes from a mesh: run it with "
                            f"cluster.execute, or use MatMul({self.policy!r}).bind(mesh)", policy=self.policy)

    def output_shape(self, shapes: Any) -> tuple[int, int]:
        """(m, n) for A (m, k) and B (k, n); anything else is refused naming both shapes."""
        a, b = (tuple(s) for s in shapes)
        if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
            differ = f" (inner dimensions {a[1]} and {b[0]} differ)" if len(a) == len(b) == 2 else ""
            raise ShardingError(f"MatMul of A {a} @ B {b}: expected A (m, k) and B (k, n){differ}")
        return a[0], b[1]

    def input_layouts(self) -> tuple[Layout, Layout]:
        return self._policy().layouts()[:2]

    def output_layout(self) -> Layout:
        return self._policy().layouts()[2]

    def forward(self, dev: Any, a: Any, b: Any) -> Any:
        return self._policy().forward(dev, a, b)
