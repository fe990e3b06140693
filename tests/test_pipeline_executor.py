"""The pipeline executor on real device processes: seed 003's MLP trained under every schedule
equals single-process training; the executed run's modelled clock reproduces the closed forms;
the edge cases that hang real libraries work or fail with a message."""

from __future__ import annotations

import re

import numpy as np
import pytest

from virtualpar import Mesh, UsageError, VirtualCluster, nn
from virtualpar.pipeline import SCHEDULES, Pipeline, PipelinedOperation, PipelineError
from virtualpar.sim import Hardware
from virtualpar.sim.hardware import DeviceSpec

SIZES = (256, 512, 1024, 512, 256)  # seed 003's 4-stage MLP
UNIT_HW = Hardware.unit()


def seed_mlp(dtype=np.float64) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(nn.Linear(a, b, seed=i, dtype=dtype))
        if i < 3:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def deep_mlp(depth: int = 8, width: int = 16) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(width, width, seed=i, dtype=np.float64) for i in range(depth)])


def _data(rows: int, features: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, features)), rng.standard_normal((rows, features))


def _close(got: dict, want: dict, rtol: float = 1e-9) -> None:
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=1e-12 * float(np.abs(want[k]).max()),
                                   err_msg=k)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_seed_mlp_trains_under_every_schedule_exactly_as_one_process(name):
    x, y = _data(16, 256)
    steps, M = 3, 4
    ref_losses, ref_state = nn.reference_train(seed_mlp(), [(x, y)], nn.mse_loss, nn.SGD(0.05), steps, M)
    if name in ("interleaved_1f1b", "looped_bfs", "zbv"):
        model = seed_mlp()
        pipe, ranks = Pipeline(model, cuts=[1, 2, 3]), 2  # 4 stages on 2 ranks, 2 chunks each
    else:
        model = seed_mlp()
        pipe, ranks = Pipeline(model, cuts=[2, 4, 6]), 4
    op = PipelinedOperation(pipe, name, microbatches=M, optimizer=nn.SGD(0.05))
    with VirtualCluster(ranks) as cluster:
        losses = [cluster.execute(op, x, y) for _ in range(steps)]
        state = op.state_dict(cluster)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-9)
    _close(state, ref_state)
    assert losses[-1] < losses[0]


def test_every_schedule_runs_in_strict_mode():
    """With every send waiting for its receive (``eager_limit=0``), as above MPI's eager limit.
    zbv's sends to one peer cross tags: its receives come in another order than its sends, which
    strict mode used to call a deadlock (one rendezvous offer per channel at a time)."""
    x, y = _data(16, 256)
    ref_losses, _ = nn.reference_train(seed_mlp(), [(x, y)], nn.mse_loss, nn.SGD(0.05), 2, 8)
    for name in SCHEDULES:
        two = name in ("interleaved_1f1b", "looped_bfs", "zbv")
        pipe, ranks = (Pipeline(seed_mlp(), cuts=[1, 2, 3]),
                       2) if two else (Pipeline(seed_mlp(), cuts=[2, 4, 6]), 4)
        op = PipelinedOperation(pipe, name, microbatches=8, optimizer=nn.SGD(0.05))
        with VirtualCluster(ranks, eager_limit=0, timeout=20) as cluster:
            losses = [cluster.execute(op, x, y) for _ in range(2)]
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-9, err_msg=name)


def test_adam_and_a_data_parallel_axis_match_the_reference():
    x, y = _data(16, 16, seed=3)
    ref_losses, ref_state = nn.reference_train(deep_mlp(4), [(x, y)], nn.mse_loss, nn.Adam(0.01), 3, 4)
    op = PipelinedOperation(Pipeline(deep_mlp(4), cuts=[2]), "1f1b", microbatches=2, optimizer=nn.Adam(0.01),
                            axis="pp", dp_axis="dp")
    with VirtualCluster(Mesh({"dp": 2, "pp": 2})) as cluster:
        losses = [cluster.execute(op, x, y) for _ in range(3)]
        state = op.state_dict(cluster)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-9)
    _close(state, ref_state)


