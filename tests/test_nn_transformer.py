"""Transformer layers and GPT against a numpy forward written here (loops over heads, no library
calls), gradients against central finite differences in float64, the causal mask, bad sizes."""

from __future__ import annotations

import math

import autograd.numpy as anp
import numpy as np
import pytest

from tests.test_nn_grads import check_module
from virtualpar import nn
from virtualpar.errors import UsageError

RNG = np.random.default_rng(40)


# -- the numpy reference ------------------------------------------------------------------------------
def np_layernorm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def np_rmsnorm(x, w, eps=1e-6):
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * w


def np_gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def np_softmax_attention(q, k, v, causal):
    """One head: q (s_q, hd), k, v (s_k, hd); a loop over query rows."""
    out = np.zeros_like(q)
    for i in range(q.shape[0]):
        seen = range(i + 1) if causal else range(k.shape[0])
        scores = np.array([q[i] @ k[j] / math.sqrt(q.shape[1]) for j in seen])
        w = np.exp(scores - scores.max())
        out[i] = (w / w.sum()) @ v[list(seen)]
    return out


def np_mha(x, p, prefix, n_heads, causal=True):
    """x (b, s, d); head j's q, k, v are qkv columns 3j·hd … (the documented layout)."""
    b, s, d = x.shape
    hd = d // n_heads
    qkv = x @ p[prefix + "qkv.weight"] + p[prefix + "qkv.bias"]
    heads = np.zeros((b, s, d))
    for n in range(b):
        for j in range(n_heads):
            base = 3 * j * hd
            q, k, v = (qkv[n, :, base + i * hd: base + (i + 1) * hd] for i in range(3))
            heads[n, :, j * hd:(j + 1) * hd] = np_softmax_attention(q, k, v, causal)
    return heads @ p[prefix + "out.weight"] + p[prefix + "out.bias"]


def np_block(x, p, prefix, n_heads, mlp, norm):
    def normed(i, y):
        if norm == "rmsnorm":
            return np_rmsnorm(y, p[f"{prefix}norm{i}.weight"])
        return np_layernorm(y, p[f"{prefix}norm{i}.weight"], p[f"{prefix}norm{i}.bias"])

    x = x + np_mha(normed(1, x), p, prefix + "attn.", n_heads)
    h = normed(2, x)
    m = prefix + "mlp."
    if mlp == "swiglu":
        g = h @ p[m + "gate.weight"]
        return x + (g / (1 + np.exp(-g)) * (h @ p[m + "up.weight"])) @ p[m + "down.weight"]
    hidden = np_gelu_tanh(h @ p[m + "up.weight"] + p[m + "up.bias"])
    return x + hidden @ p[m + "down.weight"] + p[m + "down.bias"]


def np_gpt(p, tokens, n_layers, n_heads, mlp="gelu", norm="layernorm", tied=False):
    x = p["tok_emb.weight"][tokens] + p["pos_emb.weight"][: tokens.shape[1]]
    for i in range(n_layers):
        x = np_block(x, p, f"blocks.{i}.", n_heads, mlp, norm)
    if norm == "rmsnorm":
        x = np_rmsnorm(x, p["norm.weight"])
    else:
        x = np_layernorm(x, p["norm.weight"], p["norm.bias"])
    return x @ (p["tok_emb.weight"].T if tied else p["head.weight"])


def randomise(model):
    """Non-trivial norm weights and biases (they start at ones and zeros)."""
    for k, v in model.state_dict().items():
        if "norm" in k:
            model._set(k, (v + 0.3 * RNG.standard_normal(v.shape)).astype(v.dtype))
    return model


# -- attention ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
def test_scaled_dot_product_attention_matches_numpy(causal):
    q, k, v = (RNG.standard_normal((2, 3, 5, 4)) for _ in range(3))
    got = nn.scaled_dot_product_attention(q, k, v, causal)
    for b in range(2):
        for h in range(3):
            want = np_softmax_attention(q[b, h], k[b, h], v[b, h], causal)
            np.testing.assert_allclose(got[b, h], want, rtol=1e-12)


