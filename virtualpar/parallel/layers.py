"""The GPT's layers written once over the differentiable collectives; the layouts decide the sharding.

Each function runs on one device with its local shards (see :mod:`.layout`) and ``autograd.numpy``;
its backward, and the backward's communication, come from autograd and the collectives' vjps
(:mod:`virtualpar.tensor_parallel.autodiff`).  With tp = cp = 1 every collective is skipped and
the functions compute exactly ``nn.GPT``'s forward.

Activations between blocks are (batch, s_local, d): s_local = S/cp, or S/(cp·tp) under sequence
parallelism.  Megatron's regions (Shoeybi 2019; Korthikanti 2022), per block::

    no SP:  x ─norm─ f ─[QKV col | attn | out row]─ g ─+─norm─ f ─[up col | act | down row]─ g ─+
    SP:     x ─norm─ all_gather(seq) ─[...]─ reduce_scatter(seq) ─+─norm─ all_gather ─[...]─ reduce_scatter ─+

Bytes per block per microbatch: 4 all-reduces of b·s·h (2 forward, 2 backward), or with SP 4
all-gathers and 4 reduce-scatters of b·s·h/tp pieces — the same bytes on a ring — plus the 2
all-gathers the gathered linears repeat in the backward so as to keep only the shard (:mod:`.sp`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import autograd.numpy as anp
import numpy as np
from autograd.extend import notrace_primitive

from .. import nn
from ..nn.activations import gelu
from ..nn.dropout import layer_key
from ..nn.layers import affine
from ..nn.recompute import recomputed
from ..nn.transformer import qkv_heads, swiglu
from ..tensor_parallel import autodiff as ad
from .ring import ring_attention
from .sp import gathered_affine
from .zero import ring

__all__ = ["Ctx", "embed", "block", "final_loss"]


@dataclass
class Ctx:
    """What a device's layers need to know: the device, the degrees and this device's coordinates."""

    dev: Any
    tp: int
    cp: int
    sp: bool
    skeleton: Any  # the model with empty parameters: its norms' forward and its flags
    block_flops: float = 0.0  # one block's forward FLOPs per batch row on this device (recompute's charge)
    step: int | None = None  # the training step (dropout's masks); None: no dropout
    row0: int = 0  # the global batch row of this microbatch's first row
    batch: int = 0  # rows of the global batch

    @property
    def tp_rank(self) -> int:
        return self.dev.group_rank("tp") if self.tp > 1 else 0

    @property
    def cp_rank(self) -> int:
        return self.dev.group_rank("cp") if self.cp > 1 else 0

    # the collectives, skipped on a group of one
    def enter(self, x: Any) -> Any:
        """Into a tensor-parallel region: f (no SP) or all_gather along the sequence (SP)."""
        if self.tp == 1:
            return x
        return ad.all_gather(x, self.dev, 1, "tp") if self.sp else ad.f(x, self.dev, "tp")

    def linear_in(self, h: Any, weights: list[tuple[Any, Any]]) -> list[Any]:
        """Column-parallel linears reading ``h``: after f (no SP), or through one gathered linear that
        keeps only the sequence shard for the backward (SP, :mod:`.sp`); several weights reading
        the same input (SwiGLU's gate and up) share one gather."""
        if not (self.sp and self.tp > 1):
            h = self.enter(h)
            return [affine(h, w, b) for w, b in weights]
        if len(weights) == 1:
            return [gathered_affine(h, weights[0][0], weights[0][1], self.dev)]
        w = anp.concatenate([w for w, _ in weights], axis=1)
        b = None if any(b is None for _, b in weights) else anp.concatenate([b for _, b in weights])
        widths = np.cumsum([np.shape(w)[1] for w, _ in weights])[:-1]
        return anp.split(gathered_affine(h, w, b, self.dev), widths, axis=-1)

    def dropout(self, index: int, s_local: int) -> nn.DropoutMasks | None:
        """Block ``index``'s dropout masks for this device's piece (:mod:`virtualpar.nn.dropout`): its
        rows, its hidden positions (the cp chunk, its tp part under SP), its queries and its heads."""
        model = self.skeleton
        if self.step is None or not model.dropout:
            return None
        s_cp = s_local * self.tp if self.sp else s_local
        q0 = self.cp_rank * s_cp
        heads = model.n_heads // self.tp
        pos0 = q0 + (self.tp_rank * s_local if self.sp else 0)
        key = layer_key(model.seed, self.step, index)
        return nn.DropoutMasks(model.dropout, key, self.batch, s_cp * self.cp, model.n_heads, model.d_model,
                               self.row0, pos0, q0, self.tp_rank * heads)

    def leave(self, x: Any) -> Any:
        """Out of a tensor-parallel region: g (no SP) or reduce_scatter along the sequence (SP)."""
        if self.tp == 1:
            return x
        return ad.reduce_scatter(x, self.dev, 1, "tp") if self.sp else ad.g(x, self.dev, "tp")


def _norm(module: Any, P: dict, prefix: str, x: Any) -> Any:
    names = [k for k, _ in module.named_parameters()]
    return nn.functional_call(module, {k: P[prefix + k] for k in names}, x)


def embed(c: Ctx, P: dict, tokens: np.ndarray) -> Any:
    """Vocabulary-parallel token embedding plus position embedding → (batch, s_local, d).

    Each tp rank looks up the ids in its vocabulary slice (zeros elsewhere); g sums the pieces (SP:
    reduce_scatter along the sequence).  Positions are global: cp rank r holds S/cp tokens from
    r·S/cp, and under SP tp rank t a 1/tp of them."""
    W = P["tok_emb.weight"]
    if c.tp > 1:
        rows = np.shape(W)[0]
        v0 = c.tp_rank * rows
        mine = (tokens >= v0) & (tokens < v0 + rows)
        e = c.leave(nn.rows_of(W, np.where(mine, tokens - v0, -1)))  # -1: another rank's id, a zero row
    else:
        e = nn.rows_of(W, tokens)
    s_cp = np.shape(tokens)[1]
    s_loc = np.shape(e)[1]
    start = c.cp_rank * s_cp + (c.tp_rank * s_loc if c.sp else 0)
    return e + P["pos_emb.weight"][np.arange(start, start + s_loc)]


def block(c: Ctx, P: dict, index: int, x: Any) -> Any:
    """Pre-norm transformer block ``index`` on this device's shards (see the module diagram)."""
    mod = c.skeleton.blocks[index]
    p = f"blocks.{index}."
    heads = mod.attn.n_heads // c.tp
    drop = c.dropout(index, np.shape(x)[1])
    h = _norm(mod.norm1, P, p + "norm1.", x)
    q, k, v = qkv_heads(c.linear_in(h, [(P[p + "attn.qkv.weight"], P.get(p + "attn.qkv.bias"))])[0], heads)
    if c.cp > 1:
        o = ring_attention(c.dev, q, k, v, mod.attn.causal, drop)
    else:
        keep = None if drop is None else drop.attention(np.shape(q)[:3] + np.shape(k)[2:3])
        o = nn.scaled_dot_product_attention(q, k, v, mod.attn.causal, keep, drop.p if drop else 0.0)
    y = c.leave(affine(nn.merge_heads(o), P[p + "attn.out.weight"], None))
    if p + "attn.out.bias" in P:
        y = y + P[p + "attn.out.bias"]
    if drop is not None:
        y = nn.dropout(y, drop.hidden(2, np.shape(y)), drop.p)
    x = x + y
    h = _norm(mod.norm2, P, p + "norm2.", x)
    up = (P[p + "mlp.up.weight"], P.get(p + "mlp.up.bias"))
    if mod.mlp_kind == "swiglu":
        gate, up = c.linear_in(h, [(P[p + "mlp.gate.weight"], P.get(p + "mlp.gate.bias")), up])
        a = recomputed(swiglu, gate, up)
    else:
        a = gelu(c.linear_in(h, [up])[0], mod.mlp.approximate)
    y = c.leave(affine(a, P[p + "mlp.down.weight"], None))
    if p + "mlp.down.bias" in P:
        y = y + P[p + "mlp.down.bias"]
    if drop is not None:
        y = nn.dropout(y, drop.hidden(3, np.shape(y)), drop.p)
    return x + y


@notrace_primitive
def _row_max(z: np.ndarray, dev: Any, tp: int) -> np.ndarray:
    """The max over the whole vocabulary (a constant to autograd: the log-softmax does not depend on it)."""
    m = np.max(z, axis=-1, keepdims=True)
    return dev.all_reduce(m, op="max", group="tp", algorithm=ring(m)) if tp > 1 else m


def final_loss(c: Ctx, P: dict, x: Any, targets: np.ndarray) -> Any:
    """Final norm, vocabulary-parallel head and cross-entropy; the logits (b, s, V/tp) are never gathered.

    ``loss = Σ_tokens (log Σ_v exp z_v − z_target) / (b·S)`` with z = logits − max: the max, the sum
    of exponentials and the target's logit are each reduced over tp (max: a constant; the sums
    through g), then over cp through g, so the loss is invariant over tp and cp and each device's
    backward gives its own tokens' contribution."""
    W = P["head.weight"] if "head.weight" in P else anp.transpose(P["tok_emb.weight"])
    z = c.linear_in(_norm(c.skeleton.norm, P, "norm.", x), [(W, None)])[0]
    z = z - _row_max(z, c.dev, c.tp)
    sumexp = anp.sum(anp.exp(z), axis=-1)
    vl = np.shape(z)[-1]
    if c.tp > 1:
        v0 = c.tp_rank * vl
        mine = (targets >= v0) & (targets < v0 + vl)
        picked = nn.pick(z, np.where(mine, targets - v0, -1))  # -1: another rank's class, 0
        sumexp, picked = ad.g(sumexp, c.dev, "tp"), ad.g(picked, c.dev, "tp")
    else:
        picked = nn.pick(z, targets)
    loss = anp.sum(anp.log(sumexp) - picked) / (np.size(targets) * c.cp)
    if c.cp > 1:  # a 1-vector through the collective: the runtime reduces arrays, not scalars
        loss = anp.sum(ad.g(anp.reshape(loss, (1,)), c.dev, "cp"))
    return loss
