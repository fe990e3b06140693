"""Checkpoints and resume of the training operations on real clusters (issue 43): save/load round
trips equal the trained state bit for bit, a pipeline checkpoint re-cut into other stages trains on
exactly as if never stopped, and a device killed mid-run costs nothing but the step it killed."""

from __future__ import annotations

import copy
import logging
import os

import numpy as np
import pytest

from virtualpar import ClusterClosedError, DeviceDied, Mesh, UsageError, VirtualCluster, nn
from virtualpar.checkpoint import Checkpoint, ResumeError, recovery
from virtualpar.pipeline import Pipeline, PipelinedOperation
from virtualpar.strategies import STRATEGIES, StrategyOperation
from virtualpar.timeline import TimelineParallel
from tests.test_timeline import example


def mlp(depth: int = 4) -> nn.Sequential:
    return nn.Sequential(*[nn.Linear(6, 6, seed=i, dtype=np.float64) for i in range(depth)])


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((8, 6)), rng.standard_normal((8, 6))


def pipe_op(cuts, opt=None) -> PipelinedOperation:
    return PipelinedOperation(Pipeline(mlp(), cuts=cuts), "1f1b", microbatches=2,
                              optimizer=opt or nn.Adam(0.01))


def train(op, cluster, steps: int) -> list[float]:
    return [cluster.execute(op, *batch(op.step)) for _ in range(steps)]


def _equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def _same_state(a, b) -> None:
    """Two TrainingStates equal bit for bit: step, weights, optimizer step counts and slots."""
    assert a.step == b.step and set(a.stages) == set(b.stages)
    for s in a.stages:
        _equal(a.stages[s].params, b.stages[s].params)
        oa, ob = a.stages[s].optimizer, b.stages[s].optimizer
        assert (oa["t"], oa["lr"]) == (ob["t"], ob["lr"]) and set(oa["state"]) == set(ob["state"])
        for k in oa["state"]:
            _equal(oa["state"][k], ob["state"][k])


@pytest.fixture(scope="module")
def reference() -> dict:
    """Six uninterrupted steps of the 4-layer MLP under Adam in one process (nn.reference_train, the
    batch of step k at step k, 2 microbatches): what every resumed run must equal."""
    losses, state = nn.reference_train(mlp(), [batch(k) for k in range(6)], nn.mse_loss, nn.Adam(0.01), 6, 2)
    return {"losses": losses, "state": state}


def test_pipeline_save_load_round_trip_equals_the_trained_state_exactly(tmp_path):
    op = pipe_op([2])
    with VirtualCluster(2) as cluster:
        train(op, cluster, 2)
        op.save(cluster, tmp_path / "c")
        want = op.state_dict(cluster)
        kept = op.committed()
    other = pipe_op([2])
    with VirtualCluster(2) as cluster:
        assert other.load(cluster, tmp_path / "c") == 2 and other.step == 2
        _equal(other.state_dict(cluster), want)
        _same_state(other.committed(), kept)
        fetched = other._fetch(cluster)
    _same_state(fetched, kept)  # the devices hold the optimizer state too, not only the driver
    ck = Checkpoint(tmp_path / "c")
    assert ck.layout["kind"] == "PipelinedOperation" and ck.layout["first_layers"] == [0, 2]
    assert ck.meta["optimizer"] == {"type": "Adam", "lr": 0.01, "t": {"0": 2, "1": 2}}
    assert sorted(k for k in ck.keys() if k.startswith("optim/0.weight/")) == [
        "optim/0.weight/m",
        "optim/0.weight/step",
        "optim/0.weight/v",
    ]