def blockwise(q, k, v, causal, q_cuts, k_cuts, order_seed):
    """Queries cut at q_cuts, keys at k_cuts; each query block folds its key blocks in a shuffled order."""
    outs = []
    kb = list(zip(np.split(np.arange(k.shape[2]), k_cuts), anp.split(k, k_cuts, 2), anp.split(v, k_cuts, 2)))
    for pos, qb in zip(np.split(np.arange(q.shape[2]), q_cuts), anp.split(q, q_cuts, 2)):
        state = nn.attention_init(qb)
        for i in np.random.default_rng(order_seed).permutation(len(kb)):
            kpos, kk, vv = kb[i]
            state = nn.attention_block_update(state, qb, kk, vv, causal, q_start=int(pos[0]),
                                              k_start=int(kpos[0]))
        outs.append(nn.attention_finish(state))
    return anp.concatenate(outs, axis=2)  # autograd's: the gradient test differentiates through it


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_cuts,k_cuts", [([], []), ([], [1, 4]), ([3], [3]), ([2, 5], [1, 2, 6]),
                                           ([4], [4, 5])])
def test_blockwise_online_softmax_in_any_split_and_order_equals_full_attention(causal, q_cuts, k_cuts):
    q, k, v = (RNG.standard_normal((2, 2, 7, 3)) for _ in range(3))
    want = nn.scaled_dot_product_attention(q, k, v, causal)
    for seed in range(3):
        got = blockwise(q, k, v, causal, q_cuts, k_cuts, seed)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_merging_two_partial_states_equals_folding_every_block():
    q, k, v = (RNG.standard_normal((1, 2, 6, 3)) for _ in range(3))
    left = nn.attention_block_update(nn.attention_init(q), q, k[:, :, :2], v[:, :, :2], True, 0, 0)
    right = nn.attention_block_update(nn.attention_init(q), q, k[:, :, 2:], v[:, :, 2:], True, 0, 2)
    for merged in (nn.merge_attention_states(left, right), nn.merge_attention_states(right, left)):
        want = nn.scaled_dot_product_attention(q, k, v)
        np.testing.assert_allclose(nn.attention_finish(merged), want, rtol=1e-12)


