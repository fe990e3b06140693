"""Strategies run for real: lowered to the pipeline's actions (with weight transfers), executed
by the same executor; the transfers it makes are the simulator's, the weights one process's."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import UsageError, VirtualCluster, nn
from virtualpar.pipeline import Pipeline
from virtualpar.strategies import (
    STRATEGIES,
    Cuckoo,
    StrategyOperation,
    count_transfers,
    lower_strategy,
    simulate,
)

def mlp():
    return nn.Sequential(*[nn.Linear(8, 8, seed=i, dtype=np.float64) for i in range(4)])


def _trains_like_one_process(strategy, W: int, B: int, x: np.ndarray, y: np.ndarray) -> StrategyOperation:
    """Two steps of ``strategy`` on W devices against nn.reference_train on one process (B
    microbatches): losses and weights equal; returns the operation."""
    ref_losses, ref_state = nn.reference_train(mlp(), [(x, y)], nn.mse_loss, nn.SGD(0.1), 2, B)
    op = StrategyOperation(Pipeline(mlp(), cuts=[1, 2, 3]), strategy, W, B, optimizer=nn.SGD(0.1))
    with VirtualCluster(W) as cluster:
        losses = [cluster.execute(op, x, y) for _ in range(2)]
        state = op.state_dict(cluster)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-12)
    for k in ref_state:
        np.testing.assert_allclose(state[k], ref_state[k], rtol=1e-9, atol=1e-14, err_msg=k)
    return op


@pytest.mark.parametrize("name", ["ddp", "fsdp", "gpipe", "looped", "fs_looped"])
def test_every_lowerable_strategy_trains_like_one_process_with_the_simulated_transfers(name):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    W = S = B = 4
    op = _trains_like_one_process(STRATEGIES[name](W, S, B, 2), W, B, x, y)
    run = op.run
    assert count_transfers(op) == {"activation": run.activation_transmissions,
                                   "weight": run.weight_transmissions, "gradient": run.gradient_transmissions}


@pytest.mark.parametrize("name, W, B", [("ddp", 2, 3), ("fsdp", 4, 5), ("looped", 2, 3), ("fs_looped", 4, 3)])
def test_the_loss_is_the_batch_mean_when_workers_end_unequal_numbers_of_batches(name, W, B):
    """B not a multiple of W gives the workers unequal numbers of batches: the returned loss was the
    mean of the workers' means (0.89 where the batch's is 0.96), though the weights were right."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((2 * B, 8)), rng.standard_normal((2 * B, 8))
    group = {"looped": 1, "fs_looped": 2}.get(name, 2)
    _trains_like_one_process(STRATEGIES[name](W, 4, B, group), W, B, x, y)


def test_the_lowered_schedule_is_the_simulated_one():
    run = simulate(4, 4, 4, STRATEGIES["fsdp"](4, 4, 4))
    schedule, placement = lower_strategy(run)
    for w, actions in schedule.items():
        items = sorted((i for i in run.items if i.workers.compute == w), key=lambda i: i.start)
        assert [str(a) for a in actions] == [
            f"{i.work.stage}{'F' if i.work.direction.value == 'f' else 'B'}{i.work.batch}" for i in items
        ]
    assert [placement.weight_rank(s) for s in range(4)] == [0, 1, 2, 3]


def test_cuckoo_is_simulated_but_not_lowered():
    run = simulate(4, 4, 8, Cuckoo(4, 4, 8))
    with pytest.raises(UsageError, match="runs its forward on worker .* and its backward on worker"):
        lower_strategy(run)


def test_a_cluster_of_another_size_is_named_as_the_cluster():
    """Without axis= the message said 'the mesh axis None has 4'."""
    op = StrategyOperation(Pipeline(mlp(), cuts=[1, 2, 3]), STRATEGIES["gpipe"](4, 4, 4), 4, 4)
    rng = np.random.default_rng(1)
    with VirtualCluster(2) as cluster, pytest.raises(
            UsageError,
            match=r"for 4 pipeline ranks; the cluster has 2 devices \(pass axis= to "
                  r"run along one mesh axis\)"):
        cluster.execute(op, rng.standard_normal((8, 8)), rng.standard_normal((8, 8)))
