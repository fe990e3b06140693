"""``GPT``: a decoder-only transformer language model (Radford et al. 2019), and its presets.

``model(tokens)``: integer tokens (batch, seq ≤ seq_len) → logits (batch, seq, vocab)::

    x = tok_emb(tokens) + pos_emb(0 … seq−1)
    x = blocks.0(x) … blocks.{n_layers−1}(x)        pre-norm TransformerBlocks, causal
    logits = head(norm(x))                          head: d → vocab (tied: x · tok_embᵀ)

The training loss is ``nn.cross_entropy(logits, targets)``, the mean over every token.
Parameters: 2 embeddings (vocab·d + seq_len·d), per block 12·d² + 13·d with the GELU MLP, and
the head (d·vocab unless tied).  Forward FLOPs per token: n_layers·(24·d² + 4·s·d) + 2·d·vocab
(GELU MLP, hidden 4d; see :meth:`GPT.flops_per_token`), a training step about three times that.

``state_dict`` keys: ``tok_emb.weight``, ``pos_emb.weight``, ``blocks.{i}.norm1.weight``,
``blocks.{i}.attn.qkv.weight``, …, ``norm.weight``, ``head.weight``; with ``tie_embeddings`` the
head holds the token embedding, whose one array is listed again as ``head.embedding.weight``.
"""

from __future__ import annotations

from typing import Any

import autograd.numpy as anp
import numpy as np

from ..errors import UsageError
from ..kernels import matmul_flops
from .dropout import DropoutMasks, check_rate, layer_key
from .init import check_dtype, check_size
from .layers import Embedding, Linear, Sequential, affine
from .module import Module, check_input
from .transformer import NORMS, TransformerBlock, _choice, _seeds

__all__ = ["GPT", "LMHead", "PRESETS"]

PRESETS: dict[str, dict[str, Any]] = {
    # vocab 256 (bytes), small enough for float64 finite differences and second-long test runs
    "tiny": dict(vocab=256, d_model=64, n_layers=4, n_heads=4, seq_len=32),
    # 7.4 M parameters; a training step of 3·flops_per_token = 44 MFLOP per token, 45 GFLOP for a
    # (8, 128) batch.  Measured on this 2-core machine, idle, 2026-12-07 (`virtualpar train --model
    # small`: dp=2, pp=2, tp=2, 4 microbatches, 1F1B, ZeRO-1, float32, AdamW): 1.42k tokens/s, i.e.
    # 0.72 s a step of the (8, 128) batch on 8 devices, the first 1.08 s (placement, warm-up); under
    # other jobs' load (load average 6-10) steps took 3-6 s.
    "small": dict(vocab=2048, d_model=256, n_layers=8, n_heads=8, seq_len=128),
}


class LMHead(Module):
    """``x @ weight`` (d → vocab, no bias), or with ``embedding`` given, ``x @ embedding.weightᵀ``
    (tied).  Forward 2·d·vocab FLOPs per token."""

    def __init__(self, d_model: int, vocab: int, embedding: Embedding | None = None, seed: int = 0,
                 dtype: Any = np.float32) -> None:
        self.d_model, self.vocab = d_model, vocab
        if embedding is None:
            self.weight = Linear(d_model, vocab, bias=False, seed=seed, dtype=dtype).weight
        else:
            self.embedding = embedding

    def forward(self, x: Any) -> Any:
        check_input(self, x, self.d_model)
        if "embedding" in self.__dict__:
            return affine(x, anp.transpose(self.embedding.weight), None)
        return affine(x, self.weight, None)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, vocab={self.vocab}, tied={'embedding' in self.__dict__}"