def test_blockwise_gradients_equal_full_attention_gradients():
    q, k, v = (RNG.standard_normal((1, 2, 6, 3)) for _ in range(3))
    dy = RNG.standard_normal((1, 2, 6, 3))
    whole = nn.vjp(lambda p, q, k, v: nn.scaled_dot_product_attention(q, k, v), q, k, v, params={})
    full = whole.backward(dy)[0]
    blocks = nn.vjp(lambda p, q, k, v: blockwise(q, k, v, True, [2, 4], [3, 5], 1), q, k, v, params={})
    for got, want in zip(blocks.backward(dy)[0], full):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_head_layout_splits_into_whole_heads_as_tensor_parallelism_cuts_it():
    """Columns [c·3d/tp, (c+1)·3d/tp) of qkv and rows [c·d/tp, (c+1)·d/tp) of out are whole heads:
    attention over each group, summed over the groups, is the layer (the bias added once)."""
    d, heads, tp = 8, 4, 2
    mha = nn.MultiHeadAttention(d, heads, seed=3, dtype=np.float64)
    x = RNG.standard_normal((2, 5, d))
    w, b, wo = mha.qkv.weight, mha.qkv.bias, mha.out.weight
    total = mha.out.bias.copy()
    for c in range(tp):
        cols, rows = slice(c * 3 * d // tp, (c + 1) * 3 * d // tp), slice(c * d // tp, (c + 1) * d // tp)
        q, k, v = nn.qkv_heads(x @ w[:, cols] + b[cols], heads // tp)
        total = total + nn.merge_heads(nn.scaled_dot_product_attention(q, k, v)) @ wo[rows]
    np.testing.assert_allclose(total, mha(x), rtol=1e-12)


# -- layers -------------------------------------------------------------------------------------------
def test_layers_match_numpy():
    x = RNG.standard_normal((2, 5, 8))
    mha = nn.MultiHeadAttention(8, 2, seed=1, dtype=np.float64)
    np.testing.assert_allclose(mha(x), np_mha(x, mha.parameters(), "", 2), rtol=1e-12)
    mha_all = nn.MultiHeadAttention(8, 2, causal=False, seed=1, dtype=np.float64)
    np.testing.assert_allclose(mha_all(x), np_mha(x, mha_all.parameters(), "", 2, causal=False), rtol=1e-12)
    rms = randomise(nn.RMSNorm(8, dtype=np.float64))
    np.testing.assert_allclose(rms(x), np_rmsnorm(x, rms.weight), rtol=1e-13)
    for mlp, norm in [("gelu", "layernorm"), ("swiglu", "rmsnorm")]:
        block = randomise(nn.TransformerBlock(8, 4, mlp=mlp, norm=norm, seed=2, dtype=np.float64))
        np.testing.assert_allclose(block(x), np_block(x, block.parameters(), "", 4, mlp, norm), rtol=1e-12)


@pytest.mark.parametrize("make", [
    lambda: nn.MultiHeadAttention(4, 2, seed=1, dtype=np.float64),
    lambda: nn.MultiHeadAttention(4, 1, causal=False, seed=1, dtype=np.float64),
    lambda: randomise(nn.RMSNorm(4, dtype=np.float64)),
    lambda: nn.MLP(4, hidden=6, seed=2, dtype=np.float64),
    lambda: nn.SwiGLU(4, hidden=6, seed=2, dtype=np.float64),
    lambda: randomise(nn.TransformerBlock(4, 2, hidden=6, seed=3, dtype=np.float64)),
    lambda: randomise(nn.TransformerBlock(4, 2, mlp="swiglu", norm="rmsnorm", hidden=6, seed=3,
                                          dtype=np.float64)),
], ids=["mha", "mha-bidirectional", "rmsnorm", "mlp", "swiglu", "block", "block-swiglu-rms"])
def test_layer_gradients_match_finite_differences(make):
    check_module(make(), RNG.standard_normal((2, 3, 4)), tol=1e-7)


def test_float32_layers_keep_float32_outputs_and_gradients():
    block = nn.TransformerBlock(8, 2, mlp="swiglu", norm="rmsnorm")
    x = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    rec = nn.vjp(block, x)
    dx, grads = rec.backward(np.ones_like(rec.output))
    assert rec.output.dtype == dx.dtype == np.float32
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float32)}
    q = x.reshape(2, 2, 3, 4)
    state = nn.attention_block_update(nn.attention_init(q), q, q, q)
    assert {a.dtype for a in state} == {np.dtype(np.float32)}  # MASKED and the scale keep float32


# -- GPT ------------------------------------------------------------------------------------------------
SMALL = dict(vocab=11, d_model=8, n_layers=2, n_heads=2, seq_len=6)


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": True}, {"mlp": "swiglu", "norm": "rmsnorm"}],
                         ids=["gpt", "tied", "swiglu-rmsnorm"])
def test_gpt_forward_matches_numpy(kw):
    model = randomise(nn.GPT(**SMALL, seed=5, dtype=np.float64, **kw))
    tokens = RNG.integers(0, 11, (3, 5))
    got = model(tokens)
    assert got.shape == (3, 5, 11)
    want = np_gpt(model.parameters(), tokens, 2, 2, kw.get("mlp", "gelu"), kw.get("norm", "layernorm"),
                  tied=kw.get("tie_embeddings", False))
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-13)


