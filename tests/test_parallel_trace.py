"""A model with its own forward is traced once, cut at named calls (``Pipeline(model, cuts=[...])``),
and trained by the one pipeline executor (``PipelinedOperation``) exactly as one process trains it;
cuts the trace cannot separate are refused by name.  The Sequential path is tested in the pipeline
tests, unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import UsageError, VirtualCluster, nn
from virtualpar.parallel import TracedPipeline as ReExported
from virtualpar.pipeline import Pipeline, PipelinedOperation, TracedPipeline, trace_calls


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
    pipe = Pipeline(gpt(), cuts=cuts)  # a GPT traces itself on (1, seq_len) tokens
    assert isinstance(pipe, TracedPipeline) and pipe.cuts == cuts and ReExported is TracedPipeline
    op = PipelinedOperation(pipe, schedule, 2, loss=nn.cross_entropy, optimizer=nn.AdamW(1e-2))
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
    op = PipelinedOperation(Pipeline(Skip(), ["l3"], example_inputs=(x,)), "1f1b", 2, optimizer=nn.SGD(0.1))
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
        Pipeline(model(), cuts, example_inputs=(np.ones((2, 4)),))


def test_tied_weights_and_calls_without_an_activation_cannot_start_a_stage():
    tok, _ = tokens()
    with pytest.raises(UsageError, match=r"parameter 'head.embedding.weight' is read by tok_emb \(stage 0\) "
                                         r"and by head \(stage 1\)"):
        Pipeline(gpt(tie_embeddings=True), ["blocks.2"], example_inputs=tok[:2])
    with pytest.raises(UsageError, match=r"cannot cut at 'pos_emb': it takes no float array"):
        Pipeline(gpt(), ["pos_emb"])


def test_balanced_works_on_the_traced_model():
    tok, _ = tokens()
    assert Pipeline.balanced(gpt(), 2).cuts == ["blocks.2"]
    assert Pipeline.balanced(gpt(), 2, by="flops", example_inputs=tok[:2]).cuts == ["blocks.2"]
    four = Pipeline.balanced(gpt(), 4)
    assert len(four) == 4 and all(c.startswith("blocks.") or c in ("norm", "head") for c in four.cuts)
    with pytest.raises(UsageError, match=r"separates only at \['l3'\]"):
        Pipeline.balanced(Skip(), 3, example_inputs=np.ones((2, 4)))


class Residual(nn.Module):
    """``l2(l1(x)) + x``: the model's input reaches its output."""

    def __init__(self) -> None:
        self.l1 = nn.Linear(4, 4, seed=1, dtype=np.float64)
        self.l2 = nn.Linear(4, 4, seed=2, dtype=np.float64)

    def forward(self, x):
        return self.l2(self.l1(x)) + x


def test_a_later_stage_reading_the_model_s_input_is_refused_and_a_module_needs_example_inputs():
    with pytest.raises(UsageError, match=r"the model's output \(stage 1\) reads a value computed from the "
                                         r"model's input 0, which only the first stage receives"):
        Pipeline(Residual(), ["l2"], example_inputs=np.ones((2, 4)))
    with pytest.raises(UsageError, match=r"cutting a Skip \(not an nn.Sequential\) traces its forward once, "
                                         r"which needs example inputs"):
        Pipeline(Skip(), ["l3"])
    with pytest.raises(UsageError, match=r"cuts of a traced model are call names, one of \['l2', 'l3'\]"):
        Pipeline(Skip(), [1], example_inputs=np.ones((2, 4)))


def test_the_sequential_path_is_unchanged_and_traced_stages_count_their_calls():
    seq = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    pipe = Pipeline(seq, [1])
    assert type(pipe) is Pipeline and list(pipe.stages[1].parameters()) == ["1.weight", "1.bias"]
    traced = Pipeline(gpt(), cuts=["blocks.2"])
    model = gpt()
    later = ("blocks.2.", "blocks.3.", "norm.", "head.")
    assert list(traced.stages[1].parameters()) == [k for k in model.state_dict() if k.startswith(later)]
    from virtualpar.pipeline.partition import forward_flops
    want = sum(forward_flops(m, 3) for m in (model.blocks[2], model.blocks[3], model.norm, model.head))
    assert traced.stages[1].flops(3) == want > 0


def test_a_traced_gpt_trains_exactly_with_data_parallel_replicas():
    """The traced stages are ordinary pipeline stages: a dp axis, a pp axis, the executor's checks."""
    from virtualpar import Mesh

    tok, tgt = tokens()
    want_losses, want = nn.reference_train(gpt(), [(tok, tgt)], nn.cross_entropy, nn.AdamW(1e-2), 2, 2)
    op = PipelinedOperation(Pipeline(gpt(), cuts=["blocks.1"]), "1f1b", 1, loss=nn.cross_entropy,
                            optimizer=nn.AdamW(1e-2), axis="pp", dp_axis="dp")
    with VirtualCluster(Mesh({"dp": 2, "pp": 2})) as cluster:
        losses = [cluster.execute(op, tok, tgt) for _ in range(2)]
        got = op.state_dict(cluster)
    np.testing.assert_allclose(losses, want_losses, rtol=0, atol=1e-12)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-12, err_msg=k)
