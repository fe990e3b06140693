"""One schedule vocabulary and one timing engine: a strategy's work is pipeline Actions, timed by
pipeline.simulate (the strategies' scheduler only chooses the order)."""

from __future__ import annotations

import sys

import pytest

from virtualpar.pipeline import Action, Placement, build, simulate as simulate_actions, validate
from virtualpar.strategies import STRATEGIES, GPipe, simulate
from virtualpar.strategies.actions import action_of, to_actions
from virtualpar.strategies.work import Direction, Work


def test_work_items_are_pipeline_actions():
    assert action_of(Work(2, 5, Direction.FORWARD)) == Action(2, "F", 5)
    assert str(action_of(Work(2, 5, Direction.BACKWARD))) == "2B5"


def test_a_strategy_lowers_to_a_valid_pipeline_schedule_timed_like_the_pipeline_s_own():
    """GPipe's mapping is a valid schedule of pipeline Actions; its latency is the engine's makespan,
    the same as the pipeline's gpipe and 1f1b at F = 1, B = 2 (33 = (M + S − 1)(f + b))."""
    S, B = 4, 8
    for cap, name in ((None, "gpipe"), (S, "1f1b")):
        run = simulate(S, S, B, GPipe, max_activations=cap)
        schedule, placement = to_actions(run.items, S, S)
        validate(schedule, placement, B)
        assert all(isinstance(a, Action) for acts in schedule.values() for a in acts)
        theirs, their_placement = build(name, S, B)
        want = simulate_actions(theirs, their_placement, B, costs={"F": 1, "B": 2}).makespan
        assert (
            run.latency
            == simulate_actions(schedule, placement, B, costs={"F": 1, "B": 2}).makespan
            == want
            == 33
        )


CASES = [(name, W, S, B, ac, wc, cap)
         for name in STRATEGIES for (W, S, B) in ((4, 4, 8), (2, 4, 6), (6, 3, 12))
         for ac, wc in ((0.0, 0.0), (0.5, 0.0), (0.3, 0.4)) for cap in (None, S, 3)]


@pytest.mark.parametrize("name,W,S,B,ac,wc,cap", CASES)
def test_the_timing_engine_gives_the_times_the_scheduler_chose_by(monkeypatch, name, W, S, B, ac, wc, cap):
    """The scheduler's own clock (which only picks the next item) and the engine agree on every
    item of every built-in strategy, with transfer and weight-fetch costs and activation caps."""
    module = sys.modules["virtualpar.strategies.simulate"]
    seen = {}
    real = module.time_items

    def spy(items, *args):
        seen["scheduler"] = [(i.work, i.start, i.end) for i in items]
        return real(items, *args)

    monkeypatch.setattr(module, "time_items", spy)
    try:
        run = simulate(W, S, B, STRATEGIES[name](W, S, B), activation_cost=ac, weight_cost=wc,
                       max_activations=cap)
    except Exception as exc:  # a mapping the scheduler refuses at this size (e.g. gpipe needs W >= S)
        assert type(exc).__name__ == "UsageError" and "scheduler" not in seen
        return
    engine = [(i.work, i.start, i.end) for i in run.items]
    assert len(engine) == len(seen["scheduler"]) == 2 * S * B
    for (work, start, end), (their_work, their_start, their_end) in zip(engine, seen["scheduler"]):
        assert work == their_work and start == pytest.approx(their_start) and end == pytest.approx(their_end)


def test_the_engine_fetches_weights_kept_elsewhere_and_honours_memory_waits():
    # two ranks, one stage kept on rank 0; rank 1 computes microbatch 1 and must fetch the weights
    placement = Placement(2, (0,), compute=(((0, 0), 0), ((0, 1), 1)), weights=(0,))
    schedule = {0: [Action(0, "F", 0), Action(0, "B", 0)], 1: [Action(0, "F", 1), Action(0, "B", 1)]}
    sim = simulate_actions(schedule, placement, 2, costs={"F": 1, "B": 2}, fetch=0.5)
    assert sim.times[Action(0, "F", 0)] == (0, 0.0, 1.0) and sim.times[Action(0, "F", 1)] == (1, 0.5, 1.5)
    assert sim.times[Action(0, "B", 1)] == (1, 2.0, 4.0)  # fetched again for the backward
    waited = simulate_actions(schedule, placement, 2, costs={"F": 1, "B": 2},
                              waits={Action(0, "F", 1): (Action(0, "B", 0),)})
    assert waited.times[Action(0, "F", 1)] == (1, 3.0, 4.0)  # no transfer added for a memory wait
    with pytest.raises(Exception, match="fetch must be a finite number >= 0"):
        simulate_actions(schedule, placement, 2, fetch=-1.0)