def test_strategy_round_trip_with_replicated_stages(tmp_path):
    """DDP keeps a copy of every stage on every worker: one copy is reported and saved per stage."""
    def make():
        return StrategyOperation(Pipeline(mlp(), cuts=[1, 2, 3]), STRATEGIES["ddp"](2, 4, 2), 2, 2,
                                 optimizer=nn.SGD(0.1, momentum=0.5))

    op = make()
    with VirtualCluster(2) as cluster:
        train(op, cluster, 2)
        op.save(cluster, tmp_path / "c")
        want = op.state_dict(cluster)
    assert len(Checkpoint(tmp_path / "c").index["files"]) == 4
    other = make()
    with VirtualCluster(2) as cluster:
        other.load(cluster, tmp_path / "c")
        _equal(other.state_dict(cluster), want)
        _same_state(other._fetch(cluster), op.committed())


def test_timeline_round_trip_is_one_shard_every_device_loads(tmp_path):
    inputs, labels = example.synthetic(batch=4, length=12)
    op = TimelineParallel(example.SimpleRNN(2, 6, 2), microbatches=2, optimizer=nn.Adam(0.05))
    with VirtualCluster(Mesh({"time": 2})) as cluster:
        for _ in range(2):
            cluster.execute(op, inputs, labels)
        op.save(cluster, tmp_path / "c")
        want = op.state_dict(cluster)
    other = TimelineParallel(example.SimpleRNN(2, 6, 2), microbatches=2, optimizer=nn.Adam(0.05))
    with VirtualCluster(Mesh({"time": 3})) as cluster:  # another number of time segments
        assert other.load(cluster, tmp_path / "c") == 2
        for r in range(3):
            _equal(other.state_dict(cluster, r), want)
    assert list(Checkpoint(tmp_path / "c").index["files"])[0].startswith("model.")


@pytest.mark.parametrize("cuts_from, ranks_from, cuts_to, ranks_to",
                         [([2], 2, [1, 2, 3], 4), ([1, 2, 3], 4, [2], 2)])
def test_a_pipeline_checkpoint_recut_into_other_stages_trains_on_as_if_never_stopped(
        tmp_path, reference, cuts_from, ranks_from, cuts_to, ranks_to):
    op = pipe_op(cuts_from)
    with VirtualCluster(ranks_from) as cluster:
        losses = train(op, cluster, 3)
        op.save(cluster, tmp_path / "c")
    other = pipe_op(cuts_to)
    with VirtualCluster(ranks_to) as cluster:
        other.load(cluster, tmp_path / "c")
        losses += train(other, cluster, 3)
        state = other.state_dict(cluster)
    assert losses == pytest.approx(reference["losses"], rel=1e-12)
    for k, want in reference["state"].items():
        np.testing.assert_allclose(state[k], want, rtol=1e-12, atol=1e-15, err_msg=k)
    # and against the same pipeline never stopped: the same bits
    whole = pipe_op(cuts_to)
    with VirtualCluster(ranks_to) as cluster:
        train(whole, cluster, 6)
        _equal(state, whole.state_dict(cluster))


@pytest.mark.parametrize("slots", [True, False], ids=["slot-files", "in-replies"])
def test_a_device_killed_mid_run_resumes_on_a_new_cluster_with_the_fault_free_weights(
    caplog, monkeypatch, slots
):
    """The driver copy lives in slot files no name points to (checkpoint/spill.py), or, when they
    cannot be made, comes with each step's replies: either way the kill costs only its step."""
    if not slots:
        def no_room(devices):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(recovery, "Spill", no_room)
    whole = pipe_op([2])
    with VirtualCluster(2) as cluster:
        train(whole, cluster, 5)
        want = whole.state_dict(cluster)
    op = pipe_op([2])
    with VirtualCluster(2) as cluster:
        train(op, cluster, 3)
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"virtualpar-{os.getpid()}-keep")]
        cluster.inject(1, 2, "kill")
        with pytest.raises(DeviceDied):
            cluster.execute(op, *batch(op.step))
        with pytest.raises(ClusterClosedError):  # the devices are gone: the state lives on in the driver
            op.state_dict(cluster)
    assert op.step == 3
    mid = op.committed_state_dict()
    with caplog.at_level(logging.WARNING, logger="virtualpar.checkpoint"), VirtualCluster(2) as cluster:
        # step 3's loss from step 3's weights
        assert train(op, cluster, 1)[0] == pytest.approx(float(np.mean([
            nn.mse_loss(_forward(mid, xm), ym) for xm,
            ym in zip(np.split(batch(3)[0], 2), np.split(batch(3)[1], 2))])),
            rel=1e-12)
        train(op, cluster, 1)
        _equal(op.state_dict(cluster), want)
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.name == "virtualpar.checkpoint" and r.levelno >= logging.WARNING
    ]
    assert lines == [f"resuming {op.key} from step 3 (the cluster that held it closed)"]