def test_gpt_state_dict_keys_and_parameter_count_closed_form():
    model = nn.GPT(**SMALL)
    keys = list(model.state_dict())
    assert keys[:2] == ["tok_emb.weight", "pos_emb.weight"]
    assert keys[-3:] == ["norm.weight", "norm.bias", "head.weight"]
    assert "blocks.1.attn.qkv.weight" in keys and model.blocks[1] is model.blocks[1]
    d, v, s, layers = 8, 11, 6, 2
    assert model.num_parameters() == v * d + s * d + layers * (12 * d * d + 13 * d) + 2 * d + d * v
    tied = nn.GPT(**SMALL, tie_embeddings=True)
    assert tied.num_parameters() == model.num_parameters() - d * v
    assert "head.embedding.weight" in tied.state_dict() and "head.weight" not in tied.state_dict()
    assert model.flops_per_token() == layers * (24 * d * d + 4 * s * d) + 2 * d * v


@pytest.mark.parametrize("kw", [{}, {"tie_embeddings": True}])
def test_gpt_loss_gradient_matches_finite_differences(kw):
    model = randomise(nn.GPT(**SMALL, seed=7, dtype=np.float64, **kw))
    tokens, targets = RNG.integers(0, 11, (2, 5)), RNG.integers(0, 11, (2, 5))
    loss, grads = nn.value_and_grad(lambda m, a, b: nn.cross_entropy(m(a), b), model, tokens, targets)
    params = model.parameters()
    want = float(nn.cross_entropy(np_gpt(params, tokens, 2, 2, tied=bool(kw)), targets))
    assert loss == pytest.approx(want, rel=1e-12)
    rng, eps = np.random.default_rng(0), 1e-6
    for name, value in params.items():
        for _ in range(2):  # two random entries per parameter keep it fast
            idx = tuple(rng.integers(0, n) for n in value.shape)
            if name == "tok_emb.weight" and not kw:
                idx = (int(tokens[0, 0]),) + idx[1:]  # a row that is used (unused rows: zero on both sides)
            old = value[idx]
            value[idx] = old + eps
            hi = float(nn.cross_entropy(model(tokens), targets))
            value[idx] = old - eps
            lo = float(nn.cross_entropy(model(tokens), targets))
            value[idx] = old
            assert grads[name][idx] == pytest.approx((hi - lo) / (2 * eps), rel=1e-5, abs=1e-8), (name, idx)


def test_gpt_is_causal_a_future_token_does_not_change_earlier_logits():
    model = nn.GPT(**SMALL, seed=1, dtype=np.float64)
    tokens = RNG.integers(0, 11, (2, 6))
    changed = tokens.copy()
    changed[:, 3] = (changed[:, 3] + 1) % 11
    a, b = model(tokens), model(changed)
    np.testing.assert_array_equal(a[:, :3], b[:, :3])
    assert np.abs(a[:, 3:] - b[:, 3:]).min() > 0  # and it does change the later ones


def test_cross_entropy_over_batch_and_sequence_is_the_mean_over_every_token():
    logits, targets = RNG.standard_normal((2, 3, 5)) * 4, RNG.integers(0, 5, (2, 3))
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    want = -np.mean([logp[b, s, targets[b, s]] for b in range(2) for s in range(3)])
    assert float(nn.cross_entropy(logits, targets)) == pytest.approx(want, rel=1e-13)
    assert np.isfinite(float(nn.cross_entropy(logits * 1e4, targets)))  # stable for large logits


@pytest.mark.parametrize("args,kw,match", [
    ((11, 6, 2, 4, 6), {}, "d_model=6 is not divisible by n_heads=4"),
    ((11, 8, 0, 2, 6), {}, "n_layers must be an int >= 1, got 0"),
    ((0, 8, 2, 2, 6), {}, "vocab must be an int >= 1"),
    ((11, -8, 2, 2, 6), {}, "d_model must be an int >= 1"),
    ((11, 8, 2, 2, 2.5), {}, "seq_len must be an int >= 1, got 2.5"),
    ((11, 8, 2, 2, 6), {"mlp": "relu"}, r"mlp must be one of \['gelu', 'swiglu'\]"),
])
def test_gpt_refuses_bad_sizes_naming_the_argument(args, kw, match):
    with pytest.raises(UsageError, match=match):
        nn.GPT(*args, **kw)


