"""The planner's modelled step is the modelled clock of executed runs; its ranking holds when the top
configurations run for real; configurations that do not fit are left out."""

from __future__ import annotations

import json

import numpy as np
import pytest

from virtualpar import VirtualCluster, nn
from virtualpar.cli import main
from virtualpar.commands.plan import confirm, distinct
from virtualpar.parallel import ParallelConfig as C
from virtualpar.parallel import ParallelTrainer
from virtualpar.parallel.plan import configurations, device_memory, estimate, plan
from virtualpar.sim.hardware import get_hardware

H100 = get_hardware("h100-node")


def gpt() -> nn.GPT:
    return nn.GPT(64, 32, 4, 4, 16, seed=2)


def real_step(cfg: C, batch: int = 8) -> tuple[float, list]:
    """The modelled clock of the second of two executed steps, and the devices' memory ledgers."""
    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 64, (batch, 16)), rng.integers(0, 64, (batch, 16))
    trainer = ParallelTrainer(gpt(), cfg)
    with VirtualCluster(cfg.mesh(), hardware=H100) as cluster:
        for _ in range(2):
            cluster.execute(trainer, tokens, targets)
        return trainer.last_step_time, trainer.memory(cluster)


@pytest.mark.parametrize("cfg", [C(dp=4), C(dp=2, tp=2), C(pp=2, dp=2, microbatches=2, schedule="gpipe"),
                                 C(pp=2, tp=2, microbatches=4, zero=0),
                                 C(dp=2, pp=2, microbatches=2, zero=1), C(dp=2, pp=2, microbatches=2, zero=3),
                                 C(dp=4, zero=3)],
                         ids=["dp4", "dp2-tp2", "pp2-dp2-gpipe", "pp2-tp2-M4", "dp2-pp2-zero1",
                              "dp2-pp2-zero3", "dp4-zero3"])
def test_the_modelled_step_is_the_executed_run_s_modelled_clock(cfg):
    want, ledgers = real_step(cfg)
    got = estimate(gpt(), cfg, 8, 16, H100)
    assert got.step_time == pytest.approx(want, rel=1e-6)
    forms = device_memory(gpt(), cfg, 8, 16, 4)
    for r, dev in enumerate(ledgers):
        for kind in ("params", "grads", "optimizer", "activations"):
            assert dev[kind] == forms[cfg.mesh().index(r).pp][kind], kind


@pytest.mark.parametrize("cfg", [C(tp=2, dp=2, sequence_parallel=True), C(tp=2, cp=2),
                                 C(pp=2, tp=2, microbatches=2, schedule="interleaved_1f1b", recompute=True)],
                         ids=["tp2-sp", "tp2-cp2", "interleaved-recompute"])
def test_sp_cp_and_recompute_are_modelled_within_ten_percent(cfg):
    want, _ = real_step(cfg)
    assert estimate(gpt(), cfg, 8, 16, H100).step_time == pytest.approx(want, rel=0.1)


def test_the_top_three_at_8_devices_keep_their_order_on_the_modelled_clock_of_real_runs():
    model = nn.GPT.preset("tiny")
    fit, _ = plan(model, 8, H100, 8)
    picked = distinct(fit, 3)
    assert len(picked) == 3 and picked[0] is fit[0]
    real = confirm("tiny", picked, 8, 32, "h100-node", "float32")
    assert real == sorted(real) and len(set(real)) == 3


def test_every_configuration_uses_every_device_and_divides_the_model():
    model = gpt()
    found = list(configurations(model, 8, 8, 16))
    assert len(found) == len(set(found)) > 100
    for cfg in found:
        assert cfg.size == 8
        cfg.check_model(model)
        cfg.check_batch((8, 16), 16)
    assert {c.schedule for c in found if c.pp > 1} >= {"gpipe", "1f1b", "zb_h1"}
    assert any(c.cp == 2 and c.tp == 2 and c.sequence_parallel and c.recompute for c in found)