def _forward(weights: dict, x: np.ndarray) -> np.ndarray:
    model = mlp()
    model.load_state_dict(weights)
    return model(x)


def test_a_timeline_operation_resumes_after_a_kill(caplog):
    inputs, labels = example.synthetic(batch=4, length=12)
    def make():
        return TimelineParallel(example.SimpleRNN(2, 6, 2), microbatches=2, optimizer=nn.Adam(0.05))

    whole = make()
    with VirtualCluster(Mesh({"time": 2})) as cluster:
        want = [cluster.execute(whole, inputs, labels) for _ in range(4)]
    op = make()
    with VirtualCluster(Mesh({"time": 2})) as cluster:
        losses = [cluster.execute(op, inputs, labels) for _ in range(2)]
        cluster.inject(0, 1, "kill")
        with pytest.raises(DeviceDied):
            cluster.execute(op, inputs, labels)
    with VirtualCluster(Mesh({"time": 2})) as cluster:
        losses += [cluster.execute(op, inputs, labels) for _ in range(2)]
        _equal(op.state_dict(cluster), whole.committed_state_dict())
    assert losses == want
    assert f"resuming {op.key} from step 2 (the cluster that held it closed)" in caplog.text


def test_a_copy_of_an_operation_carries_its_committed_state_and_a_loaded_one_says_where_from(
    tmp_path, caplog
):
    op = pipe_op([2])
    with VirtualCluster(2) as cluster:
        train(op, cluster, 2)
        twin = copy.deepcopy(op)
        train(op, cluster, 1)  # rewrites the slot files the copy was made from
    assert twin.step == 2 and twin.key != op.key
    with VirtualCluster(2) as cluster:
        train(twin, cluster, 1)
        _equal(twin.state_dict(cluster), op.committed_state_dict())
    op.save(None, tmp_path / "c")
    other = pipe_op([1, 2, 3])
    other.load(None, tmp_path / "c")
    with VirtualCluster(4) as cluster:
        train(other, cluster, 1)
    assert f"resuming {other.key} from step 3 (loaded from {tmp_path / 'c'})" in caplog.text


def test_without_a_driver_copy_the_newest_checkpoint_is_resumed_and_the_lost_steps_redone(tmp_path, caplog):
    whole = pipe_op([2])
    with VirtualCluster(2) as cluster:
        train(whole, cluster, 5)
        want = whole.state_dict(cluster)
    op = pipe_op([2]).configure_recovery(driver_copy=False, checkpoint_every=2, checkpoint_dir=tmp_path / "c")
    with VirtualCluster(2) as cluster:
        train(op, cluster, 3)
        assert op.committed() is None and Checkpoint(tmp_path / "c").step == 2
        cluster.inject(0, 1, "exit", code=4)
        with pytest.raises(DeviceDied):
            cluster.execute(op, *batch(op.step))
    assert op.step == 2  # where training goes on, known at once: the loop feeds step 2's batch next
    with VirtualCluster(2) as cluster:
        train(op, cluster, 5 - op.step)
        _equal(op.state_dict(cluster), want)
    lines = [r.getMessage() for r in caplog.records if r.name == "virtualpar.checkpoint"]
    assert lines == [f"resuming {op.key} from step 2 (the cluster that held it closed; "
                     f"checkpoint {tmp_path / 'c'}, "
                     "1 committed steps are redone)"]


