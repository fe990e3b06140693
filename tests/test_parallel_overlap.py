"""zero=0's bucket all-reduces beside the backward on the communication stream
(:mod:`virtualpar.parallel.overlap`): a stage's input gradient leaves at once and the rank goes on
with its next stage, so overlap never makes a pipelined step slower, and the planner models exactly
what runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

import virtualpar.parallel.trainer as trainer_module
from virtualpar import VirtualCluster, nn
from virtualpar.parallel import ParallelConfig as C
from virtualpar.parallel import ParallelTrainer
from virtualpar.parallel.plan import estimate
from virtualpar.sim.hardware import DeviceSpec, Hardware, get_hardware

ALPHA = 1e-6
# free compute and free bandwidth: every message costs α, so the step counts messages
FREE = Hardware.uniform(latency=ALPHA, bandwidth=math.inf,
                        device=DeviceSpec("free", {"float32": math.inf}, math.inf, math.inf))
H100 = get_hardware("h100-node")
CONFIGS = [dict(dp=2, pp=2, microbatches=2, schedule="gpipe"),
           dict(dp=2, pp=2, microbatches=2, schedule="1f1b"), dict(dp=2)]
IDS = ["dp2-pp2-gpipe", "dp2-pp2-1f1b", "dp2"]


def gpt() -> nn.GPT:
    return nn.GPT(64, 32, 4, 4, 16, seed=2)  # 2 stages: embed, blocks.0, blocks.1 | blocks.2, blocks.3, final


def executed(cfg: C, hardware: Hardware) -> float:
    """The modelled clock of the second of two executed steps (the slowest device)."""
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 64, (8, 16)), rng.integers(0, 64, (8, 16))
    trainer = ParallelTrainer(gpt(), cfg)
    with VirtualCluster(cfg.mesh(), hardware=hardware) as cluster:
        for _ in range(2):
            cluster.execute(trainer, tokens, targets)
        return trainer.last_step_time


@pytest.mark.parametrize("kw, alphas", [(CONFIGS[0], 8), (CONFIGS[1], 8), (CONFIGS[2], 12)], ids=IDS)
def test_the_step_by_hand_on_free_compute(kw, alphas):
    """One unit per bucket; a ring all-reduce of 2 costs 2α, a p2p α.  dp2 alone: 6 units, 12α.
    dp2×pp2 (gpipe or 1f1b, M=2): stage 1 sends its input gradients at α while its stream reduces
    its 3 buckets (ends at 7α); stage 0 receives them at 2α and reduces its 3 (ends at 8α).  Had
    stage 1 reduced before sending, stage 0 would have received at 8α and ended at 14α."""
    cfg = C(bucket_bytes=1, **kw)
    assert executed(cfg, FREE) == pytest.approx(alphas * ALPHA, rel=1e-9)
    assert estimate(gpt(), cfg, 8, 16, FREE).step_time == pytest.approx(alphas * ALPHA, rel=1e-9)


@pytest.mark.parametrize("kw", CONFIGS, ids=IDS)
def test_overlap_never_makes_the_step_slower_and_the_planner_models_it(kw, monkeypatch):
    """Small buckets (several per stage) on an H100 node: the step with the buckets beside the
    backward is shorter than the step with the same buckets reduced after the pipeline (the hook
    off); the planner's step is the executed one."""
    cfg = C(bucket_bytes=20000, **kw)
    with_overlap = executed(cfg, H100)
    assert estimate(gpt(), cfg, 8, 16, H100).step_time == pytest.approx(with_overlap, rel=1e-9)
    monkeypatch.setattr(trainer_module, "on_grads", None)
    without = executed(cfg, H100)
    assert with_overlap < without  # strictly: stage 0's (the only stage's) buckets hide behind its backward


RANKS_WITH_TWO_STAGES = [dict(dp=2, pp=2, microbatches=4, schedule="interleaved_1f1b"),
                         dict(dp=2, pp=2, microbatches=2, schedule="zbv")]


@pytest.mark.parametrize("kw", RANKS_WITH_TWO_STAGES, ids=["interleaved", "zbv"])
def test_a_stage_that_sends_its_input_gradient_still_hides_its_buckets(kw, monkeypatch):
    """A rank holding two stages: the later stage's last backward sends its input gradient, and
    the rank goes on with the earlier stage's backwards while the later stage's buckets run on the
    stream — strictly faster than reducing them after the pipeline (interleaved 1F1B: 28.4 µs
    against 32.4 µs here), and the planner's step is the executed one."""
    cfg = C(bucket_bytes=20000, **kw)
    with_overlap = executed(cfg, H100)
    assert estimate(gpt(), cfg, 8, 16, H100).step_time == pytest.approx(with_overlap, rel=1e-9)
    monkeypatch.setattr(trainer_module, "on_grads", None)
    assert with_overlap < 0.95 * executed(cfg, H100)
