"""Checkpoints and resume of the composed trainer (issue 43): ``ParallelTrainer.save`` / ``load`` across
layouts (dp, tp, pp cuts, zero stage, sp) and the resume on a new cluster after a device died.

A tiny float64 GPT (4 layers, 4 heads, d 16, vocab 32, seq 8) under AdamW; each step's batch is a
function of the step number, so a resumed run feeds the batches a run that never stopped feeds.

Exactness.  In one layout a resumed run is the fault-free run bit for bit: every reduction has a
fixed order and the restored state is the saved one, bit for bit.  Across layouts the *transfer*
is bit for bit (asserted on the state fetched back from the new devices), but the steps after it
are not: tp=4 sums a row-parallel layer's partial products four at a time where tp=2 sums two,
zero=1's reduce_scatter and zero=0's all_reduce add the replicas' gradients in another order — one
rounding of difference per sum.  They agree with the layout that never stopped within 1e-12,
except the attention's key bias: its gradient is zero in exact arithmetic (softmax ignores a
constant added to every score), so what a layout computes there is roundoff of about 1e-18, and
AdamW turns it into a step of lr·g/(√v + ε) ≈ lr·1e-18/1e-8 ≈ 1e-12 — of another sign in another
layout.  For that one tensor the bound is 1e-10; both are far below any step's size (~lr = 1e-2),
and every weight also equals the single-process reference within the 1e-9 of test_parallel_exact.
Measured after two steps past the load: 2.2e-16 for every weight, 2e-12 for the key bias (dp=2 ×
tp=2 → tp=4); moving pipeline cuts, pp=2 → pp=1 and zero=1 → zero=0 at dp=2 change no sum and
are asserted bit for bit.
"""

from __future__ import annotations

import copy
import functools
import logging

import numpy as np
import pytest

from virtualpar import ClusterClosedError, DeviceDied, UsageError, VirtualCluster, nn
from virtualpar.checkpoint import Checkpoint, CheckpointError, ResumeError, recovery
from virtualpar.parallel import ParallelConfig, ParallelTrainer

C = ParallelConfig
LR = 1e-2


def gpt(**kw) -> nn.GPT:
    return nn.GPT(32, 16, 4, 4, 8, seed=3, dtype=np.float64, **kw)


