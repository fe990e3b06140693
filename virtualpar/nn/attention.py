"""Scaled dot-product attention as pure functions, whole and blockwise (online softmax).

Shapes: ``q`` (batch, heads, s_q, head_dim), ``k`` and ``v`` (batch, heads, s_k, head_dim), output
(batch, heads, s_q, head_dim); every function is written with ``autograd.numpy``, so its backward
comes from autograd (no hand-written gradient).  With ``causal``, the query at global position
``i`` sees the keys at positions ``j <= i``::

    S = q kᵀ / √head_dim,   S_ij = −∞ where j > i,   out = softmax_j(S) v

Cost, per (batch, head): ``q kᵀ`` is 2·s_q·s_k·head_dim FLOPs and ``P v`` as much, so over the
``heads`` (heads·head_dim = d) one query costs **4·s_k·d** FLOPs forward, a sequence 4·s²·d (the
masked half is computed too; the backward is twice the forward).

**Blockwise** (Milakov & Gimelshein 2018; FlashAttention; ring attention, Liu et al. 2023): keys
and values come in blocks, and a state ``(m, l, o)`` per query row keeps the running max of the
scores, the running sum of ``exp(S − m)`` and the running unnormalised output::

    m' = max(m, rowmax S_blk);   α = exp(m − m');   P = exp(S_blk − m')
    l' = α·l + rowsum P;         o' = α·o + P v_blk;            out = o / l

Blocks combine in any order and any split (:func:`merge_attention_states` combines two partial
states, as the two halves of a ring would).  The max is a constant to autograd (a stop-gradient):
``o / l`` does not depend on it, so the gradient of the output is exact without differentiating it.
A masked score is set to a large finite negative, not −∞, so a block in which a query sees no key
gives finite garbage that the next block's ``α = exp(−1e30 − m') = 0`` erases; every query must
see at least one key in all (true of causal self-attention, which sees itself).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import autograd.numpy as anp
import numpy as np
from autograd.extend import defvjp, notrace_primitive, primitive

from ..errors import UsageError
from .dropout import dropout
from .recompute import recomputed

__all__ = ["AttentionState", "scaled_dot_product_attention", "attention_block_update", "attention_init",
           "attention_finish", "merge_attention_states", "causal_mask", "split_heads", "merge_heads"]

MASKED = -1e30  # finite: exp(MASKED − m) underflows to exactly 0 in float32 and float64, never NaN


class AttentionState(NamedTuple):
    """Running online-softmax state per query row: ``m`` and ``l`` (batch, heads, s_q, 1), ``o``
    (batch, heads, s_q, head_dim)."""

    m: Any
    l: Any  # noqa: E741 - the paper's name
    o: Any


@notrace_primitive
def _row_max(s: np.ndarray) -> np.ndarray:
    return np.max(s, axis=-1, keepdims=True)


def causal_mask(s_q: int, s_k: int, q_start: int = 0, k_start: int = 0) -> np.ndarray:
    """``mask[i, j]`` True where query ``q_start + i`` may see key ``k_start + j`` (``j <= i`` globally)."""
    return (k_start + np.arange(s_k))[None, :] <= (q_start + np.arange(s_q))[:, None]


def _check(q: Any, k: Any, v: Any, where: str) -> None:
    qs, ks, vs = np.shape(q), np.shape(k), np.shape(v)
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise UsageError(f"{where}: q, k, v must be (batch, heads, seq, head_dim), got shapes {qs}, {ks}, "
                         f"{vs}")
    if ks != vs or qs[:2] != ks[:2] or qs[3] != ks[3]:
        want = qs[:2] + ("s_k", qs[3])
        raise UsageError(f"{where}: q {qs} needs k and v of shape {want}, got {ks} and {vs}")


def _scores(q: Any, k: Any, causal: bool, q_start: int, k_start: int) -> Any:
    s = anp.matmul(q, anp.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(np.shape(q)[-1]))
    if causal:
        s = anp.where(causal_mask(np.shape(q)[2], np.shape(k)[2], q_start, k_start), s, MASKED)
    return s


def _softmax(s: Any, causal: bool) -> Any:
    """softmax over the last dim of the scores ``s``, the causal mask applied first."""
    if causal:
        s = anp.where(causal_mask(np.shape(s)[2], np.shape(s)[3]), s, MASKED)
    p = anp.exp(s - _row_max(s))
    return p / anp.sum(p, axis=-1, keepdims=True)


def scaled_dot_product_attention(q: Any, k: Any, v: Any, causal: bool = True, keep: Any = None,
                                 p: float = 0.0) -> Any:
    """``softmax(q kᵀ / √head_dim) v`` over the whole key sequence; with ``causal``, q and k cover the
    same positions (s_q == s_k) and query i sees keys 0..i.  Cost: 4·s_q·s_k·head_dim FLOPs per
    (batch, head) forward.

    Kept for the backward: q and k (by the scores' matmul), the scores (the softmax keeps its input
    and normalises again in the backward, :mod:`.recompute`), the probabilities and v (by P·V) —
    Megatron-LM's tensors (Korthikanti et al. 2022).  With a dropout mask ``keep`` (batch, heads,
    s_q, s_k) and rate ``p``, the probabilities are dropped (:mod:`.dropout`): the mask is kept too,
    and P·V keeps the dropped probabilities instead."""
    _check(q, k, v, "scaled_dot_product_attention")
    if causal and np.shape(q)[2] != np.shape(k)[2]:
        raise UsageError(f"scaled_dot_product_attention: causal needs as many queries as keys, got s_q="
                         f"{np.shape(q)[2]}, s_k={np.shape(k)[2]}; use attention_block_update with q_start, "
                         f"k_start")
    s = anp.matmul(q, anp.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(np.shape(q)[-1]))
    probs = recomputed(functools.partial(_softmax, causal=bool(causal)), s)
    if keep is not None:
        probs = dropout(probs, keep, p)
    return anp.matmul(probs, v)


def attention_init(q: Any) -> AttentionState:
    """The state before any key block: m = −∞, l = 0, o = 0 (shapes from ``q``, its dtype)."""
    b, h, s, d = np.shape(q)
    dt = np.asarray(q).dtype if not hasattr(q, "dtype") else q.dtype
    return AttentionState(np.full((b, h, s, 1), -np.inf, dt), np.zeros((b, h, s, 1), dt),
                          np.zeros((b, h, s, d), dt))


def attention_block_update(state: AttentionState, q: Any, k_block: Any, v_block: Any, causal: bool = True,
                           q_start: int = 0, k_start: int = 0, keep: Any = None,
                           p: float = 0.0) -> AttentionState:
    """Fold one key/value block into ``state`` (see the module's equations).

    ``q_start`` and ``k_start`` are the global positions of the first query and the first key of the
    block: the causal mask compares global positions, so a block wholly in a query's past is
    unmasked, one wholly in its future contributes nothing.  With a dropout mask ``keep`` of the
    block's probabilities and rate ``p``, ``o`` gathers the dropped unnormalised probabilities while
    ``l`` sums them all, so ``o / l`` is dropout(softmax) · V.  Cost: 4·s_q·s_blk·head_dim FLOPs per
    (batch, head), plus O(s_q·(s_blk + head_dim)) elementwise."""
    _check(q, k_block, v_block, "attention_block_update")
    m_old = _plain(state.m)
    s = _scores(q, k_block, causal, q_start, k_start)
    m_new = np.maximum(m_old, _row_max(s))  # plain arrays: the max is a stop-gradient
    alpha = np.exp(m_old - m_new)  # exp(−∞) = 0 on the first block
    e = anp.exp(s - m_new)
    l_new = alpha * state.l + anp.sum(e, axis=-1, keepdims=True)
    if keep is not None:
        e = dropout(e, keep, p)
    return AttentionState(m_new, l_new, alpha * state.o + anp.matmul(e, v_block))


def merge_attention_states(a: AttentionState, b: AttentionState) -> AttentionState:
    """Two partial states of the same queries over disjoint key sets → the state over their union."""
    m = np.maximum(_plain(a.m), _plain(b.m))
    wa, wb = np.exp(_plain(a.m) - m), np.exp(_plain(b.m) - m)
    return AttentionState(m, wa * a.l + wb * b.l, wa * a.o + wb * b.o)


_plain = notrace_primitive(lambda x: x)


def attention_finish(state: AttentionState) -> Any:
    """The attention output ``o / l`` (batch, heads, s_q, head_dim)."""
    return state.o / state.l


def split_heads(x: Any, n_heads: int) -> Any:
    """(batch, seq, heads·head_dim) → (batch, heads, seq, head_dim): head j is columns j·head_dim…"""
    b, s, d = np.shape(x)
    return anp.transpose(anp.reshape(x, (b, s, n_heads, d // n_heads)), (0, 2, 1, 3))


@primitive
def merge_heads(x: np.ndarray) -> np.ndarray:
    """(batch, heads, seq, head_dim) → (batch, seq, heads·head_dim), the inverse of :func:`split_heads`.

    A primitive whose backward is :func:`split_heads` of the gradient: autograd's own reshape keeps
    its input for the backward (for its shape), which would keep the attention's output beside
    the merged copy the output projection keeps."""
    b, h, s, d = np.shape(x)
    return np.reshape(np.transpose(x, (0, 2, 1, 3)), (b, s, h * d))


def _merge_heads_vjp(ans: np.ndarray, x: np.ndarray) -> Any:
    heads = np.shape(x)[1]
    return lambda g: split_heads(g, heads)


defvjp(merge_heads, _merge_heads_vjp)
