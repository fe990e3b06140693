"""ParallelConfig and the driver's refusals: bad input is refused before any device starts, naming the
dimension; a step that fails anywhere updates nothing; the package uses only the Device protocol."""

from __future__ import annotations

import ast
import os

import numpy as np
import pytest

from virtualpar import Mesh, UsageError, VirtualCluster, nn
from virtualpar.parallel import ParallelConfig, ParallelTrainer
from virtualpar.parallel.layout import stage_units, tp_dim


def gpt(**kw) -> nn.GPT:
    args = dict(vocab=32, d_model=16, n_layers=4, n_heads=4, seq_len=8, seed=3, dtype=np.float64)
    return nn.GPT(**{**args, **kw})


def test_the_mesh_has_the_four_axes_tp_fastest():
    mesh = ParallelConfig(dp=2, tp=2, pp=1, cp=2).mesh()
    assert mesh.axis_names == ("dp", "pp", "cp", "tp")
    assert dict(mesh.shape) == {"dp": 2, "pp": 1, "cp": 2, "tp": 2}
    assert mesh.groups("tp")[0] == (0, 1) and mesh.groups("dp")[0] == (0, 4)


@pytest.mark.parametrize("kw, match", [
    (dict(tp=3), r"heads=4 do not split over tp=3"),
    (dict(pp=3), r"layers=4 do not split over pp × virtual = 3 × 1 = 3"),
    (dict(pp=2, schedule="interleaved_1f1b", virtual=4),
     r"layers=4 do not split over pp × virtual = 2 × 4 = 8"),
])
def test_a_model_the_degrees_do_not_divide_is_refused_naming_the_dimension(kw, match):
    with pytest.raises(UsageError, match=match):
        ParallelTrainer(gpt(), ParallelConfig(**kw))


def test_a_vocabulary_tp_does_not_divide_is_refused():
    with pytest.raises(UsageError, match=r"vocabulary=30 does not split over tp=4"):
        ParallelTrainer(gpt(vocab=30), ParallelConfig(tp=4))


def test_tied_embeddings_need_one_stage():
    with pytest.raises(UsageError, match=r"tied embeddings need .* one stage"):
        ParallelTrainer(gpt(tie_embeddings=True), ParallelConfig(pp=2))


@pytest.mark.parametrize("kw, shape, match", [
    (dict(dp=2, microbatches=2), (6, 8), r"batch=6 does not split over dp × microbatches = 2 × 2 = 4"),
    (dict(cp=3), (4, 8), r"sequence=8 does not split over cp=3"),
    (dict(cp=2, tp=4, sequence_parallel=True), (4, 4),
     r"sequence=4 does not split over cp × tp = 2 × 4 .*sequence parallelism"),
])
def test_a_batch_the_degrees_do_not_divide_is_refused(kw, shape, match):
    with pytest.raises(UsageError, match=match):
        ParallelConfig(**kw).check_batch(shape, 8)


@pytest.mark.parametrize("kw, match", [
    (dict(dp=0), r"dp must be a positive int, got 0"),
    (dict(zero=2), r"zero must be one of \(0, 1, 3\), got 2"),
    (dict(schedule="nope"), r"unknown schedule 'nope'"),
    (dict(sequence_parallel=1), r"sequence_parallel must be True or False"),
])
def test_bad_values_are_refused(kw, match):
    with pytest.raises(UsageError, match=match):
        ParallelConfig(**kw)


