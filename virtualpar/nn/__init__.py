"""``virtualpar.nn``: models on numpy, one differentiation mechanism, optimizers, the reference.

Transformers: ``MultiHeadAttention`` (its math in :mod:`.attention`, whole and blockwise), ``MLP``,
``SwiGLU``, ``RMSNorm``, ``TransformerBlock`` and ``GPT`` (:mod:`.transformer`, :mod:`.gpt`), with
dropout that every sharding draws alike (:mod:`.dropout`), and index lookups that keep indices,
not values, for the backward (:mod:`.lookup`).

Pure (no processes).  Every later layer — tensor-parallel operations, pipeline stages, the unified
strategies, timeline parallelism — builds models from these modules, differentiates them with
:func:`value_and_grad` / :func:`vjp`, steps these optimizers, and checks itself against
:func:`reference_train`.
"""

from __future__ import annotations

from .activations import GELU, ReLU, Tanh, gelu, relu, tanh
from .attention import (AttentionState, attention_block_update, attention_finish, attention_init, causal_mask,
                        merge_attention_states, merge_heads, scaled_dot_product_attention, split_heads)
from .dropout import DropoutMasks, dropout
from .functional import VJP, functional_call, value_and_grad, vjp
from .layers import Embedding, Linear, Sequential
from .losses import cross_entropy, mse_loss
from .lookup import pick, rows_of
from .module import Module, ShapeError
from .gpt import GPT, PRESETS, LMHead
from .norm import LayerNorm, RMSNorm
from .optim import SGD, Adam, AdamW, Optimizer, accumulate, clip_grad_norm
from .recurrent import GRU, RNN
from .reference import reference_train, split_microbatches
from .transformer import MLP, MultiHeadAttention, SwiGLU, TransformerBlock, qkv_heads, silu, swiglu_hidden

__all__ = [
    "Module", "ShapeError", "Linear", "Embedding", "Sequential", "ReLU", "GELU", "Tanh", "relu", "gelu",
    "tanh", "silu", "LayerNorm", "RMSNorm", "RNN", "GRU", "mse_loss", "cross_entropy", "functional_call",
    "value_and_grad", "vjp", "VJP", "SGD", "Adam", "AdamW", "Optimizer", "clip_grad_norm", "accumulate",
    "reference_train", "split_microbatches",
    # transformers
    "MultiHeadAttention", "MLP", "SwiGLU", "TransformerBlock", "GPT", "LMHead", "PRESETS", "qkv_heads",
    "swiglu_hidden", "scaled_dot_product_attention", "attention_block_update", "attention_init",
    "attention_finish", "merge_attention_states", "AttentionState", "causal_mask", "split_heads",
    "merge_heads", "DropoutMasks", "dropout", "pick", "rows_of",
]