def test_configurations_that_do_not_fit_are_left_out():
    model = gpt()
    everything, none_out = plan(model, 8, H100, 8, 16)
    assert none_out == 0
    limit = sorted(e.memory["total"] for e in everything)[len(everything) // 2]
    fit, out = plan(model, 8, H100, 8, 16, capacity=limit)
    assert out > 0 and len(fit) + out == len(everything)
    assert all(e.memory["total"] <= limit for e in fit)
    assert [e.step_time for e in fit] == sorted(e.step_time for e in fit)


def test_plan_json_ranks_and_explains(capsys):
    assert main(["plan", "--model", "tiny", "--devices", "4", "--json", "--top", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    times = [r["step_seconds"] for r in out["ranking"]]
    assert len(times) == 3 and times == sorted(times) and out["fit"] > 3
    assert {"bubble", "comm_seconds", "dp_comm_seconds", "memory_bytes", "mfu"} <= set(out["ranking"][0])
    assert main(["plan", "--model", "tiny", "--devices", "4", "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert "why #1 wins" in text and "bubble" in text and "exposed communication" in text


@pytest.mark.parametrize("argv, words", [(["--devices", "12"], "--hardware"),
                                         (["--devices", "16", "--hardware", "h100-node"], "single node"),
                                         (["--model", "tiny", "--memory", "0.0000001"], "fits in")])
def test_plan_usage_errors_exit_2(capsys, argv, words):
    assert main(["plan", *argv]) == 2
    assert words in capsys.readouterr().err


def test_groups_inside_a_node_take_nvlink_and_groups_across_nodes_infiniband():
    """Axes are laid out dp, pp, cp, tp (tp fastest): on 64 GPUs in nodes of 8, tp=8 stays in a node,
    dp=8 crosses nodes; tp=2 × pp=4 fill a node, so dp's groups cross nodes and pp's do not."""
    from virtualpar.parallel.plan_model import _links

    hw = get_hardware("h100-cluster")
    nvlink, ib = (hw.intra_latency, hw.intra_bandwidth), (hw.inter_latency, hw.inter_bandwidth)
    links = _links(hw, C(dp=8, tp=8))
    assert links["tp"] == nvlink and links["dp"] == ib
    links = _links(hw, C(dp=8, tp=2, pp=4))
    assert links["tp"] == links["pp"] == nvlink and links["dp"] == ib
    assert _links(hw, C(pp=16, tp=4))["pp"] == ib


def test_small_on_64_devices_ranks_thousands_of_configurations_and_beats_pure_data_parallelism():
    fit, out = plan(nn.GPT.preset("small"), 64, "h100-cluster", 64)
    assert len(fit) > 1000 and out == 0
    best = fit[0]
    assert best.config.size == 64 and best.step_time == min(e.step_time for e in fit)
    assert best.step_time < next(e for e in fit if e.config.dp == 64).step_time


def test_overlapped_buckets_by_hand():
    """Three units, one bucket each, in the backward's order final (1 s forward), blocks.0 (2 s),
    embed (0 s); a backward of 6 s from 0 to 6: final's gradient is final at 6 − 6·2/3 = 2, the
    others at 6.  Buckets of 3 s on a free stream: 2 → 5, 6 → 9, 9 → 12.  Buckets of 0.5 s: 2.5,
    6.5, 7.  A stream busy until 8 (another stage's buckets): 11, 14, 17."""
    from types import SimpleNamespace as U

    from virtualpar.parallel.plan_dp import overlapped

    units = [U(name="embed", padded=100), U(name="blocks.0", padded=100), U(name="final", padded=100)]
    times = {"embed": 0.0, "blocks.0": 2.0, "final": 1.0}
    assert overlapped(units, times, 6.0, 6.0, 0.0, 4, 400, lambda n: 3.0, 0.0) == 12.0
    assert overlapped(units, times, 6.0, 6.0, 0.0, 4, 400, lambda n: 0.5, 0.0) == 7.0
    assert overlapped(units, times, 6.0, 6.0, 8.0, 4, 400, lambda n: 3.0, 0.0) == 17.0
    assert overlapped(units, times, 9.0, 6.0, 0.0, 4, 400, lambda n: 3.0, 0.0) == 15.0  # from 3 to 9
    sizes = []  # one bucket of all three when they fit: it starts when the compute is done
    assert overlapped(units, times, 6.0, 6.0, 0.0, 4, 1200, lambda n: sizes.append(n) or 3.0, 0.0) == 9.0
    assert sizes == [1200]
