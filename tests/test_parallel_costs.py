"""Bytes, memory and time of an executed ParallelTrainer step against the papers' closed forms.

Bytes are counted by the runtime per device pair (``cluster.stats()``); memory is measured on the
devices (``trainer.memory``); time is the modelled clock.  The closed forms are in
:mod:`virtualpar.parallel.costs`.
"""

from __future__ import annotations

import numpy as np
import pytest

from virtualpar import VirtualCluster, nn
from virtualpar.parallel import ParallelConfig, ParallelTrainer
from virtualpar.parallel.costs import (bubble_fraction, dp_bytes, head_activation_bytes,
                                       megatron_activation_bytes, mfu, model_flops, tp_bytes, zero_memory)
from virtualpar.sim import Hardware
from virtualpar.sim.hardware import DeviceSpec

ITEM = 8  # float64
FREE_COMM = Hardware.uniform(latency=0.0, bandwidth=float("inf"),
                             device=DeviceSpec("giga", {"float32": 1e9}, float("inf"), float("inf")))


def gpt(layers: int = 2, dropout: float = 0.0) -> nn.GPT:
    return nn.GPT(32, 16, layers, 4, 8, seed=1, dtype=np.float64, dropout=dropout)


def batch(rows: int = 8):
    rng = np.random.default_rng(0)
    return rng.integers(0, 32, (rows, 8)), rng.integers(0, 32, (rows, 8))


def run(cfg: ParallelConfig, layers: int = 2, rows: int = 8, hardware=None, steps: int = 2,
        pairs: bool = False, dropout: float = 0.0):
    """Train ``steps`` steps; returns (trainer, bytes sent per device in the last step — or with
    ``pairs`` the matrix of bytes device s sent to device d —, ledger)."""
    tokens, targets = batch(rows)
    trainer = ParallelTrainer(gpt(layers, dropout), cfg, optimizer=nn.AdamW(1e-2))
    kw = {} if hardware is None else {"hardware": hardware}
    with VirtualCluster(cfg.mesh(), **kw) as cluster:
        for _ in range(steps - 1):
            cluster.execute(trainer, tokens, targets)
        cluster.reset_stats()
        cluster.execute(trainer, tokens, targets)
        stats = cluster.stats()
        sent = stats.bytes if pairs else [stats.sent(r) for r in range(cluster.size)]
        ledger = trainer.memory(cluster)
    return trainer, sent, ledger


def local_psi(trainer: ParallelTrainer) -> int:
    return sum(u.padded for us in trainer.units for u in us)


@pytest.mark.parametrize("kw", [dict(tp=2), dict(tp=4), dict(tp=2, sequence_parallel=True),
                                dict(tp=2, microbatches=2)])
def test_tensor_parallel_bytes_are_four_all_reduces_of_bsh_per_layer(kw):
    cfg = ParallelConfig(**kw)
    _, sent, _ = run(cfg)
    assert sent == [tp_bytes(gpt(), cfg, 8, 8, ITEM)] * cfg.size


@pytest.mark.parametrize("kw", [dict(dp=2), dict(dp=4), dict(dp=2, zero=1), dict(dp=4, zero=1),
                                dict(dp=2, zero=3),
                                dict(dp=2, zero=3, recompute=True, microbatches=2)])
def test_data_parallel_bytes_are_2_n_minus_1_over_n_psi(kw):
    cfg = ParallelConfig(**kw)
    trainer, sent, _ = run(cfg)
    want = dp_bytes(local_psi(trainer), cfg, ITEM)
    assert sent == [want] * cfg.size
    if cfg.zero in (0, 1):
        assert want == 2 * (cfg.dp - 1) / cfg.dp * gpt().num_parameters() * ITEM  # Ψ divides: no padding


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_zero_memory_by_stage(zero):
    cfg = ParallelConfig(dp=2, zero=zero)
    trainer, _, ledger = run(cfg)
    want = zero_memory(local_psi(trainer), 2, zero, ITEM, 2 * ITEM)  # Adam: m and v
    for dev in ledger:
        assert {k: dev[k] for k in want} == want
    if zero == 3:
        assert want["params"] == gpt().num_parameters() * ITEM / 2
    largest = max(u.padded for us in trainer.units for u in us) * ITEM
    assert [dev["gathered"] for dev in ledger] == [largest if zero == 3 else 0] * 2