def data(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([7, step])
    return rng.integers(0, 32, (8, 8)), rng.integers(0, 32, (8, 8))


def trainer(cfg: ParallelConfig, cuts: list[str] | None = None, **kw) -> ParallelTrainer:
    return ParallelTrainer(gpt(**kw), cfg, optimizer=nn.AdamW(LR), cuts=cuts)


def train(tr: ParallelTrainer, cluster, steps: int) -> list[float]:
    return [cluster.execute(tr, *data(tr.step)) for _ in range(steps)]


@functools.lru_cache(maxsize=None)
def never_stopped(cfg: ParallelConfig, steps: int, cuts: tuple | None = None) -> tuple[list[float], dict]:
    tr = trainer(cfg, None if cuts is None else list(cuts))
    with VirtualCluster(cfg.mesh()) as cluster:
        losses = train(tr, cluster, steps)
        return losses, tr.state_dict(cluster)


@functools.lru_cache(maxsize=None)
def one_process(steps: int) -> tuple[list[float], dict]:
    return nn.reference_train(gpt(), [data(k) for k in range(steps)], nn.cross_entropy, nn.AdamW(LR), steps)


def _equal(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def _close(got: dict, want: dict) -> None:
    """Within 1e-12, the key bias within 1e-10 (see the module doc)."""
    assert list(got) == list(want)
    for k in want:
        tol = 1e-10 if k.endswith("attn.qkv.bias") else 1e-12
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=tol, err_msg=k)


def _same_state(a, b) -> None:
    """Two TrainingStates (named stages) equal bit for bit: step, weights, AdamW's t, m, v and steps."""
    assert a.step == b.step and set(a.stages) == set(b.stages)
    for s in a.stages:
        pa, pb = a.stages[s], b.stages[s]
        assert list(pa.params) == list(pb.params)
        for k in pa.params:
            assert np.array_equal(pa.params[k], pb.params[k]), (s, k)
        assert (pa.optimizer["t"], pa.optimizer["lr"]) == (pb.optimizer["t"], pb.optimizer["lr"])
        assert set(pa.optimizer["state"]) == set(pb.optimizer["state"])
        for k, slots in pa.optimizer["state"].items():
            assert set(slots) == {"m", "v", "step"}
            for slot, v in slots.items():
                assert np.array_equal(v, pb.optimizer["state"][k][slot]), (s, k, slot)


def _model_keyed(state, tr: ParallelTrainer) -> dict:
    """A named-stage state as whole tensors by model name (weights and slots), layout-free."""
    from virtualpar.checkpoint import to_shards
    from virtualpar.checkpoint.tiles import assemble
    shapes = {k: v.shape for k, v in tr._model_weights().items()}
    shards, _ = to_shards(state, tr._stage_names(), tr._shard_name, tr.optimizer, shapes)
    pieces: dict[str, list] = {}
    for arrays in shards.values():
        for key, p in arrays.items():
            pieces.setdefault(key, []).append((p.box(), p.array, p.full_shape))
    return {k: assemble(k, v[0][2], v[0][1].dtype, [(box, a) for box, a, _ in v])
            for k, v in sorted(pieces.items())}


def test_a_round_trip_in_one_layout_trains_on_bit_for_bit(tmp_path):
    cfg = C(dp=2, tp=2, zero=1)
    tr = trainer(cfg)
    with VirtualCluster(cfg.mesh()) as cluster:
        losses = train(tr, cluster, 2)
        path = tr.save(cluster, tmp_path / "c")
        kept = tr.committed()
        _same_state(tr._fetch(cluster), kept)  # the driver copy is what the devices hold
        _equal(tr.committed_state_dict(), tr.state_dict(cluster))
    ck = Checkpoint(path)
    assert ck.step == 2 and ck.layout["kind"] == "ParallelTrainer"
    assert (ck.layout["dp"], ck.layout["tp"], ck.layout["zero"]) == (2, 2, 1)
    assert sorted(n.split(".")[0] for n in ck.index["files"]) == ["stage0-tp0", "stage0-tp1"]  # per tp rank
    assert ck.meta["optimizer"]["type"] == "AdamW" and set(ck.meta["optimizer"]["t"].values()) == {2}
    other = trainer(cfg)
    with VirtualCluster(cfg.mesh()) as cluster:
        assert other.load(cluster, path) == 2 and other.step == 2
        _same_state(other._fetch(cluster), kept)  # AdamW's moments and steps went back onto the devices
        losses += train(other, cluster, 2)
        got = other.state_dict(cluster)
    want_losses, want = never_stopped(cfg, 4)
    assert losses == want_losses
    _equal(got, want)


def test_dp2_tp2_loads_into_tp4_and_trains_on_as_if_never_stopped(tmp_path):
    """The issue's check: the transfer bit for bit, the steps after it within 1e-12 (module doc)."""
    src, dst = C(dp=2, tp=2), C(tp=4)
    tr = trainer(src)
    with VirtualCluster(src.mesh()) as cluster:
        losses = train(tr, cluster, 2)
        tr.save(cluster, tmp_path / "c")
    other = trainer(dst)
    with VirtualCluster(dst.mesh()) as cluster:
        other.load(cluster, tmp_path / "c")
        moved = _model_keyed(other._fetch(cluster), other)
        losses += train(other, cluster, 2)
        got = other.state_dict(cluster)
    _equal(moved, _model_keyed(tr.committed(), tr))
    want_losses, want = never_stopped(src, 4)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-13, atol=0)
    _close(got, want)
    ref_losses, ref = one_process(4)
    np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=1e-9)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=1e-9, err_msg=k)