def test_an_operation_whose_state_is_lost_raises_rather_than_starting_again():
    op = pipe_op([2]).configure_recovery(driver_copy=False)
    with VirtualCluster(2) as cluster:
        train(op, cluster, 2)
        cluster.inject(1, 1, "kill")
        with pytest.raises(DeviceDied):
            cluster.execute(op, *batch(2))
    with VirtualCluster(2) as cluster, pytest.raises(
            ResumeError,
            match=rf"{op.key} committed 2 steps and the cluster that held it closed, but no copy"):
        cluster.execute(op, *batch(2))


def test_a_raised_fault_is_retried_on_the_same_cluster_from_the_committed_step():
    whole = pipe_op([2])
    with VirtualCluster(2) as cluster:
        train(whole, cluster, 3)
        want = whole.state_dict(cluster)
    op = pipe_op([2]).configure_recovery(driver_copy=False)  # no copy needed: the cluster survives a raise
    with VirtualCluster(2) as cluster:
        train(op, cluster, 1)
        cluster.inject(0, 2, "raise")
        with pytest.raises(Exception, match="injected"):
            cluster.execute(op, *batch(op.step))
        train(op, cluster, 2)
        _equal(op.state_dict(cluster), want)


def test_save_after_the_cluster_closed_writes_the_driver_copy(tmp_path, reference, caplog):
    op = pipe_op([2])
    with VirtualCluster(2) as cluster:
        losses = train(op, cluster, 2)
        want = op.state_dict(cluster)
    op.save(None, tmp_path / "c")  # the cluster is gone: the driver's copy is what is saved
    ck = Checkpoint(tmp_path / "c")
    assert ck.step == 2 and all(np.array_equal(ck.tensor(f"model/{k}"), v) for k, v in want.items())
    other = pipe_op([1, 2, 3])
    assert other.load(None, tmp_path / "c") == 2  # placed on the next cluster it runs on
    with VirtualCluster(4) as cluster:
        losses += train(other, cluster, 4)
        state = other.state_dict(cluster)
    assert losses == pytest.approx(reference["losses"], rel=1e-12)
    for k, v in reference["state"].items():
        np.testing.assert_allclose(state[k], v, rtol=1e-12, atol=1e-15, err_msg=k)
    assert f"resuming {other.key} from step 2" in caplog.text


def test_recovery_settings_are_checked():
    op = pipe_op([2])
    with pytest.raises(UsageError, match="checkpoint_every must be an int >= 1"):
        op.configure_recovery(checkpoint_every=0, checkpoint_dir="x")
    with pytest.raises(UsageError, match="checkpoint_every and checkpoint_dir go together"):
        op.configure_recovery(checkpoint_every=3)
    with VirtualCluster(2) as cluster, pytest.raises(UsageError, match="has not run on this cluster"):
        op.save(cluster, "unused")


def test_a_data_parallel_pipeline_resumes_with_one_copy_of_each_stage_kept(tmp_path):
    """dp=2 x pp=2: the first replica reports each stage; after a kill the new cluster's replicas all
    take the kept copy, and the run ends where the fault-free one does, bit for bit."""
    make = lambda: PipelinedOperation(Pipeline(mlp(), cuts=[2]), "1f1b", microbatches=2,  # noqa: E731
                                      optimizer=nn.Adam(0.01), axis="pp", dp_axis="dp")
    mesh = {"dp": 2, "pp": 2}
    whole = make()
    with VirtualCluster(Mesh(mesh)) as cluster:
        train(whole, cluster, 4)
        want = whole.state_dict(cluster)
    op = make()
    with VirtualCluster(Mesh(mesh)) as cluster:
        train(op, cluster, 2)
        cluster.inject(3, 1, "kill")
        with pytest.raises(DeviceDied):
            cluster.execute(op, *batch(op.step))
    assert set(op.committed().stages) == {0, 1}
    with VirtualCluster(Mesh(mesh)) as cluster:
        train(op, cluster, 2)
        _equal(op.state_dict(cluster), want)
        op.save(cluster, tmp_path / "c")
    assert len(Checkpoint(tmp_path / "c").index["files"]) == 2