def test_refusals_come_before_any_device_runs():
    """A mesh of the wrong size, a batch that does not divide, a schedule that cannot take the
    microbatches: refused in the driver, and the cluster has run nothing for the trainer."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 32, (6, 8))
    trainer = ParallelTrainer(gpt(), ParallelConfig(dp=2, microbatches=2))
    with VirtualCluster(Mesh({"dp": 2, "pp": 1, "cp": 1, "tp": 2})) as cluster:
        with pytest.raises(UsageError, match=r"mesh is \{'dp': 2, 'pp': 1, 'cp': 1, 'tp': 2\} \(4 devices\), "
                                             r"but the configuration needs .*\(2 devices\)"):
            cluster.execute(trainer, tokens[:4], tokens[:4])
        assert not any(cluster.run(lambda dev: any(k.startswith("parallel/") for k in dev.state)))
    with VirtualCluster(ParallelConfig(dp=2, microbatches=2).mesh()) as cluster:
        with pytest.raises(UsageError, match=r"batch=6 does not split"):
            cluster.execute(trainer, tokens, tokens)
        odd = ParallelConfig(pp=2, microbatches=3, schedule="interleaved_1f1b")
        interleaved = ParallelTrainer(gpt(), odd)
        with VirtualCluster(interleaved.config.mesh()) as other:
            with pytest.raises(UsageError, match=r"microbatches must be a multiple of 2"):
                other.execute(interleaved, tokens, tokens)
            assert not any(other.run(lambda dev: any(k.startswith("parallel/") for k in dev.state)))
        assert not any(cluster.run(lambda dev: any(k.startswith("parallel/") for k in dev.state)))


def test_weights_cannot_be_fetched_from_a_cluster_the_trainer_never_ran_on():
    trainer = ParallelTrainer(gpt(), ParallelConfig())
    with VirtualCluster(1) as cluster:
        with pytest.raises(UsageError, match=r"has not run on this cluster"):
            trainer.state_dict(cluster)


def test_the_layout_splits_megatron_s_way():
    assert tp_dim("tok_emb.weight") == 0 and tp_dim("head.weight") == 1
    assert tp_dim("blocks.0.attn.qkv.weight") == 1 and tp_dim("blocks.0.attn.qkv.bias") == 0
    assert tp_dim("blocks.1.attn.out.weight") == 0 and tp_dim("blocks.1.attn.out.bias") is None
    assert tp_dim("blocks.0.mlp.up.weight") == 1 and tp_dim("blocks.0.mlp.down.weight") == 0
    assert tp_dim("blocks.0.norm1.weight") is None and tp_dim("pos_emb.weight") is None
    units = stage_units(gpt(), 2, 2, 3)
    assert [u.name for u in units[0]] == ["embed", "blocks.0", "blocks.1"]
    assert [u.name for u in units[1]] == ["blocks.2", "blocks.3", "final"]
    total = sum(u.size for us in units for u in us)
    sharded = sum(v.size for k, v in gpt().state_dict().items() if tp_dim(k) is not None)
    assert total == gpt().num_parameters() - sharded // 2  # tp=2 holds half of every sharded parameter
    assert all(u.padded % 3 == 0 and 0 <= u.padded - u.size < 3 for us in units for u in us)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_step_that_fails_anywhere_updates_nothing(rank):
    """ZeRO-1's update has collectives (the all_gather of the stepped shards): a fault in them, or
    anywhere in a step, must leave every device's weights and optimizer state as they were."""
    from virtualpar.errors import VirtualParError

    rng = np.random.default_rng(0)
    tokens, targets = rng.integers(0, 32, (4, 8)), rng.integers(0, 32, (4, 8))
    cfg = ParallelConfig(dp=2, zero=1)
    trainer = ParallelTrainer(gpt(n_layers=2), cfg, optimizer=nn.AdamW(1e-2))
    with VirtualCluster(cfg.mesh()) as cluster:
        cluster.execute(trainer, tokens, targets)
        before = trainer.state_dict(cluster)
        for k in (1, 5, 20, 60, 10_000):
            cluster.inject(rank, k, "raise")
            with pytest.raises(VirtualParError):
                cluster.execute(trainer, tokens, targets)
            now = trainer.state_dict(cluster)
            assert all(np.array_equal(now[n], before[n]) for n in before), f"op {k}: half-updated"
        want, _ = nn.reference_train(gpt(n_layers=2), [(tokens, targets)], nn.cross_entropy, nn.AdamW(1e-2),
                                     2)
        assert cluster.execute(trainer, tokens, targets) == pytest.approx(want[1], abs=1e-12)


def test_the_package_uses_only_the_device_protocol():
    """virtualpar/parallel imports nothing from runtime/, transport/ or commands/, not even inside a
    function."""
    root = os.path.join(os.path.dirname(__file__), "..", "virtualpar", "parallel")
    offenders = []
    for f in sorted(os.listdir(root)):
        if not f.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(open(os.path.join(root, f), encoding="utf-8").read())):
            mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(part in ("runtime", "transport", "commands") for m in mods for part in m.split(".")):
                offenders.append(f"{f}:{node.lineno}")
    assert offenders == []


@pytest.mark.parametrize("cuts, match", [
    (["head"], r"cannot cut the GPT at 'head': .* one of \['blocks.1', 'blocks.2', 'blocks.3'\]"),
    (["blocks.0"], r"cannot cut the GPT at 'blocks.0'"),
    (["blocks.2", "blocks.1"], r"increasing and distinct"),
    (["blocks.1", "blocks.2"], r"2 cuts make 3 stages, but the configuration runs 2"),
])
def test_cuts_name_the_blocks_that_start_a_stage(cuts, match):
    with pytest.raises(UsageError, match=match):
        ParallelTrainer(gpt(), ParallelConfig(pp=2, microbatches=2), cuts=cuts)


def test_uneven_cuts_place_the_blocks_where_named():
    trainer = ParallelTrainer(gpt(n_layers=3), ParallelConfig(pp=2, microbatches=2), cuts=["blocks.1"])
    assert [[u.name for u in us] for us in trainer.units] == [["embed", "blocks.0"],
                                                              ["blocks.1", "blocks.2", "final"]]
