"""The papers' closed forms for a ``ParallelTrainer`` step: bytes per collective, memory, bubble, MFU.

Every figure is per device and per step; b = rows of one microbatch on one replica, s = the
sequence length, h = d_model, a = heads, t = tp, L = layers, Ψ = parameters (elements), N_d = dp,
``itemsize`` = bytes per element.  The tests check the executed run against these.

- **TP** (Shoeybi et al. 2019): per layer per microbatch, 4 all-reduces of b·s·h (2 forward, 2
  backward), on a ring 2(t−1)/t of the array sent per device each; with SP the same bytes as 4
  all-gathers + 4 reduce-scatters of (t−1)/t, plus the all_gather each gathered linear repeats in its
  backward (:mod:`.sp`).  The vocabulary-parallel ends add 2 more of b·s·h
  (the embedding's g forward, the head's f backward) and 3 all-reduces of b·s (the row max and the
  sum of exponentials, and the target's logit); SP adds the replicated parameters' gradient
  all-reduce.
- **DP** (Rajbhandari et al. 2020): zero=0 all-reduces Ψ, 2(N_d−1)/N_d·Ψ sent per device; zero=1
  reduce-scatters the gradients and all-gathers the parameters: the same; zero=3 all-gathers the
  parameters in every microbatch's forward and again in its backward (FSDP frees them in between;
  a recomputed block gathers again for its recomputation) and reduce-scatters the gradients in its
  backward: 3(N_d−1)/N_d·Ψ per microbatch.
- **ZeRO memory**: (P + G + K)·Ψ with P = G = itemsize and K the optimizer's bytes per parameter
  (Adam: 2·itemsize); zero=1 divides K by N_d, zero=2 G and K, zero=3 all three — the paper's
  (2 + 2 + K)·Ψ/N_d for 16-bit P and G.
- **Activations** (Korthikanti et al. 2022, bytes per layer, 16-bit activations and 1-byte dropout
  masks): s·b·h·(34 + 5·a·s/h); with TP s·b·h·(10 + 24/t + 5·a·s/(h·t)); with TP and SP
  s·b·h·(34 + 5·a·s/h)/t; with full recomputation 2·s·b·h (/t with SP).  The count is each kernel's
  input: the LayerNorms' inputs (2·sbh each), the QKV and MLP-up inputs (2·sbh each), Q and K
  (4·sbh), V (2·sbh), the output projection's input (2·sbh), the GeLU's input and the down
  projection's (8·sbh each), the softmax output and the dropped-out probabilities (2·a·s²·b each),
  and three dropout masks (sbh, sbh and a·s²·b).  This GPT keeps exactly those tensors — each
  elementwise kernel (norm, softmax, GELU) keeps its input (:mod:`virtualpar.nn.recompute`); the
  softmax's input fills the "softmax output" slot — so the devices measure, to the byte, with
  values of e bytes and masks of one: s·b·h·(16·e + 2 + (2·e + 1)·a·s/h), the paper's at e = 2
  (:func:`megatron_activation_bytes`).  Without dropout (``GPT(dropout=0)``, the default) there
  are no masks and P·V reads the softmax's output: s·b·h·(16·e + 2·e·a·s/h).
- **The ends** (the paper's §4.3, which it then neglects): the token embedding keeps nothing but
  the ids (no embedding dropout here); the output end keeps the final norm's input and the head's
  (e·sbh each, /t with SP), the shifted logits' exponentials (e·sbv/t: Megatron's softmax, which it
  keeps in 32 bits, "4sbv/t") and the per-token sum of exponentials (e·sb), once per stage that
  holds the head (:func:`head_activation_bytes`).
- **Bubble**: (p−1)/(v·m + p−1) for p stages of v chunks each and m microbatches (1F1B, GPipe, interleaved).
- **MFU**: model FLOPs (3 × the forward's ``flops_per_token`` per token) per second over the devices' peak.
"""

from __future__ import annotations

from typing import Any

from .config import ParallelConfig

__all__ = ["tp_bytes", "dp_bytes", "zero_memory", "megatron_activation_bytes", "head_activation_bytes",
           "bubble_fraction", "mfu", "model_flops"]


def _ring(n: int) -> float:
    return 2.0 * (n - 1) / n


