"""The ParallelTrainer's per-device program driven SPMD (every device its own host) trains exactly as
the driver does: on the emulator here, under mpiexec in test_train_mpi.py."""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import VirtualCluster, nn
from virtualpar.parallel import ParallelConfig, ParallelTrainer
from virtualpar.parallel.spmd import SpmdTrainer, assemble, rank_batch

STEPS = 3


def gpt() -> nn.GPT:
    return nn.GPT(32, 16, 4, 4, 8, seed=5, dtype=np.float64)


def batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.integers(0, 32, (8, 8)), rng.integers(0, 32, (8, 8))


def spmd_program(cfg: ParallelConfig):
    def program(dev):
        tokens, targets = batch()
        local = SpmdTrainer(ParallelTrainer(gpt(), cfg, optimizer=nn.AdamW(1e-2)), dev)
        losses = [local.step(tokens, targets) for _ in range(STEPS)]
        return losses, local.fetch()
    return program


@pytest.mark.parametrize("kw", [dict(dp=2, tp=2, pp=2, microbatches=2, zero=1),
                                dict(dp=2, pp=2, microbatches=2, zero=3, schedule="gpipe"),
                                dict(tp=2, cp=2, sequence_parallel=True, recompute=True)],
                         ids=["dp2-tp2-pp2-zero1", "dp2-pp2-zero3-gpipe", "tp2-cp2-sp-recompute"])
def test_spmd_driven_steps_equal_the_driver_s(kw):
    cfg = ParallelConfig(**kw)
    tokens, targets = batch()
    trainer = ParallelTrainer(gpt(), cfg, optimizer=nn.AdamW(1e-2))
    with VirtualCluster(cfg.mesh()) as cluster:
        want_losses = [cluster.execute(trainer, tokens, targets) for _ in range(STEPS)]
        want = trainer.state_dict(cluster)
    with VirtualCluster(cfg.mesh()) as cluster:
        replies = cluster.run(spmd_program(cfg))
    got = assemble(trainer, cfg.mesh(), [parts for _, parts in replies])
    losses = [[l for l in ls if l is not None] for ls in zip(*(ls for ls, _ in replies))]
    np.testing.assert_allclose([np.mean(l) for l in losses], want_losses, rtol=0, atol=1e-12)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-12, err_msg=k)
    start = gpt().state_dict()
    assert max(np.abs(want[k] - start[k]).max() for k in want) > 1e-3


def test_rank_batch_covers_the_batch_once_per_tp_rank():
    """The dp rows and cp chunks the first stage's devices take tile the batch exactly, per tp rank."""
    cfg = ParallelConfig(dp=2, cp=2, tp=2, pp=2)
    trainer = ParallelTrainer(gpt(), cfg)
    spec, _ = trainer._plan()
    mesh = cfg.mesh()
    tokens = np.arange(64).reshape(8, 8)
    seen = np.zeros((cfg.tp, 8, 8), int)
    for r in range(mesh.size):
        x, y = rank_batch(cfg, spec, mesh, r, tokens, tokens + 1)
        at = mesh.index(r)
        assert (x is None) == (at.pp != 0) and (y is None) == (at.pp != 1)
        if x is not None:
            seen[at.tp, at.dp * 4:(at.dp + 1) * 4, at.cp * 4:(at.cp + 1) * 4] += 1
            np.testing.assert_array_equal(x, tokens[at.dp * 4:(at.dp + 1) * 4, at.cp * 4:(at.cp + 1) * 4])
    assert (seen == 1).all()


def test_split_flat_s_gradient_is_slicing_s_with_zeros_on_the_padding():
    """stage.unpack's primitive: the same gradient as autograd's slices, padding included."""
    import autograd.numpy as anp
    from autograd import grad

    from virtualpar.parallel.flat import split_flat

    pieces = ((0, 6, (2, 3)), (6, 10, (4,)))
    rng = np.random.default_rng(0)
    flat, w = rng.normal(size=11), rng.normal(size=(2, 3))  # one padding entry at the end

    def by_split(f):
        a, b = split_flat(f, pieces)
        return anp.sum(anp.tanh(a) * w) + anp.sum(b ** 3)

    def by_slices(f):
        return anp.sum(anp.tanh(anp.reshape(f[0:6], (2, 3))) * w) + anp.sum(f[6:10] ** 3)

    got, want = grad(by_split)(flat), grad(by_slices)(flat)
    np.testing.assert_array_equal(got, want)
    assert got[10] == 0.0 and got.shape == flat.shape
    only_b = grad(lambda f: anp.sum(split_flat(f, pieces)[1] ** 2))(flat)  # a piece no one reads: zeros
    np.testing.assert_array_equal(only_b, np.r_[np.zeros(6), 2 * flat[6:10], 0.0])