@pytest.mark.parametrize("kw", [dict(microbatches=2), dict(pp=2, microbatches=4, schedule="1f1b"),
                                dict(tp=2, sequence_parallel=True, microbatches=2)])
def test_zero3_frees_the_gathered_parameters_between_forward_and_backward(kw):
    """FSDP: the peak parameter memory is Ψ/N_d stored + one unit gathered (the largest), and the
    activations kept for the backward are exactly zero=0's: no gathered parameter is kept with them,
    however many microbatches are in flight."""
    trainer, pairs, zero3 = run(ParallelConfig(dp=2, zero=3, **kw), layers=4, steps=1, pairs=True)
    _, _, plain = run(ParallelConfig(dp=2, zero=0, **kw), layers=4, steps=1)
    for rank, (dev, ref) in enumerate(zip(zero3, plain)):
        stages = [us for s, us in enumerate(trainer.units) if s in dev["stage_activations"]]
        psi = sum(u.padded for us in stages for u in us)
        assert dev["params"] == psi * ITEM / 2
        assert dev["gathered"] == max(u.padded for us in stages for u in us) * ITEM
        assert dev["activations"] == ref["activations"]
        assert dev["stage_activations"] == ref["stage_activations"]
    cfg = trainer.config
    mesh = cfg.mesh()
    for r in range(cfg.size):  # FSDP: 3·(N_d−1)/N_d of the device's Ψ per microbatch, to its dp peer
        peer = mesh.group_of(r, ("dp",))[1 - mesh.index(r).dp]
        want = 3 * (2 - 1) / 2 * ITEM * cfg.microbatches * psi_of(trainer, mesh.index(r).pp)
        assert pairs[r, peer] == want


def psi_of(trainer: ParallelTrainer, pp_rank: int) -> int:
    return sum(u.padded for s, us in enumerate(trainer.units) if s % trainer.config.pp == pp_rank for u in us)


def test_recompute_keeps_each_block_s_input_only():
    """zbv's 4 stages of one block each: the middle two hold blocks only; with full recomputation
    one microbatch's forward keeps 2·s·b·h 16-bit bytes per layer (here s·b·h·8), /tp with SP."""
    for kw in (dict(), dict(tp=2, sequence_parallel=True)):
        cfg = ParallelConfig(pp=2, microbatches=2, schedule="zbv", recompute=True, **kw)
        _, _, ledger = run(cfg, layers=4, steps=1)
        want = megatron_activation_bytes(8, 4, 16, 4, t=cfg.tp, sp=cfg.sequence_parallel, recompute=True,
                                         bytes_per=ITEM)
        for dev in ledger:
            if dev["stage_activations"].keys() == {1, 2}:
                assert dev["stage_activations"] == {1: want, 2: want}
        plain = run(ParallelConfig(pp=2, microbatches=2, schedule="zbv", **kw), layers=4, steps=1)[2]
        assert all(p["activations"] > 5 * r["activations"] for p, r in zip(plain, ledger))


def per_layer_activations(dropout: float = 0.0, **kw) -> int:
    """Bytes one microbatch's forward keeps per transformer layer: stage 0 of a 2-stage pipeline
    with two layers minus the same with one (the embeddings cancel)."""
    cfg = ParallelConfig(pp=2, schedule="gpipe", **kw)
    two, one = (run(cfg, layers=n, steps=1, dropout=dropout)[2][0]["stage_activations"][0] for n in (4, 2))
    return two - one


