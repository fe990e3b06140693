"""Pipelines given what users actually hand in: nested models, zero costs, schedules read back
from JSON or written as strings, idle ranks, and arguments of the wrong kind — each either right
or refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import UsageError, VirtualCluster, nn
from virtualpar.pipeline import Action, Pipeline, PipelinedOperation, Placement, build, simulate, validate
from virtualpar.pipeline.partition import forward_flops
from virtualpar.pipeline.validate import ScheduleError

WIDTHS = [(8, 8), (8, 512), (512, 512), (512, 8)]


def test_flops_count_linear_layers_at_any_depth():
    """Nested blocks counted 0 FLOPs: balancing put three of four blocks on one stage, and the
    modelled step took no time at all."""
    flat = nn.Sequential(*[layer for a, b in WIDTHS for layer in (nn.Linear(a, b), nn.ReLU())])
    nested = nn.Sequential(*[nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in WIDTHS])
    want = sum(2 * a * b for a, b in WIDTHS)
    assert forward_flops(flat, 1) == forward_flops(nested, 1) == want
    assert [len(s.module) for s in Pipeline.balanced(nested, 2, by="flops").stages] == [2, 2]  # was [1, 3]
    assert sum(s.flops(3) for s in Pipeline.balanced(nested, 2, by="flops").stages) == 3 * want
    assert forward_flops(nn.Embedding(100, 8), 4) == 0.0  # a lookup
    assert forward_flops(nn.GRU(4, 8), 1) == 2 * nn.GRU(4, 8).num_parameters()  # one step per row


@pytest.mark.parametrize("comm", [float("nan"), -1, "1", True])
def test_a_bad_communication_cost_is_refused(comm):
    s, p = build("1f1b", 2, 2)
    with pytest.raises(UsageError, match="comm must be a finite number >= 0"):
        simulate(s, p, 2, comm=comm)


def test_zero_cost_actions_never_free_before_they_stash():
    s, p = build("1f1b", 2, 2)
    sim = simulate(s, p, 2, costs={"F": 0, "B": 0})
    assert sim.peak_activations == [2, 1]  # was [0, 0], the curve dipping to -2
    assert min(n for curve in sim.activation_curve for _, n in curve) == 0


def test_schedules_of_the_wrong_shape_are_named():
    s, p = build("1f1b", 2, 2)
    with pytest.raises(ScheduleError, match=r"keyed by the int ranks 0..1 .*got keys \['0', '1'\]"):
        validate({str(r): acts for r, acts in s.items()}, p, 2)  # as read back from --json
    with pytest.raises(ScheduleError, match=r"idle rank gets \[\]\); got keys \[0\]"):
        validate({0: [Action(0, "F", 0), Action(1, "F", 0), Action(1, "B", 0), Action(0, "B", 0)]},
                 Placement(2, (0, 0)), 1)
    with pytest.raises(ScheduleError, match=r"'0F0' is a str, not an Action: write Action.from_str\('0F0'\)"):
        validate({0: ["0F0", "0B0"]}, Placement.loop(1), 1)
    with pytest.raises(ScheduleError, match="microbatches must be an int >= 1, got 0"):
        validate(s, p, 0)
    both = {0: [Action(0, "F", 0), Action(0, "B", 0), Action(0, "W", 0)]}
    with pytest.raises(ScheduleError, match="stage 0 microbatch 0 has both B and the split I/W"):
        validate(both, Placement.loop(1), 1)  # was: "0W0 comes before its input backward 0I0"


def test_arguments_of_the_wrong_kind_are_named():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    with pytest.raises(UsageError, match="Action.from_str takes a string"):
        Action.from_str(None)
    with pytest.raises(UsageError, match="cuts must be a list of cut points"):
        Pipeline(model, None)
    with pytest.raises(UsageError, match="stages must be an int, got '2'"):
        Pipeline.balanced(model, "2")
    s, p = build("gpipe", 2, 2)
    with pytest.raises(UsageError, match=r"gives no figure for stage \[1\] of 2"):
        simulate(s, p, 2).memory({0: 10.0})
    with pytest.raises(UsageError, match=r"a \(schedule, Placement\) pair, got tuple"):
        PipelinedOperation(Pipeline(model, [1]), (s,), 2)


def test_an_inferred_virtual_count_is_explained_as_such():
    """zbv on 1 device with 3 stages said 'zbv does not take virtual=3', a virtual nobody gave."""
    model = nn.Sequential(*[nn.Linear(2, 2, seed=i, dtype=np.float64) for i in range(4)])
    op = PipelinedOperation(Pipeline(model, [1, 2, 3]), "1f1b", 2)
    with VirtualCluster(2) as cluster:
        with pytest.raises(UsageError,
                           match=r"4 stages on 2 pipeline ranks means 2 stages per rank, which '1f1b' "
                                             r"cannot run .* choose interleaved_1f1b or looped_bfs"):
            cluster.execute(op, np.ones((4, 2)), np.ones((4, 2)))


def test_a_virtual_count_a_schedule_does_not_take_says_which_it_does():
    from virtualpar.pipeline.schedules import SCHEDULES

    with pytest.raises(UsageError, match=r"zbv does not take virtual=1; zbv takes virtual=2"):
        SCHEDULES["zbv"](2, 4, 1)
    with pytest.raises(UsageError,
                       match=r"1f1b does not take virtual=2; use interleaved_1f1b or looped_bfs .* or zbv"):
        SCHEDULES["1f1b"](2, 4, 2)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_step_that_fails_anywhere_updates_nothing(rank):
    """Each device stepped its optimizer when its own part ended: a fault on another device after
    that left some stages updated and others not, and a retry trained from the mix."""
    from virtualpar.errors import VirtualParError

    model = nn.Sequential(nn.Linear(4, 4, dtype=np.float64), nn.Linear(4, 4, seed=1, dtype=np.float64))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    op = PipelinedOperation(Pipeline(model, [1]), "1f1b", microbatches=2, optimizer=nn.Adam(0.01))
    with VirtualCluster(2) as cluster:
        cluster.execute(op, x, y)
        before = op.state_dict(cluster)
        for k in range(1, 30):  # a fault at each op of this device's step, until one lands past its last op
            cluster.inject(rank, k, "raise")
            with pytest.raises(VirtualParError) as info:
                cluster.execute(op, x, y)
            now = op.state_dict(cluster)
            assert all(np.array_equal(now[n], before[n]) for n in before), f"op {k}: half-updated"
            if "did not fire" in str(info.value):
                break  # past this device's last op: a run that raised, so it updated nothing either
        assert k > 3
        want, _ = nn.reference_train(nn.Sequential(nn.Linear(4, 4, dtype=np.float64),
                                                   nn.Linear(4, 4, seed=1, dtype=np.float64)),
                                     [(x, y)], nn.mse_loss, nn.Adam(0.01), 2, 2)
        assert cluster.execute(op, x, y) == pytest.approx(want[1], rel=1e-12)  # the retry is the second step


@pytest.mark.parametrize("costs",
                         [{"F": 1, "B": 1.5}, {"F": 1e-7, "B": 1}, {"F": 2, "I": 2, "W": 3},
                          {"F": 1, "I": 1, "W": 0}])
def test_the_grid_shows_every_action_whatever_the_costs(costs):
    """Costs that are not multiples of the shortest hid actions (rounded into a shared cell), and a
    tiny one made millions of cells (MemoryError)."""
    name = "zb_h1" if "W" in costs else "1f1b"
    s, p = build(name, 4, 8)
    grid = simulate(s, p, 8, costs=costs).grid()
    for r, actions in s.items():
        assert sorted(map(str, {a for a in grid[r] if a is not None})) == sorted(
            str(a) for a in actions if a is not None
        )
    assert len(grid[0]) <= 1000
    assert (
        len(simulate(s, p, 8, costs={k: 1 for k in costs}).grid()[0])
        == simulate(s, p, 8, costs={k: 1 for k in costs}).makespan
    )


def test_costs_whose_sum_overflows_are_refused():
    s, p = build("1f1b", 2, 2)
    with pytest.raises(UsageError, match="add up past the largest float"):
        simulate(s, p, 2, costs={"F": 1e308, "B": 1e308})