def test_a_batch_the_data_parallel_replicas_cannot_share_equally_is_refused():
    """9 rows on dp=2 gave the replicas 5 and 4 rows and averaged their gradients as equals (not the
    batch's mean gradient); 1 row left a replica empty and halved the loss.  Refused, as an uneven
    microbatch split is."""
    op = PipelinedOperation(Pipeline(deep_mlp(4), cuts=[2]), "1f1b", microbatches=1, axis="pp", dp_axis="dp")
    with VirtualCluster(Mesh({"dp": 2, "pp": 2})) as cluster:
        for rows in (9, 1):
            with pytest.raises(UsageError,
                               match=f"a batch of {rows} rows does not split into 2 equal data-parallel "
                                                 "replicas \\(mesh axis 'dp'\\)"):
                cluster.execute(op, *_data(rows, 16))
        x, y = _data(8, 16)
        ref_losses, _ = nn.reference_train(deep_mlp(4), [(x, y)], nn.mse_loss, nn.SGD(0.1), 1, 2)
        assert cluster.execute(op, x, y) == pytest.approx(ref_losses[0], rel=1e-12)


@pytest.mark.parametrize("axes, suggested",
                         [({"dp_axis": "dp"}, "axis='pp'"), ({"axis": "pp", "dp_axis": "pp"}, "axis='dp'")])
def test_pipeline_and_data_parallel_axes_must_not_overlap(axes, suggested):
    """dp_axis without axis made every device a pipeline rank ("on 4 pipeline ranks ... cut the model
    into 4 stages"); the same axis for both ran into a CollectiveMismatch or a Deadlock."""
    op = PipelinedOperation(Pipeline(deep_mlp(4), cuts=[2]), "1f1b", microbatches=1, **axes)
    with VirtualCluster(Mesh({"dp": 2, "pp": 2})) as cluster:
        with pytest.raises(UsageError, match=f"share .*{suggested}"):
            cluster.execute(op, *_data(4, 16))


def test_timeline_refuses_a_clock_it_does_not_know():
    op = PipelinedOperation(Pipeline(deep_mlp(2), cuts=[1]), "1f1b", microbatches=2)
    with VirtualCluster(2) as cluster:
        cluster.execute(op, *_data(4, 16))
    assert "0F0" in op.timeline(clock="wall")
    with pytest.raises(UsageError, match="unknown clock 'Model'; choose one of 'model', 'wall'"):
        op.timeline(clock="Model")  # was the wall clock, silently


def test_the_timeline_shows_actions_that_took_no_time():
    """A W of cost 0 starts when the next action does: the grid by order of start put both in one
    column and showed 46 of zb_h1's 48 actions."""
    from virtualpar.pipeline import Action
    from virtualpar.pipeline.executor import format_timeline
    rows = {0: [(Action(0, "F", 0), (0.0, 1.0)), (Action(0, "I", 0), (1.0, 2.0)),
                (Action(0, "W", 0), (2.0, 2.0)), (Action(0, "F", 1), (2.0, 3.0))],
            1: [(Action(1, "F", 0), (1.0, 2.5)), (Action(1, "I", 0), (2.5, 3.0)),
                (Action(1, "W", 0), (3.0, 3.0))]}
    text = format_timeline(rows)
    assert sorted(re.findall(r"\d+[FIW]\d+", text)) == sorted(str(a) for acts in rows.values() for a,
                                                              _ in acts)
    op = PipelinedOperation(Pipeline(deep_mlp(4), cuts=[1, 2, 3]), "zb_h1", microbatches=4,
                            costs={"F": 1, "B": 2, "I": 1, "W": 0})
    with VirtualCluster(4, hardware=UNIT_HW) as cluster:
        cluster.execute(op, *_data(8, 16))
    shown = re.findall(r"\d+[FBIW]\d+", op.timeline())
    assert len(shown) == len(set(shown)) == 4 * 4 * 3  # F, I and W of 4 microbatches on 4 stages


