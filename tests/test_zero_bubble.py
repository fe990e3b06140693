"""ZB-H1 and ZB-V as Qi et al. define them, checked against their closed forms on grids of (R, M)
and cost sets, exactly (the simulator's times are sums of the costs)."""

from __future__ import annotations

import pytest

from virtualpar.pipeline import build, simulate, validate
from virtualpar.pipeline.schedules import ZB_H1_REGION, ZBV_REGION, zb_h1_makespan, zbv_makespan

# (F, I, W): equal, and unequal with W <= F (the region of ZB-H1's closed form), in binary fractions
# so that sums are exact
H1_COSTS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (3, 2, 1), (2, 3, 0.5), (1.5, 1, 0.25), (4, 4, 2), (1, 1, 0),
            (2, 1, 1.5), (3, 0.5, 2)]  # the last two: W > I (still W <= F)
V_COSTS = [(1, 1, 1), (2, 2, 1), (3, 3, 0.5), (0.5, 0.5, 0.25), (2, 2, 0),
           (1, 2, 0.5), (1, 3, 1), (0.5, 1.5, 0.5)]  # the last three: F < I


def _rank_peaks(sim, placement) -> list[int]:
    """Most chunk activations a rank holds at once (its stages' curves merged)."""
    peaks = []
    for r in range(placement.ranks):
        events = []
        for s in placement.stages_of(r):
            last = 0
            for t, n in sim.activation_curve[s]:
                events.append((t, n - last))
                last = n
        events.sort(key=lambda e: (e[0], e[1]))  # frees first at one instant
        held = best = 0
        for _, d in events:
            held += d
            best = max(best, held)
        peaks.append(best)
    return peaks


def test_zb_h1_at_4_ranks_8_microbatches_takes_the_papers_27_steps():
    sim = simulate(*build("zb_h1", 4, 8), 8, costs={"F": 1, "I": 1, "W": 1})
    one = simulate(*build("1f1b", 4, 8), 8, costs={"F": 1, "B": 2})
    assert sim.makespan == 27 and one.makespan == 33  # bubbles (p-1)(F+I-W) = 3 against (p-1)(F+I+W) = 9
    assert sim.bubble == pytest.approx(1 - 24 / 27)


def test_zb_h1_with_fewer_microbatches_than_ranks_is_the_lower_bound():
    """S=5, M=3: the last rank runs its 3 F/I pairs from t=4, the last I drains 4 ranks, one W:
    4 + 6 + 4 + 1 = 15 (13 would need the last rank's six actions in less than six steps)."""
    assert simulate(*build("zb_h1", 5, 3), 3, costs={"F": 1, "I": 1, "W": 1}).makespan == 15


@pytest.mark.parametrize("F, I, W", H1_COSTS)
def test_zb_h1_closed_form_on_a_grid(F, I, W):
    costs = {"F": F, "I": I, "W": W}
    for R in range(1, 8):
        for M in range(1, 15):
            assert ZB_H1_REGION(R, M, F, I, W)
            sched, placement = build("zb_h1", R, M)
            validate(sched, placement, M)
            sim = simulate(sched, placement, M, costs=costs)
            assert sim.makespan == zb_h1_makespan(R, M, F, I, W), (R, M)
            # 1F1B's peak (its first rank holds min(R, M)) on every rank, from F to W
            assert max(sim.peak_activations) == min(R, M)
            one = simulate(*build("1f1b", R, M), M, costs={"F": F, "B": I + W})
            assert one.makespan == M * (F + I + W) + (R - 1) * (F + I + W)
            if R > 1 and W > 0:
                assert sim.makespan < one.makespan


@pytest.mark.parametrize("F, I, W", V_COSTS)
def test_zbv_closed_form_on_a_grid(F, I, W):
    costs = {"F": F, "I": I, "W": W}
    for R in range(1, 7):
        for M in range(max(1, 2 * R - 2), 2 * R + 7):
            assert ZBV_REGION(R, M, F, I, W)
            sched, placement = build("zbv", R, M)
            validate(sched, placement, M)
            sim = simulate(sched, placement, M, costs=costs)
            assert sim.makespan == zbv_makespan(R, M, F, I, W), (R, M)
            assert max(_rank_peaks(sim, placement)) <= 2 * R  # 1F1B's R microbatches, in chunk halves


def test_zbv_at_equal_costs_idles_each_rank_r_minus_1_units():
    """The paper's ZB-V figure (4 ranks, F = I = W = 1 per chunk): 6M of work per rank in 6M + 3."""
    sim = simulate(*build("zbv", 4, 8), 8, costs={"F": 1, "I": 1, "W": 1})
    assert sim.makespan == 51 and sim.busy == [48.0] * 4


@pytest.mark.parametrize("name", ["zb_h1", "zbv"])
@pytest.mark.parametrize("R, M", [(1, 1), (2, 1), (3, 2), (4, 3), (5, 1), (6, 4), (3, 9)])
def test_outside_the_region_the_schedules_still_finish(name, R, M):
    for F, I, W in [(1, 1, 3), (1, 2, 3), (2, 1, 1.5)]:
        sched, placement = build(name, R, M)
        validate(sched, placement, M)
        sim = simulate(sched, placement, M, costs={"F": F, "I": I, "W": W})
        work = (2 if name == "zbv" else 1) * M * (F + I + W)
        assert sim.busy == [work] * R and sim.makespan >= work
        # a rank runs its actions one at a time, so its peak follows from its order: any costs
        assert max(_rank_peaks(sim, placement)) <= (2 * R if name == "zbv" else min(R, M))