def test_dropout_resumes_with_the_masks_of_the_steps_it_resumes_at(tmp_path):
    """A trainer loaded from step 2 draws step 2's and 3's masks: dp2×tp2 saved, tp4 loaded, the
    four steps equal one process dropping out with steps 0…3."""
    src, dst = C(dp=2, tp=2), C(tp=4)
    tr = trainer(src, dropout=0.3)
    with VirtualCluster(src.mesh()) as cluster:
        losses = train(tr, cluster, 2)
        tr.save(cluster, tmp_path / "c")
    other = trainer(dst, dropout=0.3)
    with VirtualCluster(dst.mesh()) as cluster:
        other.load(cluster, tmp_path / "c")
        losses += train(other, cluster, 2)
        got = other.state_dict(cluster)
    want_losses, want = nn.reference_train(gpt(dropout=0.3), [data(k) for k in range(4)], nn.cross_entropy,
                                           nn.AdamW(LR), 4)
    np.testing.assert_allclose(losses, want_losses, rtol=0, atol=1e-9)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-9, err_msg=name)


# name: (saved under, loaded into, its cuts, bit for bit?).  Moving pipeline cuts changes no sum; at
# dp=2 zero=1's reduce_scatter and zero=0's all_reduce both compute a + b, which commutes exactly.
RESHARD = {
    "pp2->pp1": (C(pp=2, microbatches=2), C(microbatches=2), None, True),
    "pp2-cuts->pp2-other-cuts": (C(pp=2, microbatches=2), C(pp=2, microbatches=2), ["blocks.3"], True),
    "zero1->zero0": (C(dp=2, zero=1), C(dp=2), None, True),
    "zero3-dp2->dp4": (C(dp=2, zero=3), C(dp=4, zero=3), None, False),
    "tp2-sp->tp2-zero1-dp2": (C(tp=2, sequence_parallel=True), C(dp=2, tp=2, zero=1), None, False),
    "cp2->pp2-tp2": (C(cp=2), C(pp=2, tp=2, microbatches=2, schedule="gpipe"), None, False),
    "interleaved-pp2x2->pp1": (C(pp=2, microbatches=2, schedule="interleaved_1f1b", virtual=2),
                               C(microbatches=2), None, True),
    "tp4->cp2-tp2-sp": (C(tp=4), C(cp=2, tp=2, sequence_parallel=True), None, False),
}


@pytest.mark.parametrize("name", list(RESHARD))
def test_a_checkpoint_loads_into_another_layout_and_trains_on(tmp_path, name):
    src, dst, cuts, exact = RESHARD[name]
    tr = trainer(src)
    with VirtualCluster(src.mesh()) as cluster:
        losses = train(tr, cluster, 2)
        tr.save(cluster, tmp_path / "c")
    other = trainer(dst, cuts)
    with VirtualCluster(dst.mesh()) as cluster:
        other.load(cluster, tmp_path / "c")
        _equal(_model_keyed(other._fetch(cluster), other), _model_keyed(tr.committed(), tr))
        losses += train(other, cluster, 1)
        got = other.state_dict(cluster)
    want_losses, want = never_stopped(src, 3)
    if exact:
        assert losses == want_losses
        _equal(got, want)
    else:
        np.testing.assert_allclose(losses, want_losses, rtol=1e-13, atol=0)
        _close(got, want)


def _kill_and_resume(cfg: ParallelConfig, rank: int, at_op: int, fault: str = "kill", **kw) -> tuple:
    """3 steps, a fault in the 4th, then a new cluster: the trainer resumes and runs to step 5."""
    tr = trainer(cfg)
    with VirtualCluster(cfg.mesh(), **kw) as cluster:
        losses = train(tr, cluster, 3)
        cluster.inject(rank, at_op, fault)
        with pytest.raises(DeviceDied if fault in ("kill", "exit") else Exception):
            cluster.execute(tr, *data(tr.step))
        if fault in ("kill", "exit"):
            with pytest.raises(ClusterClosedError):  # the devices are gone: the state lives on in the driver
                tr.state_dict(cluster)
    assert tr.step == 3
    with VirtualCluster(cfg.mesh()) as cluster:
        losses += train(tr, cluster, 2)
        got = tr.state_dict(cluster)
    return tr, losses, got


