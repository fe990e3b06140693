"""A model with its own forward is traced once, cut at named calls, and trained by the one pipeline
executor exactly as one process trains it; cuts the trace cannot separate are refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import UsageError, VirtualCluster, nn
from virtualpar.parallel.trace import trace_calls
from virtualpar.parallel.traced import TracedPipeline, TracedPipelineOperation


def gpt(**kw) -> nn.GPT:
    return nn.GPT(32, 16, 4, 4, 8, seed=1, dtype=np.float64, **kw)


def tokens():
    rng = np.random.default_rng(0)
    return rng.integers(0, 32, (8, 8)), rng.integers(0, 32, (8, 8))


class Skip(nn.Module):
    """``l3(l2(l1(x)) + l1(x))``: l1's output skips over l2."""

    def __init__(self) -> None:
        self.l1 = nn.Linear(4, 4, seed=1, dtype=np.float64)
        self.l2 = nn.Linear(4, 4, seed=2, dtype=np.float64)
        self.l3 = nn.Linear(4, 4, seed=3, dtype=np.float64)

    def forward(self, x):
        a = self.l1(x)
        return self.l3(nn.tanh(self.l2(a)) + a)


class Twice(nn.Module):
    """``l1(l2(l1(x)))``: one submodule called on both sides of l2."""

    def __init__(self) -> None:
        self.l1 = nn.Linear(4, 4, seed=1, dtype=np.float64)
        self.l2 = nn.Linear(4, 4, seed=2, dtype=np.float64)

    def forward(self, x):
        return self.l1(self.l2(self.l1(x)))


def test_the_trace_records_the_gpt_s_calls_in_order():
    tok, _ = tokens()
    assert trace_calls(gpt(), tok[:2]).names() == ["tok_emb", "pos_emb", "blocks.0", "blocks.1", "blocks.2",
                                                   "blocks.3", "norm", "head"]


@pytest.mark.parametrize("schedule, cuts", [("1f1b", ["blocks.2"]), ("gpipe", ["head"]),
                                            ("interleaved_1f1b", ["blocks.1", "blocks.2", "blocks.3"]),
                                            ("zbv", ["blocks.1", "blocks.2", "norm"])])
def test_a_gpt_cut_at_named_calls_trains_exactly_as_one_process(schedule, cuts):
    tok, tgt = tokens()
    want_losses, want = nn.reference_train(gpt(), [(tok, tgt)], nn.cross_entropy, nn.AdamW(1e-2), 3, 2)
    op = TracedPipelineOperation(TracedPipeline(gpt(), (tok[:2],), cuts), schedule, 2, loss=nn.cross_entropy,
                                 optimizer=nn.AdamW(1e-2))
    with VirtualCluster(2) as cluster:
        losses = [cluster.execute(op, tok, tgt) for _ in range(3)]
        got = op.state_dict(cluster)
    np.testing.assert_allclose(losses, want_losses, rtol=0, atol=1e-12)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-12, err_msg=k)


def test_a_skip_connection_inside_a_stage_is_fine_and_trains_exactly():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    want_losses, want = nn.reference_train(Skip(), [(x, y)], nn.mse_loss, nn.SGD(0.1), 2, 2)
    op = TracedPipelineOperation(TracedPipeline(Skip(), (x,), ["l3"]), "1f1b", 2, optimizer=nn.SGD(0.1))
    with VirtualCluster(2) as cluster:
        losses = [cluster.execute(op, x, y) for _ in range(2)]
        got = op.state_dict(cluster)
    np.testing.assert_allclose(losses, want_losses, atol=1e-14)
    assert all(np.allclose(got[k], want[k], atol=1e-14) for k in want)


@pytest.mark.parametrize("model, cuts, match", [
    (Skip, ["l2"], r"l3 \(stage 1\) reads its input computed from l1 \(stage 0\) other than through the "
                   r"stage boundary"),
    (Twice, ["l2"], r"l1 is called in stage 0 and in stage 1"),
    (Twice, ["l1"], r"'l1' is called 2 times"),
    (Skip, ["l9"], r"no call 'l9' in the traced model; the recorded calls are \['l1', 'l2', 'l3'\]"),
])
def test_cuts_the_trace_cannot_separate_are_refused_naming_the_modules(model, cuts, match):
    with pytest.raises(UsageError, match=match):
        TracedPipeline(model(), (np.ones((2, 4)),), cuts)


def test_tied_weights_and_calls_without_an_activation_cannot_start_a_stage():
    tok, _ = tokens()
    with pytest.raises(UsageError, match=r"parameter 'head.embedding.weight' is read by tok_emb \(stage 0\) "
                                         r"and by head \(stage 1\)"):
        TracedPipeline(gpt(tie_embeddings=True), (tok[:2],), ["blocks.2"])
    with pytest.raises(UsageError, match=r"cannot cut at 'pos_emb': it takes no float array"):
        TracedPipeline(gpt(), (tok[:2],), ["pos_emb"])


def test_balanced_works_on_the_traced_model():
    tok, _ = tokens()
    assert TracedPipeline.balanced(gpt(), (tok[:2],), 2).cuts == ["blocks.2"]
    assert TracedPipeline.balanced(gpt(), (tok[:2],), 2, by="flops").cuts == ["blocks.2"]
    four = TracedPipeline.balanced(gpt(), (tok[:2],), 4)
    assert len(four) == 4 and all(c.startswith("blocks.") or c in ("norm", "head") for c in four.cuts)
    with pytest.raises(UsageError, match=r"separates only at \['l3'\]"):
        TracedPipeline.balanced(Skip(), (np.ones((2, 4)),), 3)
