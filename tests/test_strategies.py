"""The unified work -> worker scheme: the issue's numbers, closed forms, the throughput bound,
1F1B emerging from a cap, rendering and the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from virtualpar import UsageError
from virtualpar.strategies import (STRATEGIES, ComputeAndWeightWorkers, Cuckoo, Direction,
                                   DistributedDataParallel,
                                   FullyShardedDataParallel, FullyShardedLoopedPipeline, GPipe,
                                   LoopedPipeline,
                                   OldestBatchFirst, OldestStageFirst, Work, simulate, to_html, to_text)


def test_ddp_numbers_from_the_issue():
    run = simulate(8, 4, 8, DistributedDataParallel)
    assert run.latency == 12 and round(run.throughput, 3) == 0.667 and run.peak_activations == 4


@pytest.mark.parametrize("policy", [OldestBatchFirst, OldestStageFirst])
def test_gpipe_numbers_from_the_issue_under_either_policy(policy):
    run = simulate(4, 4, 8, GPipe, policy)
    assert run.latency == 33 and round(run.throughput, 3) == 0.485 and run.peak_activations == 8


@pytest.mark.parametrize("S, W", [(2, 2), (3, 5), (4, 8), (6, 6)])
def test_data_parallel_closed_forms(S, W):
    f, b = 1.0, 2.0
    ddp = simulate(W, S, W, DistributedDataParallel)
    assert ddp.latency == S * (f + b)  # every batch alone on its worker
    assert ddp.activation_transmissions == ddp.weight_transmissions == 0
    assert ddp.weight_storage == [S] * W and ddp.peak_activations == S
    fsdp = simulate(W, S, W, FullyShardedDataParallel(W))
    assert fsdp.latency == S * (f + b)  # communication is free by default
    local = sum(1 for bt in range(W) for s in range(S) if s % W == bt)
    assert fsdp.weight_transmissions == 2 * (S * W - local)  # every item whose stage lives elsewhere
    assert fsdp.gradient_transmissions == S * W - local
    assert fsdp.weight_storage == [sum(1 for s in range(S) if s % W == w) for w in range(W)]


@pytest.mark.parametrize("S, M", [(2, 3), (4, 8), (3, 6)])
def test_pipeline_closed_forms(S, M):
    run = simulate(S, S, M, GPipe)
    assert run.activation_transmissions == M * 2 * (S - 1)  # stage to stage, both ways
    assert run.weight_transmissions == 0 and run.weight_storage == [1] * S
    assert run.peak_activations == M


@pytest.mark.parametrize("g, W, S, B", [(2, 4, 4, 4), (3, 6, 6, 6), (1, 4, 2, 4)])
def test_looped_pipeline_closed_forms(g, W, S, B):
    looped = simulate(W, S, B, LoopedPipeline(g, W))
    assert looped.activation_transmissions == (B * 2 * (S - 1) if g > 1 else 0)
    assert looped.weight_transmissions == 0
    fs = simulate(W, S, B, FullyShardedLoopedPipeline(g, W))
    compute = lambda s, b: (g * b) % W + s % g
    weight = lambda s: (g * s) % W + s % g
    assert fs.weight_transmissions == sum(2 for b in range(B) for s in range(S) if compute(s, b) != weight(s))


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.parametrize("W, S, B", [(4, 4, 8), (6, 6, 6), (8, 4, 8), (4, 2, 4)])
def test_throughput_is_bounded_by_peak_activation_storage(name, W, S, B):
    run = simulate(W, S, B, STRATEGIES[name](W, S, B, None))
    assert run.throughput <= run.proven_bound() + 1e-12
    assert run.throughput <= run.peak_activations / S + 1e-12


def test_a_cap_makes_1f1b_emerge_from_the_gpipe_mapping():
    free, capped = simulate(4, 4, 8, GPipe), simulate(4, 4, 8, GPipe, max_activations=4)
    assert capped.latency == free.latency == 33 and capped.peak_activations == 4 < free.peak_activations
    # worker 3 alternates forward and backward in its steady state, as 1F1B does
    w3 = [i for i in capped.items if i.workers.compute == 3]
    kinds = "".join(i.work.direction.value for i in sorted(w3, key=lambda i: i.start))
    assert "fbfbfb" in kinds
    with pytest.raises(UsageError, match="too small"):  # DDP stashes every stage before its first backward
        simulate(2, 4, 2, DistributedDataParallel, max_activations=1)
    assert simulate(4, 4, 8, Cuckoo(4, 4, 8)).latency > 0


@pytest.mark.parametrize("B", [1, 2, 3, 6])
@pytest.mark.parametrize("policy", [OldestBatchFirst, OldestStageFirst])
def test_a_looped_strategy_runs_at_the_cap_one_batch_needs(B, policy):
    """Looped on 4 workers in groups of 2, 6 stages: a batch holds 3 activations at once on each
    worker of its group (stages 0, 2, 4).  A cap of 3 is enough (start a batch on a group once the
    previous one there has finished its backward), but the greedy took the slots one forward at a
    time and at B = 3 two batches each held some and waited for the rest: "max_activations=3 is
    too small"."""
    run = simulate(4, 6, B, LoopedPipeline(2, 4), policy=policy, max_activations=3)
    assert len(run.items) == 2 * 6 * B and run.peak_activations <= 3
    per_worker = {}
    for i in run.items:  # every forward before its own backward, every batch's chain in order
        per_worker.setdefault(i.workers.compute, []).append((i.start, i.end))
    for spans in per_worker.values():  # a worker runs one item at a time
        spans.sort()
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(spans, spans[1:]))
    with pytest.raises(UsageError,
                       match="batch 0 runs 3 forwards on worker 0.*max_activations=2 is too small"):
        simulate(4, 6, B, LoopedPipeline(2, 4), policy=policy, max_activations=2)