@pytest.mark.parametrize("cfg", [C(dp=2, tp=2, zero=1), C(pp=2, microbatches=2)],
                         ids=["dp2-tp2-zero1", "pp2"])
def test_a_device_killed_mid_run_resumes_on_a_new_cluster_with_the_fault_free_weights(caplog, cfg):
    with caplog.at_level(logging.WARNING, logger="virtualpar.checkpoint"):
        tr, losses, got = _kill_and_resume(cfg, rank=cfg.size - 1, at_op=3)
    want_losses, want = never_stopped(cfg, 5)
    assert losses == want_losses
    _equal(got, want)
    lines = [r.getMessage() for r in caplog.records if r.name == "virtualpar.checkpoint"]
    assert lines == [f"resuming {tr.key} from step 3 (the cluster that held it closed)"]


@pytest.mark.parametrize("fault", ["exit", pytest.param("hang", marks=pytest.mark.slow)])  # a hang waits 3 s
def test_zero3_resumes_after_an_exit_or_a_hang(fault):
    cfg = C(dp=2, tp=2, zero=3, sequence_parallel=True)
    _, losses, got = _kill_and_resume(cfg, rank=1, at_op=5, fault=fault, timeout=3.0, run_timeout=30.0)
    want_losses, want = never_stopped(cfg, 5)
    assert losses == want_losses
    _equal(got, want)


def test_without_slot_files_the_copy_comes_with_the_replies(monkeypatch):
    def no_room(devices):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(recovery, "Spill", no_room)
    cfg = C(dp=2, zero=3)
    _, losses, got = _kill_and_resume(cfg, rank=0, at_op=2)
    want_losses, want = never_stopped(cfg, 5)
    assert losses == want_losses
    _equal(got, want)


def test_without_a_driver_copy_the_newest_checkpoint_is_resumed_or_it_raises(tmp_path, caplog):
    cfg = C(dp=2)
    tr = trainer(cfg).configure_recovery(driver_copy=False, checkpoint_every=2, checkpoint_dir=tmp_path / "c")
    with VirtualCluster(cfg.mesh()) as cluster:
        train(tr, cluster, 3)
        assert tr.committed() is None and Checkpoint(tmp_path / "c").step == 2
        cluster.inject(1, 1, "kill")
        with pytest.raises(DeviceDied):
            cluster.execute(tr, *data(tr.step))
    assert tr.step == 2  # where training goes on, known at once
    with caplog.at_level(logging.WARNING, logger="virtualpar.checkpoint"), \
            VirtualCluster(cfg.mesh()) as cluster:
        train(tr, cluster, 3)
        _equal(tr.state_dict(cluster), never_stopped(cfg, 5)[1])
    assert f"resuming {tr.key} from step 2 (the cluster that held it closed; checkpoint {tmp_path / 'c'}, " \
           "1 committed steps are redone)" in caplog.text
    lost = trainer(cfg).configure_recovery(driver_copy=False)
    with VirtualCluster(cfg.mesh()) as cluster:
        train(lost, cluster, 1)
    with VirtualCluster(cfg.mesh()) as cluster, pytest.raises(ResumeError, match="committed 1 steps and the "
                                                              "cluster that held it closed, but no copy"):
        cluster.execute(lost, *data(1))


def test_save_after_the_cluster_closed_and_a_copy_of_the_trainer(tmp_path, caplog):
    cfg = C(tp=2, pp=2, microbatches=2)
    tr = trainer(cfg)
    with VirtualCluster(cfg.mesh()) as cluster:
        train(tr, cluster, 2)
        twin = copy.deepcopy(tr)
        train(tr, cluster, 1)  # rewrites the slot files the copy was made from
    assert twin.step == 2 and twin.key != tr.key
    tr.save(None, tmp_path / "c")  # the cluster is gone: the driver's copy is saved
    want = never_stopped(cfg, 3)[1]
    _equal(tr.committed_state_dict(), want)
    other = trainer(C(dp=2))
    assert other.load(None, tmp_path / "c") == 3  # placed on the next cluster it runs on
    with VirtualCluster(C(dp=2).mesh()) as cluster:
        train(other, cluster, 1)
    with VirtualCluster(cfg.mesh()) as cluster:
        train(twin, cluster, 1)
        _equal(twin.state_dict(cluster), want)
    assert f"resuming {other.key} from step 3 (loaded from {tmp_path / 'c'})" in caplog.text