def tp_bytes(model: Any, cfg: ParallelConfig, batch: int, seq: int, itemsize: int) -> float:
    """Bytes one device sends over tp in a step of a one-stage model (pp = cp = 1)."""
    t = cfg.tp
    if t == 1:
        return 0.0
    b = batch // cfg.dp  # rows of a replica: the microbatches add up to them
    bsh = b * seq * model.d_model
    big = (4 * model.n_layers + 2) * bsh
    small = 3 * b * seq
    total = _ring(t) * (big + small)
    if cfg.sequence_parallel:  # the gathered linears' second all_gather (QKV, MLP in, head), and the
        # replicated parameters' gradients, partial over the sequence shards
        total += (t - 1) / t * (2 * model.n_layers + 1) * bsh
        replicated = sum(v.size for k, v in model.state_dict().items() if _replicated(k))
        total += _ring(t) * replicated
    return total * itemsize


def _replicated(name: str) -> bool:
    from .layout import tp_dim  # the one place the split is decided

    return tp_dim(name) is None and not name.startswith("head.embedding")


def dp_bytes(psi: int, cfg: ParallelConfig, itemsize: int, psi_kept: int = 0) -> float:
    """Bytes one device sends over dp in a step for Ψ = ``psi`` local (tp-sharded) parameters, of
    which ``psi_kept`` keep their gathered copy from the forward to the backward (under ZeRO-3 only
    tied embeddings' units do: gathered once, not twice)."""
    n = cfg.dp
    if n == 1:
        return 0.0
    if cfg.zero in (0, 1):
        return _ring(n) * psi * itemsize
    moved = 3 * psi - psi_kept  # all_gather forward + all_gather backward + reduce_scatter, per microbatch
    return (n - 1) / n * itemsize * moved * cfg.microbatches


def zero_memory(psi: int, dp: int, zero: int, itemsize: int, optimizer_bytes: int) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state per device by ZeRO stage (Ψ = ``psi``)."""
    p = g = float(psi * itemsize)
    k = float(psi * optimizer_bytes)
    if zero >= 1:
        k /= dp
    if zero >= 2:
        g /= dp
    if zero >= 3:
        p /= dp
    return {"params": p, "grads": g, "optimizer": k}


def megatron_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False,
                              recompute: bool = False, bytes_per: int = 2, dropout: bool = True,
                              mask_bytes: int = 1) -> float:
    """Korthikanti et al.'s activation memory of one transformer layer (see the module doc), with
    values of ``bytes_per`` bytes (2 in the paper) and dropout masks of ``mask_bytes`` (1):

        replicated over tp   4·e + 2·m    (10: two norms' inputs, the QKV and MLP-up inputs, two masks)
        split over tp        12·e         (24: Q, K, V, the projection's input, GeLU's in and out)
        scores               2·e + m      (5: softmax output, mask, dropped-out probabilities) × a·s/h

    per s·b·h, the replicated part /t too under SP; ``dropout=False``: no masks (m = 0)."""
    e, m = bytes_per, (mask_bytes if dropout else 0)
    if recompute:
        return float(s * b * h * e) / (t if sp else 1)
    shared, split, scores = 4.0 * e + 2.0 * m, 12.0 * e, (2.0 * e + m) * a * s / h
    per = (shared + split + scores) / t if sp else shared + (split + scores) / t
    return s * b * h * per


def head_activation_bytes(s: int, b: int, h: int, v: int, t: int = 1, sp: bool = False,
                          bytes_per: int = 2) -> float:
    """Bytes one microbatch's output end keeps for its backward: the final norm's input and the
    head's input (s·b·h each, /t with SP), the exponentials of the logits (s·b·v/t, the vocabulary
    split over tp) and the per-token sum of them (s·b) — ``e·s·b·(2h/t_sp + v/t + 1)``.  The target
    logit is picked by index (:func:`virtualpar.nn.pick`), so no copy of the logits is kept."""
    return float(bytes_per * s * b * (2 * h / (t if sp else 1) + v / t + 1))


def bubble_fraction(stages: int, microbatches: int, virtual: int = 1) -> float:
    """Idle fraction of a pipeline step: (p−1)/(v·m + p−1)."""
    return (stages - 1) / (virtual * microbatches + stages - 1)


def model_flops(model: Any, batch: int, seq: int) -> float:
    """FLOPs of a training step of ``batch`` × ``seq`` tokens: 3 × the forward's (``flops_per_token``)."""
    return 3.0 * model.flops_per_token(seq) * batch * seq


def mfu(model: Any, batch: int, seq: int, step_seconds: float, devices: int, peak: float) -> float:
    """Model FLOPs utilisation: the step's model FLOPs / (step time × devices × peak FLOP/s)."""
    return model_flops(model, batch, seq) / (step_seconds * devices * peak)