def test_sequence_parallelism_divides_every_activation_by_tp_as_megatron_s_form_does():
    """Korthikanti et al.: s·b·h·(34 + 5as/h) per layer, divided by t with SP; tensor parallelism
    alone leaves the norms' and the column-parallel inputs' part whole (10 + 24/t + 5as/(ht))."""
    one = per_layer_activations()
    tp = per_layer_activations(tp=2)
    sp = per_layer_activations(tp=2, sequence_parallel=True)
    assert sp * 2 == one
    assert sp < tp < one
    forms = [megatron_activation_bytes(8, 8, 16, 4, t=t, sp=flag)
             for t, flag in ((1, False), (2, False), (2, True))]
    assert forms[2] * 2 == forms[0] and forms[2] < forms[1] < forms[0]


TP_SP = [dict(), dict(tp=2), dict(tp=2, sequence_parallel=True), dict(tp=4),
         dict(tp=4, sequence_parallel=True)]


@pytest.mark.parametrize("kw", TP_SP)
def test_activations_per_layer_are_megatron_s_form_to_the_byte(kw):
    """Measured on the devices with dropout: Korthikanti et al.'s per-layer bytes with 8-byte values
    and 1-byte masks — sbh(16·8 + 2 + 17·as/h); with TP sbh(4·8 + 2 + (12·8 + 17·as/h)/t); with SP
    all of it /t.  By hand for s=8, b=8, h=16, a=4 (sbh = 1024, as²b = 2048): 130·1024 + 17·2048
    = 167936 bytes."""
    t, sp = kw.get("tp", 1), kw.get("sequence_parallel", False)
    want = megatron_activation_bytes(8, 8, 16, 4, t=t, sp=sp, bytes_per=ITEM)
    assert per_layer_activations(dropout=0.1, **kw) == want
    if kw == {}:
        assert want == 167936 == 130 * 1024 + 17 * 2048


@pytest.mark.parametrize("kw", TP_SP)
def test_without_dropout_there_are_no_masks_and_the_probabilities_are_the_softmax_s(kw):
    """sbh(32 + 4as/h) at 16 bits: 8-byte values, 16·1024 + 2·2048 = 20480 of them here."""
    t, sp = kw.get("tp", 1), kw.get("sequence_parallel", False)
    want = megatron_activation_bytes(8, 8, 16, 4, t=t, sp=sp, bytes_per=ITEM, dropout=False)
    assert per_layer_activations(**kw) == want
    if kw == {}:
        assert want == 163840 == ITEM * (16 * 1024 + 2 * 2048)


@pytest.mark.parametrize("kw", TP_SP)
def test_the_ends_keep_the_head_s_form_and_the_embedding_nothing(kw):
    """A 2-stage pipeline of one layer a stage: stage 0 keeps its layer and nothing for the
    embedding (ids only); stage 1 its layer and the output end, e·s·b·(2h/t_sp + v/t + 1).  By hand
    for s=8, b=8, h=16, v=32, 8-byte values, no tp: 8·64·(32 + 32 + 1) = 33280 bytes."""
    t, sp = kw.get("tp", 1), kw.get("sequence_parallel", False)
    layer = megatron_activation_bytes(8, 8, 16, 4, t=t, sp=sp, bytes_per=ITEM, dropout=False)
    _, _, ledger = run(ParallelConfig(pp=2, schedule="gpipe", **kw), steps=1)
    kept = {s: a for dev in ledger for s, a in dev["stage_activations"].items()}
    assert kept[0] == layer
    assert kept[1] - layer == head_activation_bytes(8, 8, 16, 32, t=t, sp=sp, bytes_per=ITEM)
    if kw == {}:
        assert kept[1] - layer == 33280 == ITEM * 64 * (32 + 32 + 1)