def test_tied_embeddings_round_trip(tmp_path):
    cfg = C(tp=2)
    tr = trainer(cfg, tie_embeddings=True)
    with VirtualCluster(cfg.mesh()) as cluster:
        train(tr, cluster, 1)
        want = tr.state_dict(cluster)
        tr.save(cluster, tmp_path / "c")
    assert "model/head.embedding.weight" not in Checkpoint(tmp_path / "c").keys()
    _equal(tr.committed_state_dict(), want)
    other = trainer(C(dp=2), tie_embeddings=True)
    other.load(None, tmp_path / "c")
    _equal(other.committed_state_dict(), want)


def test_a_checkpoint_of_another_model_or_optimizer_is_refused(tmp_path):
    cfg = C(dp=2)
    tr = trainer(cfg)
    with VirtualCluster(cfg.mesh()) as cluster:
        train(tr, cluster, 1)
        tr.save(cluster, tmp_path / "c")
        with pytest.raises(UsageError, match="mesh"):  # load checks the cluster against the configuration
            trainer(C(tp=4)).load(cluster, tmp_path / "c")
    wider = ParallelTrainer(nn.GPT(32, 16, 2, 4, 8, seed=3, dtype=np.float64), cfg, optimizer=nn.AdamW(LR))
    with pytest.raises(CheckpointError, match="does not fit this model"):
        wider.load(None, tmp_path / "c")
    sgd = ParallelTrainer(gpt(), cfg, optimizer=nn.SGD(LR))
    with pytest.raises(CheckpointError, match="'AdamW' optimizer state"):
        sgd.load(None, tmp_path / "c")
    with pytest.raises(UsageError, match="has not run on this cluster"), \
            VirtualCluster(cfg.mesh()) as cluster:
        trainer(cfg).save(cluster, tmp_path / "d")


PLANS = {"kill-interrupt": {1: ("kill", 3, 2), 3: ("interrupt", 2, 5)},
         "kill-hang-interrupt": {1: ("kill", 3, 2), 2: ("hang", 0, 7), 4: ("interrupt", 2, 5)}}


@pytest.mark.parametrize("plan",
                         ["kill-interrupt", pytest.param("kill-hang-interrupt", marks=pytest.mark.slow)])
def test_the_composed_trainer_survives_kills_hangs_and_interrupts_in_the_chaos_harness(caplog, plan):
    """``bench_chaos.py --model gpt`` at a small size: dp=2 x pp=2 with ZeRO-1 on 4 devices (8 sends,
    receives and collectives per device and step), faults at some of them; each costs only its
    step, training ends with the fault-free weights bit for bit, and nothing is left behind."""
    import importlib.util
    import os
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "benchmarks", "bench_chaos.py")
    spec = importlib.util.spec_from_file_location("bench_chaos", path)
    bench_chaos = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_chaos)
    plan = PLANS[plan]
    with caplog.at_level(logging.WARNING, logger="virtualpar.checkpoint"):
        r = bench_chaos.chaos(steps=5, timeout=3.0, plan=plan, model="gpt")  # 3 s: no false hang under load
    assert r["unplanned"] == [], r["unplanned"]
    n = len(plan)
    assert (r["injected"], r["fired"], r["survived"]) == (n, n, n)
    assert (r["attempts_lost"], r["rolled_back"], r["clusters"]) == (n, 0, n + 1)
    assert r["bit_equal"]
    assert r["left"] == {"processes": [], "shm": [], "pymp": []}
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "virtualpar.checkpoint"]
    assert [line.split(" from ")[1] for line in lines] == [f"step {s} (the cluster that held it closed)"
                                                           for s in sorted(plan)]
