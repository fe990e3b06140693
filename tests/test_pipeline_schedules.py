"""Pipeline schedules as data, without processes: the action vocabulary, the validator, the
simulator against the closed forms, lowering, partitioning."""

from __future__ import annotations

import time

import numpy as np
import pytest

from virtualpar import UsageError, nn
from virtualpar.pipeline import (SCHEDULES, Action, Pipeline, PipelineDeadlock, Placement, ScheduleError,
                                 build, lower, simulate, validate)

UNIT = {"F": 1.0, "B": 1.0}


def test_action_prints_compactly_and_parses_back():
    for a in (Action(2, "B", 1), Action(0, "F", 0), Action(13, "W", 107), Action(3, "SF", 2),
              Action(1, "RB", 0)):
        assert Action.from_str(str(a)) == a
    assert str(Action(2, "B", 1)) == "2B1"
    with pytest.raises(UsageError, match="not an action: '2X1'"):
        Action.from_str("2X1")


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize("S, M", [(1, 1), (2, 1), (2, 3), (4, 4), (4, 8), (3, 6)])
def test_every_builder_gives_a_valid_finishing_schedule(name, S, M):
    virtual = 2 if name in ("interleaved_1f1b", "looped_bfs", "zbv") else 1
    if name == "interleaved_1f1b" and M % S:
        with pytest.raises(UsageError, match=f"multiple of {S}"):
            build(name, S, M, virtual)
        return
    sched, placement = build(name, S, M, virtual)
    validate(sched, placement, M)
    sim = simulate(sched, placement, M)
    assert len(sim.times) == sum(len(a) for a in sched.values())


@pytest.mark.parametrize("S, M", [(s, m) for s in (1, 2, 3, 4, 6) for m in (1, 2, 4, 7, 8, 12)])
def test_gpipe_and_1f1b_closed_forms(S, M):
    for name in ("gpipe", "1f1b"):
        sim = simulate(*build(name, S, M), M, costs=UNIT)
        assert sim.makespan == 2 * (M + S - 1)
        assert sim.bubble == pytest.approx((S - 1) / (M + S - 1), abs=1e-12)
        want = [M] * S if name == "gpipe" else [min(S - s, M) for s in range(S)]
        assert sim.peak_activations == want


def test_1f1b_4_stages_8_microbatches_shows_every_forward_and_backward_in_22_steps():
    sim = simulate(*build("1f1b", 4, 8), 8, costs=UNIT)
    grid = sim.grid()
    cells = [a for row in grid.values() for a in row if a is not None]
    assert sum(a.kind == "F" for a in cells) == 32 and sum(a.kind == "B" for a in cells) == 32
    assert all(len(row) == 22 for row in grid.values())


@pytest.mark.parametrize("S, M, V", [(2, 4, 2), (4, 8, 2), (4, 8, 3), (3, 6, 2), (4, 12, 4)])
def test_interleaved_bubble_closed_form(S, M, V):
    sim = simulate(*build("interleaved_1f1b", S, M, V), M, costs=UNIT)
    assert sim.bubble == pytest.approx((S - 1) / (V * M + S - 1), abs=1e-12)


@pytest.mark.parametrize("S, M", [(2, 4), (4, 8), (4, 16), (6, 12)])
def test_zero_bubble_h1_beats_1f1b_at_the_same_peak_memory(S, M):
    costs = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
    one = simulate(*build("1f1b", S, M), M, costs=costs)
    zb = simulate(*build("zb_h1", S, M), M, costs=costs)
    assert zb.bubble < one.bubble
    # the paper's accounting: no rank holds more than 1F1B's first rank (every rank holds R, F to W)
    assert max(zb.peak_activations) == max(one.peak_activations) == min(S, M)


def test_zbv_has_the_smallest_bubble():
    costs = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
    bubbles = {n: simulate(*build(n, 4, 8, 2 if n == "zbv" else None), 8,
                           costs=costs).bubble for n in ("1f1b", "zb_h1", "zbv")}
    assert bubbles["zbv"] < bubbles["zb_h1"] < bubbles["1f1b"]


def test_simulator_handles_1f1b_at_32_stages_1024_microbatches():
    sched, placement = build("1f1b", 32, 1024)
    t0 = time.perf_counter()
    sim = simulate(sched, placement, 1024, costs=UNIT)
    elapsed = time.perf_counter() - t0
    assert sim.makespan == 2 * (1024 + 31)
    assert elapsed < 30  # a bound for a hang, not a speed target (that is bench_pipeline's)


def test_validator_marks_the_bad_step_in_the_grid():
    sched, placement = build("1f1b", 2, 2)
    sched[1] = [Action(1, "B", 0), Action(1, "F", 0), Action(1, "F", 1), Action(1, "B", 1)]
    with pytest.raises(ScheduleError, match=r"1B0 comes before its forward 1F0") as info:
        validate(sched, placement, 2)
    assert "<-- ERROR HERE (step 0: 1B0)" in str(info.value)
    sched, placement = build("1f1b", 2, 2)
    sched[0].append(Action(0, "F", 1))
    with pytest.raises(ScheduleError, match="0F1 appears twice"):
        validate(sched, placement, 2)
    sched, placement = build("1f1b", 2, 2)
    sched[0] = [a for a in sched[0] if a != Action(0, "B", 1)]
    with pytest.raises(ScheduleError, match="stage 0 microbatch 1 has no backward"):
        validate(sched, placement, 2)


