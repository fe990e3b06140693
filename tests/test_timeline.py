"""Timeline parallelism: the time-split run's gradients equal one device's over the whole
sequence, the seed's example trains, and the makespan follows the closed form."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from virtualpar import Mesh, UsageError, VirtualCluster, nn
from virtualpar.sim import Hardware
from virtualpar.timeline import TimelineParallel, reference_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    "timeline_rnn", os.path.join(ROOT, "examples", "timeline_rnn.py")
)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


@pytest.mark.parametrize("devices, microbatches", [(1, 1), (2, 2), (3, 2), (4, 1)])
def test_time_split_gradients_equal_the_whole_sequence_on_one_device(devices, microbatches):
    inputs, labels = example.synthetic(batch=4, length=12)
    model = example.SimpleRNN(num_classes=2, hidden_dims=6, num_layers=2)
    # one SGD step with lr = 1 moves every weight by exactly minus its gradient
    op = TimelineParallel(model, microbatches=microbatches, optimizer=nn.SGD(1.0))
    before = model.state_dict()
    with VirtualCluster(Mesh({"time": devices})) as cluster:
        loss = cluster.execute(op, inputs, labels)
        after = [op.state_dict(cluster, r) for r in range(devices)]
    grads = [{k: before[k] - a[k] for k in before} for a in after]
    # the reference: the mean over the same microbatches of whole-sequence gradients
    want_loss, want = reference_step(
        example.SimpleRNN(num_classes=2, hidden_dims=6, num_layers=2),
        inputs,
        labels,
        microbatches=microbatches,
    )
    assert loss == pytest.approx(want_loss, rel=1e-10)
    for g in grads:  # every device's copy took the same step
        for k in want:
            np.testing.assert_allclose(g[k], want[k], rtol=1e-8, atol=1e-12, err_msg=k)


def test_the_seed_example_learns():
    inputs, labels = example.synthetic(batch=8, length=12)
    op = TimelineParallel(example.SimpleRNN(2, 6, 2), microbatches=2, optimizer=nn.Adam(0.05))
    with VirtualCluster(Mesh({"time": 3})) as cluster:
        losses = [cluster.execute(op, inputs, labels) for _ in range(6)]
    assert losses[-1] < 0.7 * losses[0]
    text = op.timeline()
    for s in range(3):
        for m in range(2):
            assert f"{s}F{m}" in text and f"{s}B{m}" in text
    with pytest.raises(UsageError, match="unknown clock 'modelled'"):
        op.timeline(clock="modelled")  # was the wall clock, silently


def test_one_operation_resumes_on_a_second_cluster_from_its_last_committed_step(caplog):
    """Issue 43: a second cluster started again from the model's weights, silently (the loss went
    back to step 1's); it now continues the uninterrupted run's losses exactly, and says so."""
    inputs, labels = example.synthetic(batch=4, length=12)
    whole = TimelineParallel(example.SimpleRNN(2, 6, 2), microbatches=2, optimizer=nn.SGD(0.1))
    with VirtualCluster(Mesh({"time": 2})) as cluster:
        want = [cluster.execute(whole, inputs, labels) for _ in range(4)]
    op = TimelineParallel(example.SimpleRNN(2, 6, 2), microbatches=2, optimizer=nn.SGD(0.1))
    losses = []
    for _ in range(2):
        with VirtualCluster(Mesh({"time": 2})) as cluster:
            losses += [cluster.execute(op, inputs, labels) for _ in range(2)]
            weights = op.state_dict(cluster)
    assert losses == want and want[1] < want[0]
    assert f"resuming {op.key} from step 2 (the cluster that held it closed)" in caplog.text
    with (
        VirtualCluster(Mesh({"time": 2})) as fresh,
        pytest.raises(UsageError, match="has not run on this cluster"),
    ):
        op.state_dict(fresh)
    assert weights


@pytest.mark.parametrize("devices, microbatches", [(2, 2), (3, 4), (4, 3)])
def test_makespan_under_unit_costs_is_the_closed_form(devices, microbatches):
    inputs, labels = example.synthetic(batch=12, length=12)
    op = TimelineParallel(example.SimpleRNN(2, 6, 1), microbatches=microbatches, costs={"F": 1, "B": 1})
    with VirtualCluster(Mesh({"time": devices}), hardware=Hardware.unit()) as cluster:
        cluster.execute(op, inputs, labels)
        makespan = max(cluster.clocks())
    assert makespan == 2 * (microbatches + devices - 1)


def test_a_sequence_that_does_not_split_is_refused():
    inputs, labels = example.synthetic(batch=4, length=10)
    op = TimelineParallel(example.SimpleRNN(2, 6, 1), microbatches=1)
    with VirtualCluster(Mesh({"time": 3})) as cluster:
        with pytest.raises(UsageError, match="10 steps does not split into 3 equal time segments"):
            cluster.execute(op, inputs, labels)
        with pytest.raises(
            UsageError, match="inputs must be a tuple of arrays"
        ):  # a bare array split on the wrong axis
            cluster.execute(op, inputs[0], labels)
        good_inputs, good_labels = example.synthetic(batch=4, length=12)
        cluster.execute(op, good_inputs, good_labels)
        with pytest.raises(UsageError, match=r"rank must be an int in 0..2, got 7"):  # was an IndexError
            op.state_dict(cluster, 7)


def test_the_microbatched_reference_is_the_mean_over_the_parts():
    """Unmasked, the mean of equal parts' mean losses is the whole batch's; masked, each part counts
    the same whatever rows it keeps (gradient accumulation), which is what the run computes."""
    inputs, (mask, y) = example.synthetic(batch=4, length=6)
    model = lambda: example.SimpleRNN(num_classes=2, hidden_dims=6, num_layers=2)  # noqa: E731
    full = np.ones(4, bool)
    whole_loss, whole = reference_step(model(), inputs, (full, y))
    split_loss, split = reference_step(model(), inputs, (full, y), microbatches=2)
    assert split_loss == pytest.approx(whole_loss, rel=1e-12)
    for k in whole:
        np.testing.assert_allclose(split[k], whole[k], rtol=1e-10, atol=1e-14)
    kept = np.array([True, False, True, True])  # 1 row kept in the first part, 2 in the second
    parts = [
        reference_step(model(), tuple(a[i : i + 2] for a in inputs), (kept[i : i + 2], y[i : i + 2]))
        for i in (0, 2)
    ]
    loss, _ = reference_step(model(), inputs, (kept, y), microbatches=2)
    assert loss == pytest.approx((parts[0][0] + parts[1][0]) / 2, rel=1e-12)
    assert loss != pytest.approx(reference_step(model(), inputs, (kept, y))[0], rel=1e-6)
