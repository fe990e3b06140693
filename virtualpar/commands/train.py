"""``virtualpar train``: train a GPT preset with DP × TP × PP × CP, ZeRO, SP and recompute, and show
what Megatron-LM's and nanotron's logs show: per-step loss, tokens per second (wall), the modelled
step time and MFU, and each device's memory against the closed forms.

    virtualpar train --model tiny --mesh dp=2,pp=2,tp=2 --microbatches 4 --schedule 1f1b --zero 1

On this machine the devices are emulated (:class:`~virtualpar.VirtualCluster`); started under
``mpiexec -n N`` the same command runs on N MPI processes, every rank driving its own part of the
step (:mod:`virtualpar.parallel.spmd`) and rank 0 printing — with the emulator's weights.

The data is synthetic and learnable: row i of step k counts up from an offset, modulo a period
(``tokens[i, j] = (o_ik + j) mod P``), and the target is the next token, so the loss falls towards 0.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ..trace.fmt import WIDTH
from ._args import (hardware_choices, natural_int, output_file, parse_mesh, positive_float, positive_int,
                    positive_number, probability, usage_error)
from ._output import table_width
from ._progress import bar
from ._training import PERIOD, Report, setup, synthetic_batch, weights_l2

__all__ = ["register", "synthetic_batch", "weights_l2", "PERIOD"]


def _train_emulated(args: argparse.Namespace, s: dict[str, Any]) -> int:
    """Train on emulated devices; ``--resume DIR`` first loads the checkpoint (saved under any mesh of
    the same model) and goes on from its step — the data position too, so that 4 steps, a save and
    4 resumed steps are the 8 steps of one run — and ``--save DIR`` checkpoints the last step."""
    from ._progress import start_cluster

    trainer, cfg = s["trainer"], s["cfg"]
    if args.resume:
        trainer.load(None, args.resume)  # placed on the cluster with the first step
    first = trainer.step
    with start_cluster(cfg.mesh(), hardware=s["hardware"], timeout=args.timeout) as cluster:
        report = Report(args, s, first)
        with bar(args.steps, "training", "step") as advance:
            for k in range(first, first + args.steps):
                tokens, targets = synthetic_batch(k, s["batch"], s["seq"], s["model"].vocab, args.seed)
                t0 = time.perf_counter()
                loss = cluster.execute(trainer, tokens, targets)
                report.step(k, loss, time.perf_counter() - t0, trainer.last_step_time)
                advance()
        memory = trainer.memory(cluster)
        extra: dict[str, Any] = {}
        weights = trainer.state_dict(cluster)
        extra["weights_l2"] = weights_l2(weights)
        if args.weights:
            np.savez(args.weights, **weights)
            extra["weights"] = args.weights
        if args.resume:
            extra["resumed_from"] = f"{args.resume} (step {first})"
        if args.save:
            extra["checkpoint"] = str(trainer.save(cluster, args.save))
        if args.trace:
            extra["trace"] = cluster.trace().write_chrome(args.trace)
    report.finish(memory, extra)
    return 0


def _run(args: argparse.Namespace) -> int:
    from ..checkpoint import CheckpointError, ResumeError
    from ..errors import UsageError
    from ._mpi_train import under_mpiexec

    try:
        prepared = setup(args)
        if under_mpiexec():
            from ._mpi_train import train_mpi

            return train_mpi(args, prepared)
        return _train_emulated(args, prepared)
    except (UsageError, CheckpointError, ResumeError) as exc:
        return usage_error("train", str(exc))


def register(sub: Any) -> None:
    from ..pipeline.schedules import SCHEDULES

    p = sub.add_parser("train", help="train a GPT preset with DP × TP × PP × CP, ZeRO, SP and recompute",
                       description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--model", default="tiny", choices=("tiny", "small"),
                   help="GPT preset: tiny (vocab 256, d 64, 4 layers, 4 heads, seq 32) or small (vocab 2048, "
                        "d 256, 8 layers, 8 heads, seq 128) (default tiny)")
    p.add_argument("--mesh", type=parse_mesh, default=None,
                   help="degrees of the axes dp, pp, cp, tp, e.g. dp=2,pp=2,tp=2 (default; devices = "
                        "product)")
    p.add_argument("--cp", type=positive_int, default=None, metavar="N",
                   help="context-parallel degree: ring attention over N sequence chunks (default 1, or "
                        "the mesh's)")
    p.add_argument("--microbatches", type=positive_int, default=4, metavar="M",
                   help="microbatches per step and replica (default 4)")
    p.add_argument("--schedule", default="1f1b", choices=tuple(SCHEDULES),
                   help="pipeline schedule (default 1f1b)")
    p.add_argument("--zero", type=int, default=1, choices=(0, 1, 3),
                   help="ZeRO stage: 0 all-reduce, 1 sharded optimizer state, 3 sharded parameters "
                        "(default 1)")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron's sequence parallelism: norms and dropout sharded over tp along the "
                        "sequence")
    p.add_argument("--recompute", action="store_true", help="recompute each block's forward in the backward")
    p.add_argument("--dropout", type=probability, default=0.0, metavar="P",
                   help="dropout rate of each block's attention probabilities and outputs (default 0); the "
                        "masks depend on the step and position, not on the mesh")
    p.add_argument("--steps", type=positive_int, default=20, metavar="N", help="training steps (default 20)")
    p.add_argument("--batch", type=positive_int, default=None, metavar="ROWS",
                   help="sequences per step, a multiple of dp × microbatches (default: the least >= 8)")
    p.add_argument("--seq", type=positive_int, default=None, metavar="TOKENS",
                   help="tokens per sequence (default the model's seq_len)")
    p.add_argument("--lr", type=positive_number, default=3e-3, help="AdamW learning rate (default 0.003)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                   help="parameters and activations (default float32; float64 to compare runs to 1e-12)")
    p.add_argument("--seed", type=natural_int, default=0,
                   help="seed of the model's weights and of the data, an int >= 0 (default 0)")
    p.add_argument("--hardware", default=None, choices=hardware_choices(),
                   help="modelled hardware for the step time and MFU (default h100-node up to 8 devices, "
                        "h100-cluster for multiples of 8)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the tables")
    p.add_argument("--trace", metavar="FILE.json", type=output_file, default=None,
                   help="write every device's events as a Chrome trace (modelled clock)")
    p.add_argument("--weights", metavar="FILE.npz", type=output_file, default=None,
                   help="write the final weights, keyed like model.state_dict()")
    p.add_argument("--save", metavar="DIR", default=None,
                   help="write a checkpoint of the run to DIR at the end")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue the run checkpointed in DIR (its step count and data position)")
    p.add_argument("--timeout", type=positive_float, default=120.0, metavar="S",
                   help="seconds any one device op may wait before a named error (default 120)")
    p.add_argument("--width", type=table_width, default=WIDTH, metavar="N",
                   help=f"columns of the tables (default {WIDTH})")
    p.set_defaults(func=_run)