def test_the_form_is_the_paper_s_at_16_bits_and_the_masks_are_its_dropout_part():
    """34 + 5as/h and 10 + 24/t + 5as/(ht) at 2-byte values and 1-byte masks; the masks are
    2·sbh + as²b bytes (replicated over tp without SP, split with it)."""
    s, b, h, a = 8, 8, 16, 4
    sbh, scores = s * b * h, a * s * s * b
    assert megatron_activation_bytes(s, b, h, a) == sbh * (34 + 5 * a * s / h)
    assert megatron_activation_bytes(s, b, h, a, t=2) == sbh * (10 + 24 / 2 + 5 * a * s / (h * 2))
    assert megatron_activation_bytes(s, b, h, a, t=2, sp=True) == sbh * (34 + 5 * a * s / h) / 2
    assert megatron_activation_bytes(s, b, h, a, recompute=True) == 2 * sbh
    for t, sp in ((1, False), (2, False), (2, True), (4, True)):
        masks = (2 * sbh + scores) / t if sp else 2 * sbh + scores / t
        assert (megatron_activation_bytes(s, b, h, a, t=t, sp=sp)
                - megatron_activation_bytes(s, b, h, a, t=t, sp=sp, dropout=False)) == masks


@pytest.mark.parametrize("schedule, held", [("gpipe", (4, 4)), ("1f1b", (2, 1))])
def test_peak_activations_follow_the_schedule_s_microbatches_in_flight(schedule, held):
    """GPipe keeps every microbatch's activations (M); 1F1B at most pp − rank of them."""
    cfg = ParallelConfig(pp=2, microbatches=4, schedule=schedule)
    _, _, ledger = run(cfg, steps=1)
    for rank, dev in enumerate(ledger):
        (stage, per_mb), = dev["stage_activations"].items()
        assert dev["activations"] == held[rank] * per_mb


@pytest.mark.parametrize("kw", [dict(), dict(dp=2), dict(tp=2), dict(cp=2), dict(dp=2, tp=2, zero=1)])
def test_mfu_is_one_when_communication_is_free_and_nothing_idles(kw):
    """On a device of 1 GFLOP/s with free links, a step without a pipeline costs exactly its model
    FLOPs over the devices (3 × flops_per_token per token, from the nn layers)."""
    cfg = ParallelConfig(**kw)
    trainer, _, _ = run(cfg, hardware=FREE_COMM)
    want = model_flops(gpt(), 8, 8) / cfg.size / 1e9
    assert trainer.last_step_time == pytest.approx(want, rel=1e-9)
    assert mfu(gpt(), 8, 8, trainer.last_step_time, cfg.size, 1e9) == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("kw", [dict(), dict(tp=2, sequence_parallel=True), dict(dp=2, zero=3)])
def test_recompute_costs_one_more_forward_of_every_block(kw):
    """Full recomputation runs each block's forward again in the backward: on free links the step
    takes (3·F + F_blocks) / peak, F_blocks = layers × the block's flops_per_token × tokens."""
    cfg = ParallelConfig(recompute=True, **kw)
    trainer, _, _ = run(cfg, hardware=FREE_COMM)
    blocks = sum(b.flops_per_token(8) for b in gpt().blocks) * 8 * 8
    want = (model_flops(gpt(), 8, 8) + blocks) / cfg.size / 1e9
    assert trainer.last_step_time == pytest.approx(want, rel=1e-9)


def test_pipeline_step_time_shows_the_bubble():
    """With free links a pipelined step's MFU is below 1 by at least the bubble of its equal-FLOP
    part: (p−1)/(m+p−1) of the blocks' time is idle."""
    cfg = ParallelConfig(pp=2, microbatches=4, schedule="1f1b")
    trainer, _, _ = run(cfg, layers=4, hardware=FREE_COMM)
    got = mfu(gpt(4), 8, 8, trainer.last_step_time, cfg.size, 1e9)
    assert 0 < got < 1 - bubble_fraction(2, 4) + 1e-9
    assert bubble_fraction(4, 8) == 3 / 11 and bubble_fraction(4, 8, virtual=2) == 3 / 19


