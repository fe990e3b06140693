"""Tensor parallelism: MatMul and FeedForward sharding policies, forward and backward.

Layers are per-device programs written with the differentiable collectives of :mod:`.autodiff`;
their backward is autograd's vjp of the forward, so its collectives follow from the forward's.

``MatMul`` and ``FeedForward`` are operations: ``cluster.execute(MatMul("matched_inner"), a, b)``
runs any policy with the shapes of its inputs, and ``op.place(cluster, b=B)`` keeps weights on the
devices.  Their layouts are the sharding package's ``TensorSharding`` specs (``[R, S(x)]``); shard,
unshard and the spec parser are that package's.

Modules: ``autodiff`` (differentiable collectives and charged kernels, the cotangent convention),
``layout`` (policies' roles and shape checks over sharding specs), ``costs`` (closed-form
collectives/FLOPs), ``matmul`` and ``ffn`` (the policies and the two operations), ``layer_op`` (a
layer run as an operation, resident inputs), ``runner`` (forward now, backward later, measured),
``execute`` (the forward on a cluster; ``TensorParallelOp``, the form with declared shapes),
``explore`` / ``explore_ffn`` (every assignment of mesh axes, ``policy="auto"``), ``table`` (the
``virtualpar policies`` rows).

Accuracy (tests/test_tp_*.py): outputs and gradients equal numpy's to ≤ 1e-12 relative
(max |error| / max |reference|) in float64 and ≤ 2e-6 in float32 at the test shapes (k ≤ 48);
the policy table calls float32 correct at ≤ 1e-5 (k up to 4096).
"""

from __future__ import annotations

from .explore import choose, explore
from .explore_ffn import choose_ffn, explore_ffn
from .ffn import FFN_POLICIES, FeedForward, FeedForwardShardingPolicy
from .matmul import MATMUL_POLICIES, MatMul, MatMulShardingPolicy, infer_matmul_policy

__all__ = ["FFN_POLICIES", "FeedForward", "FeedForwardShardingPolicy", "MATMUL_POLICIES", "MatMul",
           "MatMulShardingPolicy", "infer_matmul_policy", "explore", "choose", "explore_ffn", "choose_ffn"]