def test_a_user_strategy_and_bad_mappings():
    run = simulate(2, 2, 2, lambda w: ComputeAndWeightWorkers(w.batch, 0))
    assert run.weight_transmissions == 4  # batch 1's four items fetch from worker 0
    with pytest.raises(UsageError,
                       match=r"mapped f0 \(stage 0, batch 0\) to workers \(5, 0\); there are 2 workers"):
        simulate(2, 2, 2, lambda w: ComputeAndWeightWorkers(5, 0))
    # a plain pair and numpy ints are a mapping (the pair failed as 'tuple' has no attribute 'compute',
    # numpy ints as out of 0..1); anything else is refused by what it is
    plain = simulate(2, 2, 2, lambda w: (w.batch, 0))
    numpy_ints = simulate(2, 2, 2, lambda w: ComputeAndWeightWorkers(np.int64(w.batch), np.int64(0)))
    assert (
        [i.workers for i in plain.items]
        == [i.workers for i in numpy_ints.items]
        == [i.workers for i in run.items]
    )
    with pytest.raises(UsageError, match=r"to 'w0'; expected ComputeAndWeightWorkers"):
        simulate(2, 2, 2, lambda w: "w0")


@pytest.mark.parametrize("kwargs, what", [
    ({"forward_cost": -1}, "forward_cost must be a finite number >= 0, got -1"),
    ({"weight_cost": -1}, "weight_cost must be"), ({"activation_cost": -5}, "activation_cost must be"),
    ({"backward_cost": float("nan")}, "backward_cost must be"),
    ({"forward_cost": float("inf")}, "forward_cost must"),
    ({"forward_cost": "1"}, "forward_cost must be"),
    ({"max_activations": 2.5}, "max_activations must be a positive int"),
    ({"max_activations": True}, "max_activations must be a positive int, got True"),
])
def test_bad_costs_and_caps_are_refused(kwargs, what):
    with pytest.raises(UsageError, match=what):
        simulate(4, 4, 4, GPipe, **kwargs)


def test_a_weight_fetch_starts_once_the_worker_is_free_and_the_input_is_there():
    """start = max(free, pred + activation_cost) + weight_cost, as the module doc says: batch 1's
    f0 on worker 1 fetches worker 0's weights from t = 0 and starts at 1, and its f1 (weights on
    worker 0 too) waits for f0 to end at 2 before its own fetch."""
    run = simulate(2, 2, 2, lambda w: ComputeAndWeightWorkers(w.batch, 0), weight_cost=1.0)
    starts = {(i.work.stage, i.work.batch, i.work.direction.value): i.start for i in run.items}
    assert starts[(0, 1, "f")] == 1.0 and starts[(1, 1, "f")] == 3.0 and starts[(0, 0, "f")] == 0.0


