"""Transformer layers: ``MultiHeadAttention``, the ``MLP`` (GELU) and ``SwiGLU`` feed-forwards, and
the pre-norm ``TransformerBlock`` (GPT-2 / LLaMA).  Their backward comes from autograd.

Inputs and outputs are (batch, seq, d_model).  FLOPs are counted as 2 per multiply-add of the
matmuls, forward only (a backward costs twice its forward); d = d_model, s = the sequence length
(the keys a query sees, all of them: the causal half is masked, not skipped):

    attention  8·d² + 4·s·d  per token   (QKV 6·d², scores 2·s·d, P·V 2·s·d, output 2·d²)
    MLP        4·d·hidden    per token   (16·d² with hidden = 4·d)
    SwiGLU     6·d·hidden    per token   (gate, up and down)

**Head layout.**  The fused QKV projection ``qkv`` (d → 3d) orders its output columns head by head:
head j owns columns ``[3·j·hd, 3·(j+1)·hd)`` (hd = d / heads), laid out as ``[q_j | k_j | v_j]``.
So cutting the 3d columns into ``tp`` equal contiguous groups hands each group whole heads (heads
``c·heads/tp …``), with their q, k and v: a column-parallel split of ``qkv`` needs no reshuffle (the
layout of Megatron-LM's fused QKV).  The output projection ``out`` (d → d) reads its input rows in
head order (head j is rows ``[j·hd, (j+1)·hd)``), so a row-parallel split hands out the same heads.
"""

from __future__ import annotations

from typing import Any

import autograd.numpy as anp
import numpy as np

from ..errors import UsageError
from ..kernels import matmul_flops
from .activations import gelu, tanh
from .attention import merge_heads, scaled_dot_product_attention
from .dropout import DropoutMasks, check_rate, dropout
from .init import check_dtype, check_size
from .layers import Linear
from .module import Module, check_input
from .norm import LayerNorm, RMSNorm
from .recompute import recomputed

__all__ = ["MultiHeadAttention", "MLP", "SwiGLU", "TransformerBlock", "qkv_heads", "swiglu_hidden", "silu",
           "swiglu"]


def _seeds(seed: int, n: int) -> list[int]:
    """``n`` independent seeds derived from one (each sub-layer starts differently, reproducibly)."""
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(n)]


def qkv_heads(qkv: Any, n_heads: int) -> tuple[Any, Any, Any]:
    """The fused projection's output (batch, seq, 3·heads·hd) → q, k, v, each (batch, heads, seq, hd),
    with the head-major ``[q_j | k_j | v_j]`` column layout described in the module docstring.  A
    tensor-parallel shard holding heads/tp whole heads calls it with its own head count."""
    b, s, width = np.shape(qkv)
    if width % (3 * n_heads):
        raise UsageError(f"qkv_heads: {width} columns do not split into 3 x {n_heads} heads")
    hd = width // (3 * n_heads)
    grouped = anp.transpose(anp.reshape(qkv, (b, s, n_heads, 3, hd)), (3, 0, 2, 1, 4))
    # split, not grouped[0]: an integer index's backward is a np.add.at (0.6 s of a 5 s step)
    q, k, v = (anp.reshape(part, (b, n_heads, s, hd)) for part in anp.split(grouped, 3, axis=0))
    return q, k, v