@pytest.mark.parametrize("tokens,match", [
    (np.zeros((2, 7), int), "seq=7, longer than the model's seq_len=6"),
    (np.full((2, 3), 11), r"token ids must lie in 0..10 \(vocab=11\), got 11..11"),
    (np.full((2, 3), -1), "token ids must lie in 0..10"),
    (np.zeros((2, 3)), "tokens must be integers, got dtype float64"),
    (np.zeros(3, int), r"tokens must be \(batch, seq\)"),
])
def test_gpt_refuses_bad_tokens(tokens, match):
    with pytest.raises(UsageError, match=match):
        nn.GPT(**SMALL)(tokens)


def test_presets():
    tiny = nn.GPT.preset("tiny")
    assert (tiny.vocab, tiny.d_model, tiny.n_layers, tiny.n_heads, tiny.seq_len) == (256, 64, 4, 4, 32)
    assert nn.PRESETS["small"] == dict(vocab=2048, d_model=256, n_layers=8, n_heads=8, seq_len=128)
    tied = nn.GPT.preset("tiny", tie_embeddings=True, n_layers=1)
    assert tied.tie_embeddings and len(tied.blocks) == 1
    with pytest.raises(UsageError, match=r"unknown preset 'huge'; the presets are \['small', 'tiny'\]"):
        nn.GPT.preset("huge")


def test_feed_forwards_match_numpy_on_their_own():
    x = RNG.standard_normal((2, 3, 8))
    mlp = nn.MLP(8, seed=1, dtype=np.float64)
    p = mlp.parameters()
    want = np_gelu_tanh(x @ p["up.weight"] + p["up.bias"]) @ p["down.weight"] + p["down.bias"]
    np.testing.assert_allclose(mlp(x), want, rtol=1e-12)
    glu = nn.SwiGLU(8, seed=1, dtype=np.float64)
    assert glu.hidden == 24 and nn.swiglu_hidden(256) == 688  # ⅔·4·d rounded up to a multiple of 8
    g = x @ glu.gate.weight
    want = (g / (1 + np.exp(-g)) * (x @ glu.up.weight)) @ glu.down.weight
    np.testing.assert_allclose(glu(x), want, rtol=1e-12)
    assert mlp.flops_per_token() == 4 * 8 * 32 and glu.flops_per_token() == 6 * 8 * 24


@pytest.mark.parametrize("call,match", [
    (lambda: nn.scaled_dot_product_attention(np.zeros((2, 3, 4)), np.zeros((2, 3, 4)), np.zeros((2, 3, 4))),
     r"q, k, v must be \(batch, heads, seq, head_dim\)"),
    (lambda: nn.scaled_dot_product_attention(np.zeros((1, 1, 2, 4)), *[np.zeros((1, 1, 3, 4))] * 2),
     "causal needs as many queries as keys, got s_q=2, s_k=3"),
    (lambda: nn.scaled_dot_product_attention(np.zeros((1, 2, 2, 4)), *[np.zeros((1, 1, 2, 4))] * 2),
     "needs k and v of shape"),
    (lambda: nn.MultiHeadAttention(6, 4), "d_model=6 is not divisible by n_heads=4"),
    (lambda: nn.MultiHeadAttention(8, 2)(np.zeros((3, 8), np.float32)), r"expected input \(batch, seq, 8\)"),
    (lambda: nn.TransformerBlock(8, 2, norm="batchnorm"), r"norm must be one of \['layernorm', 'rmsnorm'\]"),
    (lambda: nn.RMSNorm(8, eps=-1.0), "eps must be a number >= 0, got -1.0"),
    (lambda: nn.qkv_heads(np.zeros((1, 2, 12)), 3), "12 columns do not split into 3 x 3 heads"),
], ids=["not-4d", "causal-lengths", "k-shape", "heads", "mha-2d", "norm", "eps", "qkv"])
def test_bad_attention_arguments_are_named(call, match):
    with pytest.raises(UsageError, match=match):
        call()