def test_rendering_comes_from_the_run():
    run = simulate(2, 2, 2, GPipe)
    text = to_text(run)
    assert text.splitlines()[1].split("|")[1].split()[0] == "f0:0"
    assert text.count("b1:") == 2 * 2  # B costs 2 cells, 2 batches, on worker 1
    page = to_html(run)
    assert page.startswith("<table") and page.count("title='batch 1'") == sum(
        int(i.end - i.start) for i in run.items if i.work.batch == 1)


@pytest.mark.parametrize("forward, backward, unit", [(1, 1.5, 0.5), (2, 4, 2), (1 / 3, 0.1234, None)])
def test_rendering_shows_every_item_whatever_the_costs(forward, backward, unit):
    """Cells were as long as the shortest item and times were rounded to them: with F = 1, B = 1.5
    an item starting at 3.5 was overwritten by the next one and never shown.  Now every cell is a
    unit dividing every time (each item gets exactly duration / unit cells), or, without one, a
    column per distinct time."""
    run = simulate(2, 2, 3, GPipe, forward_cost=forward, backward_cost=backward)
    text = to_text(run)
    rows: list[list[str]] = [[], []]  # a wide diagram is folded into blocks: read them back to one row each
    for line in text.splitlines():
        if line.strip() and not line.startswith("worker"):
            rows[int(line.split("|")[0])] += line.split("|")[1].split()
    for i in run.items:
        cells = rows[i.workers.compute].count(f"{i.work}:{i.work.batch}")
        if unit is None:
            assert cells >= 1, i
        else:
            assert cells == round((i.end - i.start) / unit), i
    head = text.splitlines()[0].split("|")[1].split()
    assert float(head[0]) == 0 and (unit is None or float(head[1]) == unit)
    assert max(len(line) for line in text.splitlines()) <= 100


def test_a_wide_diagram_folds_into_blocks_within_the_width():
    run = simulate(4, 4, 8, GPipe, forward_cost=1, backward_cost=2)
    for width in (50, 100):
        text = to_text(run, width)
        blocks = text.split("\n\n")
        assert len(blocks) > 1 and max(len(line) for line in text.splitlines()) <= width
        times = [t for b in blocks for t in b.splitlines()[0].split("|")[1].split()]
        assert times == [str(t) for t in range(33)]


def test_strategy_command(capsys):
    from virtualpar.cli import main

    assert main(["strategy", "gpipe", "--workers", "4", "--stages", "4", "--batches", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["latency"] == 33 and doc["peak_activations"] == 8 and len(doc["schedule"]) == 64
    assert main(["strategy", "ddp", "--workers", "8", "--stages", "4", "--batches", "8"]) == 0
    assert "latency 12" in capsys.readouterr().out
    assert main(["strategy", "nope"]) == 2
    assert main(["strategy", "ddp", "--workers", "4", "--group-size", "3"]) == 2  # was ignored
    assert "--group-size applies to looped and fs_looped; ddp has no batch groups" in capsys.readouterr().err
    for name in ("gpipe", "cuckoo"):  # said "mapped f3 ... to ComputeAndWeightWorkers(compute=3, ...)"
        # a usage error: argparse's code
        assert main(["strategy", name, "--workers", "3", "--stages", "4"]) == 2
        assert (f"{name} puts stage s on worker s, so it needs at least as many workers as stages; "
                "got 3 workers for 4 stages" in capsys.readouterr().err)


def test_looped_groups_must_tile_the_workers():
    """group_size 3 of 4 workers sent batch 1 to worker (3·1 mod 4) + 1 = 4, which does not exist;
    it failed in the simulator as a mapping to worker 4.  The default (W // 2) did the same at W = 5."""
    from virtualpar.strategies.work import default_group_size

    for make in (LoopedPipeline, FullyShardedLoopedPipeline):
        with pytest.raises(UsageError,
                           match=r"group_size=3 must divide the 4 workers into equal groups; "
                                 r"choose one of \[1, 2, 4\]"):
            make(3, 4)
        with pytest.raises(UsageError, match="group_size=0"):
            make(0, 4)
    assert [default_group_size(w) for w in (1, 2, 4, 5, 6, 8, 9)] == [1, 1, 2, 1, 3, 4, 3]
    for name in ("looped", "fs_looped"):
        for W in (3, 5, 6, 7):
            strategy = STRATEGIES[name](W, W, 2 * W)
            for stage in range(W):  # every item lands on a worker that exists
                for batch in range(2 * W):
                    assert 0 <= strategy(Work(stage, batch, Direction.FORWARD)).compute < W
            simulate(W, W, 2 * W, strategy)