def test_mfu_on_the_h100_preset_is_below_one_and_below_free_links():
    """On the h100-node preset the links cost time, so the same step's MFU is lower than with free
    links; every device's modelled clock moved by at most the step time."""
    from virtualpar.sim.hardware import HARDWARE

    h100 = HARDWARE["h100-node"]
    peak = h100.device.peak("float32")
    cfg = ParallelConfig(dp=2, tp=2)
    trainer, _, _ = run(cfg, hardware=h100)
    real = mfu(gpt(), 8, 8, trainer.last_step_time, cfg.size, peak)
    ideal = model_flops(gpt(), 8, 8) / cfg.size / peak
    assert 0 < real < 1 and trainer.last_step_time > ideal
    assert len(trainer.last_step_times) == 4
    assert max(trainer.last_step_times) <= trainer.last_step_time + 1e-15


def test_the_timeline_shows_every_action_of_the_schedule_per_pipeline_rank():
    cfg = ParallelConfig(pp=2, microbatches=2, schedule="1f1b", tp=2)
    trainer, _, _ = run(cfg, hardware=FREE_COMM, steps=1)
    grid = trainer.timeline()
    lines = grid.splitlines()
    for action in ("0F0", "0F1", "0B0", "0B1", "1F0", "1F1", "1B0", "1B1"):
        assert action in grid
    assert len(lines) >= 2


def test_ddp_buckets_overlap_the_rest_of_the_backward():
    """zero=0, dp=2, one bucket per unit, on a 1 GFLOP/s device with α = 1 µs, β = 100 MB/s links.

    Compute: forward F, backward 2F, the units' backward in the order final, blocks.1, blocks.0,
    embed.  Bucket k is ready at r_k = F + (its units' and the later ones' backward) / peak and
    its ring all-reduce of B_k bytes over 2 devices takes T_k = 2·(α + B_k/2/β), one after another on
    the communication stream: c_k = max(r_k, c_{k−1}) + T_k.  The step is max(3F, c_last); without
    overlap it would be 3F + Σ T_k."""
    alpha, beta = 1e-6, 1e8
    hw = Hardware.uniform(latency=alpha, bandwidth=beta,
                          device=DeviceSpec("giga", {"float32": 1e9}, float("inf"), float("inf")))
    cfg = ParallelConfig(dp=2, bucket_bytes=1)
    trainer, sent, _ = run(cfg, hardware=hw)
    rows, d, vocab, seq = 4, 16, 32, 8
    block = (24 * d * d + 4 * seq * d) * seq * rows  # one block's forward FLOPs on a replica's 4 rows
    head = 2 * d * vocab * seq * rows
    forward = (2 * block + head) / 1e9
    sizes = [u.padded for u in trainer.units[0]]  # embed, blocks.0, blocks.1, final
    assert [u.name for u in trainer.units[0]] == ["embed", "blocks.0", "blocks.1", "final"]
    ready, comm, t = forward, 0.0, []
    for flops, size in zip((head, block, block, 0), reversed(sizes)):
        ready += 2 * flops / 1e9
        comm = max(ready, comm) + 2 * (alpha + size * ITEM / 2 / beta)
        t.append(comm)
    want = max(3 * forward, comm)
    assert trainer.last_step_time == pytest.approx(want, rel=1e-12)
    serial = 3 * forward + sum(2 * (alpha + n * ITEM / 2 / beta) for n in sizes)
    assert want < serial and t[0] < 3 * forward  # the head's bucket is done before the backward is
    assert sent == [dp_bytes(local_psi(trainer), cfg, ITEM)] * 2  # the bytes are DP's closed form


def test_zero3_with_recompute_holds_one_gathered_unit_too():
    """A recomputed block gathers for its forward and again for its recomputation, keeping nothing
    gathered in between: the peak is still the largest unit."""
    trainer, _, ledger = run(ParallelConfig(dp=2, zero=3, recompute=True, microbatches=2), steps=1)
    largest = max(u.padded for us in trainer.units for u in us) * ITEM
    assert [dev["gathered"] for dev in ledger] == [largest] * 2
    assert largest == max(u.padded for u in trainer.units[0] if u.name.startswith("blocks.")) * ITEM