def test_a_refused_step_leaves_the_operation_usable_on_a_cluster_that_fits():
    """The first call's schedule, built for the wrong number of ranks, was kept: the right cluster
    was then refused with "on 3 pipeline ranks runs 2 stages"."""
    x, y = _data(4, 16, seed=2)
    ref_losses, ref_state = nn.reference_train(deep_mlp(3), [(x, y)], nn.mse_loss, nn.SGD(0.1), 1, 2)
    op = PipelinedOperation(Pipeline(deep_mlp(3), cuts=[1, 2]), "1f1b", microbatches=2)
    with VirtualCluster(2) as small:
        with pytest.raises(UsageError, match="on 2 pipeline ranks runs 2 stages, but the pipeline has 3"):
            small.execute(op, x, y)
    with VirtualCluster(3) as fits:
        assert fits.execute(op, x, y) == pytest.approx(ref_losses[0], rel=1e-12)
        _close(op.state_dict(fits), ref_state)


def test_every_stage_is_charged_its_flops_on_the_modelled_clock():
    """Four identical layers, one per stage: every stage's F and B take the same modelled time,
    2·rows·16·16 FLOPs forward (and twice that backward) on the device's peak.  The stages between
    the first and the last hold neither the batch nor the targets, and were charged nothing."""
    hw = Hardware.uniform(latency=0.0, bandwidth=float("inf"),
                          device=DeviceSpec("flop", {"float32": 1.0, "float64": 1.0}, float("inf"),
                                            float("inf")))
    op = PipelinedOperation(Pipeline(deep_mlp(4), cuts=[1, 2, 3]), "1f1b", microbatches=4)
    with VirtualCluster(4, hardware=hw) as cluster:
        cluster.execute(op, *_data(32, 16))
    flops = op.pipeline.stages[1].flops(1) * 8  # 8 rows per microbatch
    assert flops >= 2 * 8 * 16 * 16
    for rank, records in op.last_records.items():
        took = {str(a): m1 - m0 for a, _, _, m0, m1 in records}
        assert took[f"{rank}F0"] == pytest.approx(flops) and took[f"{rank}B0"] == pytest.approx(
            2 * flops
        ), rank


def test_one_operation_is_one_run_whichever_cluster_takes_its_next_step(caplog):
    """A second cluster started again from the model's weights, silently (issue 43); now each step
    continues from the last committed one, wherever it was taken, and a cluster left behind (stale)
    gets the committed state placed again, momentum included."""
    x, y = _data(8, 16, seed=5)
    opt = lambda: nn.SGD(0.05, momentum=0.9)  # noqa: E731
    ref_losses, ref_state = nn.reference_train(deep_mlp(4), [(x, y)], nn.mse_loss, opt(), 4, 2)
    op = PipelinedOperation(Pipeline(deep_mlp(4), cuts=[2]), "1f1b", microbatches=2, optimizer=opt())
    with VirtualCluster(2) as first, VirtualCluster(2) as second:
        with pytest.raises(UsageError, match="has not run on this cluster"):
            op.state_dict(first)
        losses = [first.execute(op, x, y), second.execute(op, x, y), second.execute(op, x, y)]
        with pytest.raises(UsageError, match="this cluster holds an older state than the 3 steps committed"):
            op.state_dict(first)  # it holds step 1: stale weights would be a silent wrong answer
        committed = op.committed_state_dict()
        np.testing.assert_array_equal(op.state_dict(second)["0.weight"], committed["0.weight"])
        losses.append(first.execute(op, x, y))
        state = op.state_dict(first)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-9)
    _close(state, ref_state)
    assert op.step == 4
    for step in (1, 3):
        assert f"resuming {op.key} from step {step} (it moves from another cluster)" in caplog.text


