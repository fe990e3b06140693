"""DP × TP × PP × CP with ZeRO, SP and recompute train a GPT exactly as one process does.

Every configuration trains a float64 GPT for 3 AdamW steps on real device processes; the losses
and the final weights must equal ``nn.reference_train``'s (single-process, unsharded) within 1e-9.
The default run covers a representative subset; ``-m slow`` runs every factorisation of
dp × tp × pp × cp up to 8 devices with every schedule, zero 0/1/3, SP and recompute on and off.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from virtualpar import VirtualCluster, nn
from virtualpar.parallel import ParallelConfig, ParallelTrainer
from virtualpar.pipeline import SCHEDULES

STEPS, LR = 3, 1e-2
SCHEDULE_NAMES = [n for n in ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv") if n in SCHEDULES]


def make_gpt(layers: int = 4, heads: int = 4, **kw) -> nn.GPT:
    return nn.GPT(32, 16, layers, heads, 8, seed=3, dtype=np.float64, **kw)


def data(batch: int = 8, seq: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 32, (batch, seq)), rng.integers(0, 32, (batch, seq))


@functools.lru_cache(maxsize=None)
def reference(layers: int, heads: int, batch: int, model_kw: tuple = ()) -> tuple[list[float], dict]:
    tokens, targets = data(batch)
    model = make_gpt(layers, heads, **dict(model_kw))  # with dropout: step k's masks (reference_train)
    return nn.reference_train(model, [(tokens, targets)], nn.cross_entropy, nn.AdamW(LR), STEPS)


def check_exact(cfg: ParallelConfig, layers: int = 4, heads: int = 4, batch: int = 8,
                model_kw: tuple = (), cuts: tuple | None = None) -> None:
    tokens, targets = data(batch)
    want_losses, want = reference(layers, heads, batch, model_kw)
    model = make_gpt(layers, heads, **dict(model_kw))
    start = model.state_dict()
    trainer = ParallelTrainer(model, cfg, optimizer=nn.AdamW(LR), cuts=None if cuts is None else list(cuts))
    with VirtualCluster(cfg.mesh()) as cluster:
        losses = [cluster.execute(trainer, tokens, targets) for _ in range(STEPS)]
        got = trainer.state_dict(cluster)
    np.testing.assert_allclose(losses, want_losses, rtol=0, atol=1e-9)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-9, err_msg=k)
    assert max(np.abs(want[k] - start[k]).max() for k in want) > 1e-3  # the steps moved the weights


C = ParallelConfig
DEFAULT = {
    "dp2": C(dp=2),
    "dp2-M2-buckets": C(dp=2, microbatches=2, bucket_bytes=4096),
    "tp2": C(tp=2),
    "tp4": C(tp=4),
    "dp2-tp2": C(dp=2, tp=2),
    "dp2-zero1": C(dp=2, zero=1),
    "dp4-zero1-M2": C(dp=4, zero=1, microbatches=2),
    "dp2-zero3": C(dp=2, zero=3),
    "tp2-sp": C(tp=2, sequence_parallel=True),
    "dp2-tp4-sp-zero3": C(dp=2, tp=4, sequence_parallel=True, zero=3),
    "pp2-gpipe": C(pp=2, microbatches=2, schedule="gpipe"),
    "pp2-1f1b": C(pp=2, microbatches=2, schedule="1f1b"),
    "pp2-interleaved": C(pp=2, microbatches=2, schedule="interleaved_1f1b"),
    "pp2-zb_h1": C(pp=2, microbatches=2, schedule="zb_h1"),
    "pp2-zbv": C(pp=2, microbatches=2, schedule="zbv"),
    "cp2": C(cp=2),
    "cp4": C(cp=4),
    "cp2-tp2-sp": C(cp=2, tp=2, sequence_parallel=True),
    "dp2-cp2-zero1": C(dp=2, cp=2, zero=1),
    "tp2-recompute": C(tp=2, recompute=True),
    "dp2-zero3-recompute": C(dp=2, zero=3, recompute=True),
    "dp2-tp2-pp2-sp-zero1": C(dp=2, tp=2, pp=2, microbatches=2, sequence_parallel=True, zero=1),
    "tp2-pp2-cp2-recompute-zb": C(tp=2, pp=2, cp=2, microbatches=2, schedule="zb_h1", recompute=True),
    "dp2-pp2-cp2-zero3-interleaved": C(dp=2, pp=2, cp=2, microbatches=2, schedule="interleaved_1f1b", zero=3),
}


@pytest.mark.parametrize("name", list(DEFAULT))
def test_training_equals_one_process(name):
    check_exact(DEFAULT[name])


@pytest.mark.parametrize("model_kw", [(("mlp", "swiglu"), ("norm", "rmsnorm")), (("tie_embeddings", True),)],
                         ids=["swiglu-rmsnorm", "tied"])
def test_other_gpt_variants_train_exactly_under_tp_sp_and_dp(model_kw):
    check_exact(C(dp=2, tp=2, sequence_parallel=True, zero=1), model_kw=model_kw)


DROPOUT = {
    "dp2-M2": C(dp=2, microbatches=2),
    "tp2": C(tp=2),
    "tp2-sp": C(tp=2, sequence_parallel=True),
    "cp2": C(cp=2),
    "cp2-tp2-sp": C(cp=2, tp=2, sequence_parallel=True),
    "pp2-1f1b-M2": C(pp=2, microbatches=2),
    "tp2-recompute-zero3": C(dp=2, tp=2, recompute=True, zero=3),
    "dp2-tp2-pp2-sp-zero1": C(dp=2, tp=2, pp=2, microbatches=2, sequence_parallel=True, zero=1),
}


@pytest.mark.parametrize("name", list(DROPOUT))
def test_training_with_dropout_equals_one_process(name):
    """Every device draws its piece of each mask at its global rows, positions and heads, so the
    same elements drop as in one process given the step (``model(tokens, step=k)``)."""
    check_exact(DROPOUT[name], model_kw=(("dropout", 0.2),))


def test_one_process_with_microbatches_draws_each_microbatch_s_rows_of_the_masks():
    """reference_train's microbatches take their rows of the batch's masks: the mean of their
    gradients is the whole batch's, as without dropout (to rounding: 1e-12 of the losses; the key
    bias, whose gradient is a sum of cancelling terms, within 1e-11)."""
    tokens, targets = data()
    want = reference(4, 4, 8, (("dropout", 0.2),))
    got = nn.reference_train(make_gpt(dropout=0.2), [(tokens, targets)], nn.cross_entropy, nn.AdamW(LR),
                             STEPS, microbatches=4)
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-12)
    for k in want[1]:
        np.testing.assert_allclose(got[1][k], want[1][k], rtol=0, atol=1e-11, err_msg=k)


def test_dropout_draws_different_masks_per_step_and_layer_and_none_without_a_step():
    model = make_gpt(2, dropout=0.5)
    tokens, _ = data()
    plain = model(tokens)
    assert np.array_equal(plain, make_gpt(2)(tokens))  # no step: no dropout (torch's eval())
    a, b, again = model(tokens, step=0), model(tokens, step=1), model(tokens, step=0)
    assert np.array_equal(a, again) and not np.allclose(a, b) and not np.allclose(a, plain)
    d0, d1 = model.dropout_at(0, 0, (8, 8)), model.dropout_at(0, 1, (8, 8))
    m0, m1 = d0.hidden(2, (8, 8, 16)), d1.hidden(2, (8, 8, 16))
    assert not np.array_equal(m0, m1) and abs(m0.mean() - 0.5) < 0.05  # 1024 draws: within 3 sigma
    assert np.array_equal(d0.at(row0=2, pos0=3).hidden(2, (4, 5, 16)), m0[2:6, 3:8])  # a piece of it


def every_configuration():
    """Every (dp, tp, pp, cp) with product <= 8; every schedule when pp > 1; zero 0/1/3 (1 and 3 only
    with dp > 1); SP on and off (with tp > 1); recompute on and off (on: with dropout, whose masks
    the recomputation must draw again)."""
    for dp, tp, pp, cp in itertools.product((1, 2, 4, 8), repeat=4):
        if dp * tp * pp * cp > 8:
            continue
        for schedule in (SCHEDULE_NAMES if pp > 1 else ["1f1b"]):
            for zero in ((0, 1, 3) if dp > 1 else (0,)):
                for sp in ((False, True) if tp > 1 else (False,)):
                    for recompute in (False, True):
                        yield dp, tp, pp, cp, schedule, zero, sp, recompute


@pytest.mark.slow
@pytest.mark.parametrize("dp,tp,pp,cp,schedule,zero,sp,recompute", list(every_configuration()))
def test_every_configuration_up_to_8_devices_equals_one_process(dp, tp, pp, cp, schedule, zero, sp,
                                                                 recompute):
    chunks = 2 if schedule in ("interleaved_1f1b", "zbv") else 1
    microbatches = pp  # interleaved takes microbatches in groups of pp
    cfg = C(dp=dp, tp=tp, pp=pp, cp=cp, microbatches=microbatches, schedule=schedule, zero=zero,
            sequence_parallel=sp, recompute=recompute)
    check_exact(cfg, layers=pp * chunks, heads=8 if tp == 8 else 4, batch=dp * microbatches,
                model_kw=(("dropout", 0.2),) if recompute else ())


def test_uneven_cuts_train_exactly():
    check_exact(C(pp=2, tp=2, microbatches=2, sequence_parallel=True), layers=3, cuts=("blocks.1",))