class MultiHeadAttention(Module):
    """Causal (by default) multi-head self-attention: ``out(attention(qkv(x)))``.

    ``qkv``: Linear(d, 3d) with the head-major layout above; ``out``: Linear(d, d).  Forward cost
    per token 8·d² + 4·s·d FLOPs (a sequence: 8·s·d² + 4·s²·d)."""

    def __init__(self, d_model: int, n_heads: int, causal: bool = True, bias: bool = True, seed: int = 0,
                 dtype: Any = np.float32) -> None:
        dt = check_dtype("MultiHeadAttention", dtype)
        self.d_model = check_size("MultiHeadAttention", "d_model", d_model, least=1)
        self.n_heads = check_size("MultiHeadAttention", "n_heads", n_heads, least=1)
        if d_model % n_heads:
            raise UsageError(f"MultiHeadAttention: d_model={d_model} is not divisible by n_heads={n_heads}")
        self.head_dim = d_model // n_heads
        self.causal = bool(causal)
        s_qkv, s_out = _seeds(seed, 2)
        self.qkv = Linear(d_model, 3 * d_model, bias=bias, seed=s_qkv, dtype=dt)
        self.out = Linear(d_model, d_model, bias=bias, seed=s_out, dtype=dt)

    def forward(self, x: Any, drop: DropoutMasks | None = None) -> Any:
        """``drop``: where this layer's dropout masks come from (:class:`.dropout.DropoutMasks`), or None."""
        check_input(self, x, self.d_model)
        if len(np.shape(x)) != 3:
            raise UsageError(f"{self!r}: expected input (batch, seq, {self.d_model}), got shape "
                             f"{np.shape(x)}")
        q, k, v = qkv_heads(self.qkv(x), self.n_heads)
        keep = None if drop is None else drop.attention(np.shape(q)[:3] + np.shape(k)[2:3])
        o = scaled_dot_product_attention(q, k, v, self.causal, keep, drop.p if drop is not None else 0.0)
        return self.out(merge_heads(o))

    def flops_per_token(self, seq: int) -> float:
        """Forward FLOPs per token at sequence length ``seq``: 8·d² + 4·seq·d — the Q, K, V and
        output projections (four d×d matmuls) and the scores q·Kᵀ and their weighted sum of V."""
        d = self.d_model
        return float(4 * matmul_flops(1, d, d) + matmul_flops(1, d, seq) + matmul_flops(1, seq, d))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal}"