# -- dropout ------------------------------------------------------------------------------------------
def np_dropped_gpt(model, tokens, step, p):
    """The GPT's forward with dropout written out in numpy: for each layer, the attention
    probabilities, the attention output and the MLP output dropped with the layer's masks
    (kept / (1 − p)), one query row and head at a time."""
    par = model.parameters()
    b, s = tokens.shape
    d, nh = model.d_model, model.n_heads
    hd = d // nh
    x = par["tok_emb.weight"][tokens] + par["pos_emb.weight"][:s]
    for i in range(model.n_layers):
        drop = model.dropout_at(step, i, (b, s))
        keep_a = drop.attention((b, nh, s, s))
        keep_o, keep_m = drop.hidden(2, (b, s, d)), drop.hidden(3, (b, s, d))
        pre = f"blocks.{i}."
        h = np_layernorm(x, par[pre + "norm1.weight"], par[pre + "norm1.bias"])
        qkv = h @ par[pre + "attn.qkv.weight"] + par[pre + "attn.qkv.bias"]
        heads = np.zeros((b, s, d))
        for n in range(b):
            for j in range(nh):
                q, k, v = (qkv[n, :, 3 * j * hd + c * hd: 3 * j * hd + (c + 1) * hd] for c in range(3))
                for r in range(s):
                    scores = q[r] @ k[: r + 1].T / math.sqrt(hd)
                    w = np.exp(scores - scores.max())
                    w = w / w.sum() * keep_a[n, j, r, : r + 1] / (1 - p)
                    heads[n, r, j * hd:(j + 1) * hd] = w @ v[: r + 1]
        attn = heads @ par[pre + "attn.out.weight"] + par[pre + "attn.out.bias"]
        x = x + attn * keep_o / (1 - p)
        h = np_layernorm(x, par[pre + "norm2.weight"], par[pre + "norm2.bias"])
        mlp = np_gelu_tanh(h @ par[pre + "mlp.up.weight"] + par[pre + "mlp.up.bias"])
        x = x + (mlp @ par[pre + "mlp.down.weight"] + par[pre + "mlp.down.bias"]) * keep_m / (1 - p)
    x = np_layernorm(x, par["norm.weight"], par["norm.bias"])
    return x @ par["head.weight"]


def test_gpt_with_dropout_matches_numpy_with_the_same_masks():
    model = randomise(nn.GPT(**SMALL, seed=1, dtype=np.float64, dropout=0.3))
    tokens = RNG.integers(0, 11, (2, 6))
    for step in (0, 5):
        np.testing.assert_allclose(model(tokens, step=step), np_dropped_gpt(model, tokens, step, 0.3),
                                   rtol=1e-10, atol=1e-12)


def test_blockwise_attention_with_dropout_equals_the_whole_with_the_same_mask():
    q, k, v = (RNG.standard_normal((2, 3, 6, 4)) for _ in range(3))
    drop = nn.DropoutMasks(0.25, 7, rows=2, seq=6, heads=3, width=12)
    whole = nn.scaled_dot_product_attention(q, k, v, True, drop.attention((2, 3, 6, 6)), 0.25)
    state = nn.attention_init(q)
    for k0 in (4, 0, 2):  # key blocks in any order, each with its piece of the mask
        state = nn.attention_block_update(state, q, k[:, :, k0:k0 + 2], v[:, :, k0:k0 + 2], True, 0, k0,
                                          drop.attention((2, 3, 6, 2), k0), 0.25)
    np.testing.assert_allclose(nn.attention_finish(state), whole, rtol=1e-12)


def test_dropout_rate_is_checked():
    for bad in (1.0, -0.1, "0.1", True):
        with pytest.raises(UsageError, match="dropout must be a probability in \\[0, 1\\)"):
            nn.GPT(**SMALL, dropout=bad)
    with pytest.raises(UsageError, match="step must be an int >= 0"):
        nn.GPT(**SMALL, dropout=0.1)(np.zeros((1, 3), int), step=-1)