def test_a_schedule_that_cannot_finish_is_a_named_deadlock():
    placement = Placement.loop(2)
    sched = {0: [Action(0, "F", 0), Action(0, "B", 0), Action(0, "F", 1), Action(0, "B", 1)],
             1: [Action(1, "F", 1), Action(1, "B", 1), Action(1, "F", 0), Action(1, "B", 0)]}
    validate(sched, placement, 2)  # each rank's own order is fine
    with pytest.raises(PipelineDeadlock,
                       match=r"rank 0 waits at 0B0 for 1B0.*\n.*rank 1 waits at 1F1 for 0F1"):
        simulate(sched, placement, 2)


def test_lowering_puts_receives_before_consumers_and_sends_after_producers():
    sched, placement = build("1f1b", 2, 1)
    low = lower(sched, placement)
    assert [str(a) for a in low[0]] == ["0F0", "0SF0", "0RB0", "0B0"]
    assert [str(a) for a in low[1]] == ["1RF0", "1F0", "1B0", "1SB0"]
    vsched, vplace = build("zbv", 2, 1)  # stages 0 and 3 share rank 0: no transfer between them
    low = lower(vsched, vplace)
    assert not any(
        a.kind in ("SF", "RF") and a.stage in (2, 3) and vplace.stage_rank[a.stage + (a.kind == "SF")] == 0
        for a in low[0]
        if a.stage < 3
    )


def test_memory_ledger_follows_the_activation_curve():
    sim = simulate(*build("1f1b", 2, 4), 4, costs=UNIT)
    ledger = sim.memory(params={0: 10.0, 1: 10.0}, optimizer={0: 20.0, 1: 20.0}, activation={0: 3.0, 1: 3.0})
    assert max(b for _, b in ledger[0]) == 10 + 10 + 20 + 3 * sim.peak_activations[0]
    assert ledger[1][0][1] == 40.0


def _model(n=6):
    return nn.Sequential(*[nn.Linear(4 if i == 0 else 8, 8, seed=i) for i in range(n)])


def test_partition_at_cut_points_and_balanced():
    model = _model()
    pipe = Pipeline(model, cuts=["2", 4])
    assert [len(s.module) for s in pipe.stages] == [2, 2, 2]
    assert list(pipe.stages[1].parameters()) == ["2.weight", "2.bias", "3.weight", "3.bias"]
    with pytest.raises(UsageError,
                       match=r"no cut point '9'.*valid cut points are the layers "
                             r"\['1', '2', '3', '4', '5'\]"):
        Pipeline(model, cuts=["9"])
    # numpy's integers are indices too (np.int64(2) was "no cut point", beside a list naming 2 as valid)
    assert [len(s.module) for s in Pipeline(model, cuts=np.array([2, 4])).stages] == [2, 2, 2]
    with pytest.raises(UsageError, match="no cut point True"):
        Pipeline(model, cuts=[True])
    sizes = [4, 64, 8, 8, 8, 64, 8]
    heavy = nn.Sequential(*[nn.Linear(a, b, seed=i) for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))])
    balanced = Pipeline.balanced(heavy, 3, by="params")
    weights = [s.module.num_parameters() for s in balanced.stages]
    assert max(weights) == min(max(heavy[:c].num_parameters(), heavy[c:d].num_parameters(),
                                   heavy[d:].num_parameters())
                               for c in range(1, 5) for d in range(c + 1, 6))


def test_schedule_command_json_and_errors(capsys):
    import json

    from virtualpar.cli import main

    assert main(["schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--costs", "F=1,B=1",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (
        doc["makespan"] == 22
        and doc["bubble"] == pytest.approx(3 / 11)
        and doc["peak_activations"] == [4, 3, 2, 1]
    )
    assert len(doc["grid"]["0"]) == 22 and doc["grid"]["0"][0] == "0F0"
    assert main(["schedule", "interleaved_1f1b", "--stages", "2", "--microbatches", "4", "--virtual",
                 "2"]) == 0
    assert "bubble" in capsys.readouterr().out
    assert main(["schedule", "nope"]) == 2
    assert "choose one of gpipe" in capsys.readouterr().err


def test_costs_that_would_time_the_wrong_thing_are_refused(capsys):
    from virtualpar.cli import main
    from virtualpar.pipeline import check_costs

    sched, placement = build("1f1b", 2, 2)
    for costs, message in (({"f": 1.0}, "costs name 'f', not an action kind; the kinds are F, B, I, W"),
                           ({"F": -1.0}, r"costs\['F'\] must be a finite number >= 0, got -1.0"),
                           ({"B": float("nan")}, r"costs\['B'\] must be a finite number >= 0, got nan"),
                           ({"F": True}, r"costs\['F'\] must be a finite number >= 0, got True"),
                           ({"F": {0: 1.0}}, r"costs\['F'\] gives no cost for stage \[1\] of 2")):
        with pytest.raises(UsageError, match=message):
            simulate(sched, placement, 2, costs=costs)
    # per-stage costs covering every stage time each stage by its own cost
    sim = simulate(sched, placement, 2, costs={"F": {0: 1.0, 1: 3.0}, "B": 0.0})
    assert sim.makespan == 1 + 3 + 3
    with pytest.raises(UsageError,
                       match=r"x: the schedule runs I, W actions but costs give no I or W \(given: F, B\)"):
        check_costs({"F": 1.0, "B": 2.0}, "x", needed=("F", "I", "W"))
    with pytest.raises(UsageError, match=r"costs\['F'\] must be a number, got a mapping"):
        check_costs({"F": {0: 1.0}}, "x")
    with pytest.raises(SystemExit) as exc:
        main(["schedule", "gpipe", "--costs", "F=1,Q=2"])
    assert exc.value.code == 2
    assert "argument --costs: costs name 'Q', not an action kind" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # B=1,B=2 kept the last value
        main(["schedule", "1f1b", "--costs", "B=1,B=2"])
    assert exc.value.code == 2 and "argument --costs: costs give B twice" in capsys.readouterr().err