class MLP(Module):
    """``down(gelu(up(x)))``, hidden 4·d by default (GPT-2).  Forward 4·d·hidden FLOPs per token.
    ``up`` is column-parallel and ``down`` row-parallel under Megatron's split."""

    def __init__(self, d_model: int, hidden: int | None = None, approximate: str = "tanh", bias: bool = True,
                 seed: int = 0, dtype: Any = np.float32) -> None:
        dt = check_dtype("MLP", dtype)
        self.d_model = check_size("MLP", "d_model", d_model, least=1)
        self.hidden = check_size("MLP", "hidden", 4 * d_model if hidden is None else hidden, least=1)
        if approximate not in ("none", "tanh"):
            raise UsageError(f"MLP: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate
        s_up, s_down = _seeds(seed, 2)
        self.up = Linear(d_model, self.hidden, bias=bias, seed=s_up, dtype=dt)
        self.down = Linear(self.hidden, d_model, bias=bias, seed=s_down, dtype=dt)

    def forward(self, x: Any) -> Any:
        return self.down(gelu(self.up(x), self.approximate))

    def flops_per_token(self, seq: int = 0) -> float:
        """Forward FLOPs per token: 4·d·hidden, two matmuls (``seq`` is ignored: a per-token layer)."""
        d, h = self.d_model, self.hidden
        return float(matmul_flops(1, d, h) + matmul_flops(1, h, d))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, hidden={self.hidden}, gelu={self.approximate!r}"


def swiglu_hidden(d_model: int) -> int:
    """SwiGLU's default hidden size: ⅔·4·d (as many parameters as a 4·d GELU MLP, LLaMA), rounded
    up to a multiple of 8 so that it splits over tensor-parallel degrees up to 8."""
    return 8 * -(-8 * d_model // 24)


def silu(x: Any) -> Any:
    """``x·σ(x)`` (swish), with σ through tanh so that nothing overflows, forward or backward."""
    return x * (0.5 * (tanh(0.5 * x) + 1.0))


def swiglu(gate: Any, up: Any) -> Any:
    """SwiGLU's activation ``silu(gate) ⊙ up``."""
    return silu(gate) * up


class SwiGLU(Module):
    """``down(silu(gate(x)) ⊙ up(x))`` (Shazeer 2020; LLaMA), no biases by default.  Forward
    6·d·hidden FLOPs per token; ``gate`` and ``up`` are column-parallel, ``down`` row-parallel."""

    def __init__(self, d_model: int, hidden: int | None = None, bias: bool = False, seed: int = 0,
                 dtype: Any = np.float32) -> None:
        dt = check_dtype("SwiGLU", dtype)
        self.d_model = check_size("SwiGLU", "d_model", d_model, least=1)
        hidden = swiglu_hidden(d_model) if hidden is None else hidden
        self.hidden = check_size("SwiGLU", "hidden", hidden, least=1)
        s_gate, s_up, s_down = _seeds(seed, 3)
        self.gate = Linear(d_model, self.hidden, bias=bias, seed=s_gate, dtype=dt)
        self.up = Linear(d_model, self.hidden, bias=bias, seed=s_up, dtype=dt)
        self.down = Linear(self.hidden, d_model, bias=bias, seed=s_down, dtype=dt)

    def forward(self, x: Any) -> Any:
        return self.down(recomputed(swiglu, self.gate(x), self.up(x)))

    def flops_per_token(self, seq: int = 0) -> float:
        """Forward FLOPs per token: 6·d·hidden, three matmuls (gate, up, down)."""
        d, h = self.d_model, self.hidden
        return float(2 * matmul_flops(1, d, h) + matmul_flops(1, h, d))

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, hidden={self.hidden}"


NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}
MLPS = {"gelu": MLP, "swiglu": SwiGLU}


def _choice(where: str, name: str, value: Any, table: dict[str, Any]) -> Any:
    if value not in table:
        raise UsageError(f"{where}: {name} must be one of {sorted(table)}, got {value!r}")
    return table[value]


class TransformerBlock(Module):
    """Pre-norm block: ``x = x + drop(attn(norm1(x))); x = x + drop(mlp(norm2(x)))``.

    ``mlp``: ``"gelu"`` (:class:`MLP`) or ``"swiglu"``; ``norm``: ``"layernorm"`` or ``"rmsnorm"``;
    ``dropout``: the rate of Megatron's three dropouts — the attention probabilities and the two
    outputs before their residual adds — drawn only when the forward is given a
    :class:`.dropout.DropoutMasks` (the GPT gives one when it is given the training step).
    Forward FLOPs per token: attention's 8·d² + 4·s·d plus the MLP's (16·d² for GELU with hidden 4d),
    the norms and residuals O(d)."""

    def __init__(self, d_model: int, n_heads: int, mlp: str = "gelu", norm: str = "layernorm",
                 causal: bool = True, hidden: int | None = None, seed: int = 0,
                 dtype: Any = np.float32, dropout: float = 0.0) -> None:
        mlp_cls = _choice("TransformerBlock", "mlp", mlp, MLPS)
        self.dropout = check_rate("TransformerBlock", dropout)
        norm_cls = _choice("TransformerBlock", "norm", norm, NORMS)
        self.d_model = check_size("TransformerBlock", "d_model", d_model, least=1)
        self.mlp_kind, self.norm_kind = mlp, norm
        s_attn, s_mlp = _seeds(seed, 2)
        self.norm1 = norm_cls(d_model, dtype=dtype)
        self.attn = MultiHeadAttention(d_model, n_heads, causal=causal, seed=s_attn, dtype=dtype)
        self.norm2 = norm_cls(d_model, dtype=dtype)
        self.mlp = mlp_cls(d_model, hidden, seed=s_mlp, dtype=dtype)

    def forward(self, x: Any, drop: DropoutMasks | None = None) -> Any:
        if drop is None:
            x = x + self.attn(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        a = self.attn(self.norm1(x), drop)
        x = x + dropout(a, drop.hidden(2, np.shape(a)), drop.p)
        m = self.mlp(self.norm2(x))
        return x + dropout(m, drop.hidden(3, np.shape(m)), drop.p)

    def flops_per_token(self, seq: int) -> float:
        """Forward matmul FLOPs per token at sequence length ``seq`` (attention + MLP)."""
        return self.attn.flops_per_token(seq) + self.mlp.flops_per_token(seq)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.attn.n_heads}, mlp={self.mlp_kind!r}, "
                f"norm={self.norm_kind!r}, causal={self.attn.causal}"
                + (f", dropout={self.dropout}" if self.dropout else ""))