@pytest.mark.parametrize("S, M", [(1, 1), (1, 3), (2, 1), (2, 4), (3, 2), (4, 8)])
def test_executed_modelled_clock_reproduces_the_closed_forms(S, M):
    """Unit costs (F = B = 1 FLOP on a 1 FLOP/s device) and free links: the run's own modelled
    clock shows 2(M+S-1) steps for GPipe and 1F1B, and each action where the simulator puts it."""
    for name in ("gpipe", "1f1b"):
        op = PipelinedOperation(Pipeline(deep_mlp(S), cuts=list(range(1, S))), name, microbatches=M,
                                costs={"F": 1, "B": 1})
        x, y = _data(2 * M, 16)
        with VirtualCluster(S, hardware=UNIT_HW) as cluster:
            cluster.execute(op, x, y)
            makespan = max(cluster.clocks())
        assert makespan == 2 * (M + S - 1)
        busy = 2 * M * S
        assert 1 - busy / (S * makespan) == pytest.approx((S - 1) / (M + S - 1), abs=1e-12)
        text = op.timeline()
        assert (
            text.count("F") - 0 >= S * M
            and sum(text.count(f"{s}B{m}") for s in range(S) for m in range(M)) == S * M
        )


def test_interleaved_executed_bubble_closed_form():
    S, M, V = 2, 4, 2
    op = PipelinedOperation(Pipeline(deep_mlp(S * V), cuts=[1, 2, 3]), "interleaved_1f1b", microbatches=M,
                            costs={"F": 1, "B": 1})
    x, y = _data(8, 16)
    with VirtualCluster(S, hardware=UNIT_HW) as cluster:
        cluster.execute(op, x, y)
        makespan = max(cluster.clocks())
    assert 1 - (2 * V * M * S) / (S * makespan) == pytest.approx((S - 1) / (V * M + S - 1), abs=1e-12)


def test_interleaved_with_unsuitable_microbatches_says_why():
    op = PipelinedOperation(Pipeline(deep_mlp(4), cuts=[1, 2, 3]), "interleaved_1f1b", microbatches=3)
    x, y = _data(6, 16)
    with VirtualCluster(2) as cluster:
        with pytest.raises(UsageError, match="microbatches must be a multiple of 2; got 3"):
            cluster.execute(op, x, y)


def test_mismatched_activation_shapes_name_both_stages():
    model = nn.Sequential(nn.Linear(16, 8, dtype=np.float64), nn.Linear(12, 16, seed=1, dtype=np.float64))
    op = PipelinedOperation(Pipeline(model, cuts=[1]), "1f1b", microbatches=2)
    x, y = _data(4, 16)
    with VirtualCluster(2) as cluster:
        with pytest.raises(PipelineError,
                           match=r"device 1 .*stage 1 \(pipeline rank 1\) cannot take stage 0's activation "
                                                r"of shape \(2, 8\).*expected input of shape \(\.\.\., 12\)"):
            cluster.execute(op, x, y)


def test_stage_count_must_fit_the_ranks():
    op = PipelinedOperation(Pipeline(deep_mlp(3), cuts=[1, 2]), "1f1b", microbatches=2)
    with VirtualCluster(2) as cluster:
        with pytest.raises(UsageError, match="runs 2 stages, but the pipeline has 3"):
            cluster.execute(op, *_data(4, 16))


def test_the_executed_step_is_in_the_cluster_trace_for_the_two_clock_views(tmp_path):
    import json

    S, M = 2, 3
    op = PipelinedOperation(Pipeline(deep_mlp(S), cuts=[1]), "1f1b", microbatches=M, costs={"F": 1, "B": 1})
    x, y = _data(2 * M, 16)
    with VirtualCluster(S, hardware=UNIT_HW) as cluster:
        cluster.execute(op, x, y)
        trace = cluster.trace()
    compute = [e for e in trace if e.kind == "compute" and e.name in ("F", "B")]
    assert sorted((e.rank, e.name) for e in compute) == sorted(
        (r, k) for r in range(S) for k in "FB" for _ in range(M)
    )
    # the closed form, on the trace's modelled clock
    assert max(e.model_end for e in compute) == 2 * (M + S - 1)
    path = trace.write_chrome(str(tmp_path / "pipe.json"), clock="model")
    assert any(ev.get("name") == "F" for ev in json.load(open(path))["traceEvents"])


