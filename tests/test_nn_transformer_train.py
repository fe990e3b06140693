"""Training GPT: AdamW against a numpy AdamW written here, a short run whose loss falls, and the
single-process reference trainer driving a GPT."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import nn


def numpy_adamw(params, grads_per_step, lr, betas, eps, wd):
    """Loshchilov & Hutter's AdamW as torch writes it: decay p by lr·λ, then the bias-corrected Adam step."""
    p = {k: v.copy() for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    b1, b2 = betas
    for t, grads in enumerate(grads_per_step, start=1):
        for k in p:
            g = grads[k]
            p[k] = p[k] * (1 - lr * wd)
            m[k] = b1 * m[k] + (1 - b1) * g
            v2[k] = b2 * v2[k] + (1 - b2) * g * g
            p[k] = p[k] - lr * (m[k] / (1 - b1 ** t)) / (np.sqrt(v2[k] / (1 - b2 ** t)) + eps)
    return p


def test_adamw_matches_a_numpy_adamw_over_several_steps_and_resumes_from_its_state_dict():
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(5)]
    kw = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.1)
    opt = nn.AdamW(**kw)
    p = params
    for g in grads[:3]:
        p = opt.step(p, g)
    resumed = nn.AdamW(**{**kw, "lr": 0.5})  # lr and the moments come from the state dict
    resumed.load_state_dict(opt.state_dict())
    for g in grads[3:]:
        p = resumed.step(p, g)
    want = numpy_adamw(params, grads, kw["lr"], kw["betas"], kw["eps"], kw["weight_decay"])
    for k in params:
        np.testing.assert_allclose(p[k], want[k], rtol=1e-13, atol=1e-15)


def pattern_batch(vocab, batch, seq, seed):
    """Sequences counting up by a per-row stride: the next token follows from the two before it."""
    rng = np.random.default_rng(seed)
    start, stride = rng.integers(0, vocab, (batch, 1)), rng.integers(1, 4, (batch, 1))
    tokens = (start + stride * np.arange(seq + 1)) % vocab
    return tokens[:, :-1], tokens[:, 1:]


def test_a_short_adamw_run_of_a_small_gpt_lowers_the_loss():
    model = nn.GPT(vocab=16, d_model=32, n_layers=2, n_heads=2, seq_len=12, seed=0)
    opt = nn.AdamW(lr=1e-2, weight_decay=0.01)
    x, y = pattern_batch(16, 8, 12, 0)
    losses = []
    for _ in range(30):
        loss, grads = nn.value_and_grad(lambda m, a, b: nn.cross_entropy(m(a), b), model, x, y)
        model.load_state_dict(opt.step(model.parameters(), grads))
        losses.append(loss)
    assert losses[0] == pytest.approx(np.log(16), rel=0.2)  # starts near uniform
    assert losses[-1] < 0.5 * losses[0], losses


def test_reference_train_drives_a_gpt_and_microbatches_give_the_full_batch_step():
    batches = [pattern_batch(16, 4, 8, s) for s in range(2)]
    def make():
        return nn.GPT(vocab=16, d_model=16, n_layers=1, n_heads=2, seq_len=8, seed=3, dtype=np.float64)

    whole, state = nn.reference_train(make(), batches, nn.cross_entropy, nn.AdamW(lr=1e-2), steps=3)
    split, state2 = nn.reference_train(make(), batches, nn.cross_entropy, nn.AdamW(lr=1e-2), steps=3,
                                       microbatches=2)
    np.testing.assert_allclose(whole, split, rtol=1e-12)
    for k in state:
        np.testing.assert_allclose(state[k], state2[k], rtol=1e-9, atol=1e-12, err_msg=k)
    assert whole[-1] < whole[0]