class GPT(Module):
    """Token + position embeddings (N(0, 0.02²)), ``n_layers`` pre-norm causal blocks in ``blocks``
    (a ``Sequential``: ``model.blocks[i]``), a final ``norm`` and the LM ``head``.

    ``dropout``: the blocks' rate (Megatron's three sites per block, :mod:`.dropout`).  Masks are
    drawn from (``seed``, the training step, the layer, the position), so ``model(tokens, step=k)``
    drops the same elements in one process as over any mesh; ``model(tokens)`` drops nothing."""

    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, seq_len: int, seed: int = 0,
                 dtype: Any = np.float32, tie_embeddings: bool = False, mlp: str = "gelu",
                 norm: str = "layernorm", dropout: float = 0.0) -> None:
        dt = check_dtype("GPT", dtype)
        self.dropout = check_rate("GPT", dropout)
        self.seed = int(seed)
        self.vocab = check_size("GPT", "vocab", vocab, least=1)
        self.d_model = check_size("GPT", "d_model", d_model, least=1)
        self.n_layers = check_size("GPT", "n_layers", n_layers, least=1)
        self.n_heads = check_size("GPT", "n_heads", n_heads, least=1)
        self.seq_len = check_size("GPT", "seq_len", seq_len, least=1)
        if d_model % n_heads:
            raise UsageError(f"GPT: d_model={d_model} is not divisible by n_heads={n_heads}")
        norm_cls = _choice("GPT", "norm", norm, NORMS)
        self.tie_embeddings = bool(tie_embeddings)
        s_tok, s_pos, s_head, *s_blocks = _seeds(seed, 3 + n_layers)
        self.tok_emb = Embedding(vocab, d_model, seed=s_tok, dtype=dt)
        self.tok_emb.weight = (0.02 * self.tok_emb.weight).astype(dt)  # GPT-2's scale, not N(0, 1)
        self.pos_emb = Embedding(seq_len, d_model, seed=s_pos, dtype=dt)
        self.pos_emb.weight = (0.02 * self.pos_emb.weight).astype(dt)
        self.blocks = Sequential(*(TransformerBlock(d_model, n_heads, mlp=mlp, norm=norm, seed=s, dtype=dt,
                                                    dropout=dropout) for s in s_blocks))
        self.norm = norm_cls(d_model, dtype=dt)
        self.head = LMHead(d_model, vocab, self.tok_emb if tie_embeddings else None, seed=s_head, dtype=dt)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "GPT":
        """``GPT(**PRESETS[name], **overrides)``: ``"tiny"`` (vocab 256, d 64, 4 layers, 4 heads, seq 32)
        or ``"small"`` (vocab 2048, d 256, 8 layers, 8 heads, seq 128; a training step of a (8, 128)
        batch on 8 devices takes about 0.7 s on an idle 2-core machine: see ``PRESETS``)."""
        if name not in PRESETS:
            raise UsageError(f"GPT.preset: unknown preset {name!r}; the presets are {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def check_tokens(self, tokens: Any) -> np.ndarray:
        """``tokens`` as an integer array (batch, seq) with 1 ≤ seq ≤ seq_len and ids in 0 … vocab−1."""
        ids = np.asarray(tokens)
        if ids.dtype.kind not in "iu":
            raise UsageError(f"GPT: tokens must be integers, got dtype {ids.dtype}")
        if ids.ndim != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
            raise UsageError(f"GPT: tokens must be (batch, seq) with batch, seq >= 1, got shape {ids.shape}")
        if ids.shape[1] > self.seq_len:
            raise UsageError(f"GPT: tokens have seq={ids.shape[1]}, longer than the model's "
                             f"seq_len={self.seq_len}")
        if ids.min() < 0 or ids.max() >= self.vocab:
            raise UsageError(f"GPT: token ids must lie in 0..{self.vocab - 1} (vocab={self.vocab}), got "
                             f"{ids.min()}..{ids.max()}")
        return ids

    def forward(self, tokens: Any, step: int | None = None, rows: tuple[int, int] | None = None) -> Any:
        """Logits (batch, seq, vocab).  ``step``: the training step whose dropout masks to draw (None:
        no dropout); ``rows``: (the first row, the rows of the whole batch) when ``tokens`` are a
        microbatch of a larger batch, whose masks they take their rows of (default: the whole)."""
        ids = self.check_tokens(tokens)
        x = self.tok_emb(ids) + self.pos_emb(np.arange(ids.shape[1]))
        for i, block in enumerate(self.blocks):
            x = block(x, self.dropout_at(step, i, ids.shape, rows))
        return self.head(self.norm(x))

    def dropout_at(self, step: int | None, layer: int, shape: tuple[int, int],
                   rows: tuple[int, int] | None = None) -> DropoutMasks | None:
        """Layer ``layer``'s masks in training step ``step`` for a batch of ``shape`` (batch, seq) in
        this process, rows ``rows`` = (first, of) of a larger one; None without dropout or a step."""
        if step is None or not self.dropout:
            return None
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise UsageError(f"GPT: step must be an int >= 0 (the training step), got {step!r}")
        first, total = (0, shape[0]) if rows is None else (int(rows[0]), int(rows[1]))
        if not 0 <= first <= total - shape[0]:
            raise UsageError(f"GPT: rows={rows!r} does not hold a microbatch of {shape[0]} rows")
        key = layer_key(self.seed, int(step), layer)
        return DropoutMasks(self.dropout, key, total, shape[1], self.n_heads, self.d_model, row0=first)

    def flops_per_token(self, seq: int | None = None) -> float:
        """Forward matmul FLOPs per token at sequence length ``seq`` (default ``seq_len``): the blocks'
        plus the head's 2·d·vocab (the embeddings are lookups)."""
        seq = self.seq_len if seq is None else seq
        head = float(matmul_flops(1, self.d_model, self.vocab))
        return sum(b.flops_per_token(seq) for b in self.blocks) + head

    def extra_repr(self) -> str:
        return (f"vocab={self.vocab}, d_model={self.d_model}, n_layers={self.n_layers}, "
                f"n_heads={self.n_heads}, seq_len={self.seq_len}, tie_embeddings={self.tie_embeddings}"
                + (f", dropout={self.dropout}" if self.dropout else ""))