def test_executed_zero_bubble_beats_1f1b_at_the_same_peak():
    """ZB-H1 on real devices, F = I = W = 1 and B = 2 on the modelled clock: the paper's 27 steps
    against 1F1B's 33, no rank holding more microbatches than 1F1B's first (from the executed records)."""
    S, M = 4, 8
    results = {}
    for name in ("1f1b", "zb_h1"):
        op = PipelinedOperation(Pipeline(deep_mlp(S), cuts=[1, 2, 3]), name, microbatches=M,
                                costs={"F": 1, "B": 2, "I": 1, "W": 1})
        with VirtualCluster(S, hardware=UNIT_HW) as cluster:
            cluster.execute(op, *_data(2 * M, 16))
            makespan = max(cluster.clocks())
        peaks = []
        for p, recs in sorted(op.last_records.items()):
            held, peak = 0, 0
            for a, *_ in recs:  # in program order: F stashes, B or W frees
                held += {"F": 1, "B": -1, "W": -1}.get(a.kind, 0)
                peak = max(peak, held)
            peaks.append(peak)
        results[name] = (makespan, peaks)
    assert (results["zb_h1"][0], results["1f1b"][0]) == (27, 33)
    assert results["1f1b"][1] == [min(S - s, M) for s in range(S)]
    assert results["zb_h1"][1] == [min(S, M)] * S


def test_executor_costs_must_cover_every_kind_the_schedule_runs():
    """Missing kinds would be charged nothing: zero-bubble's I and W would look free."""
    with pytest.raises(UsageError, match="costs name 'X', not an action kind"):
        PipelinedOperation(Pipeline(deep_mlp(2), cuts=[1]), "zb_h1", microbatches=2, costs={"X": 1.0})
    op = PipelinedOperation(Pipeline(deep_mlp(2), cuts=[1]), "zb_h1", microbatches=2,
                            costs={"F": 1.0, "B": 2.0})
    with VirtualCluster(2) as cluster:
        with pytest.raises(UsageError,
                           match=r"PipelinedOperation\('zb_h1'\): the schedule runs I, W actions but "
                                             r"costs give no I or W"):
            cluster.execute(op, *_data(4, 16))


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_pipeline_command_runs_every_schedule_it_lists_with_its_defaults(name, capsys):
    """``virtualpar pipeline --schedule NAME`` on built-in defaults: two-chunk schedules cut the MLP
    into seed 003's 4 stages on 2 devices; the run must equal single-process training."""
    from virtualpar.cli import main

    assert main(["pipeline", "--schedule", name, "--steps", "1", "--batch", "16", "--microbatches", "4"]) == 0
    out = capsys.readouterr().out
    devices = "2 devices (2 chunks each)" if name in ("interleaved_1f1b", "looped_bfs",
                                                      "zbv") else "4 devices"
    assert f"{name}: 4 stages on {devices} x 4 microbatches" in out
    assert "matches single-process training (float64, 1e-9): yes" in out


def test_pipeline_command_says_how_many_devices_the_mlp_allows(capsys):
    from virtualpar.cli import main

    # a usage error, found before any device
    assert main(["pipeline", "--schedule", "zbv", "--stages", "4"]) == 2
    assert ("zbv on 4 devices with 2 model chunks each needs 8 stages, but the MLP has 7 layers to cut; "
            "use at most 3 devices") in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["pipeline", "--virtual", "0"])
    assert (
        info.value.code == 2 and "argument --virtual: must be an int >= 1, got 0" in capsys.readouterr().err
    )
