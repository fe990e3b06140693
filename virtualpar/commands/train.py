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
import json
import sys
import time
from typing import Any

import numpy as np

from ..trace.fmt import WIDTH, count, nbytes, number, seconds, table
from ._args import (hardware_choices, natural_int, output_file, parse_mesh, positive_float, positive_int,
                    positive_number, usage_error)
from ._output import table_width
from ._progress import bar

__all__ = ["register", "synthetic_batch", "weights_l2", "PERIOD"]

PERIOD = 16  # tokens of the repeating pattern (at most the vocabulary)


def synthetic_batch(step: int, batch: int, seq: int, vocab: int,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, targets) of training step ``step``: each row counts up from its own offset modulo
    ``min(PERIOD, vocab)``; targets are the tokens shifted by one.  The same on every rank."""
    period = min(PERIOD, vocab)
    rng = np.random.default_rng([seed, step])
    start = rng.integers(0, period, (batch, 1))
    ids = (start + np.arange(seq + 1)[None, :]) % period
    return ids[:, :-1].astype(np.int64), ids[:, 1:].astype(np.int64)


def weights_l2(weights: dict[str, np.ndarray]) -> float:
    """The final weights' L2 norm, all tensors together (in float64): one number to compare two runs
    by (the emulator's and mpiexec's), printed and in ``--json``; ``--weights`` writes them all."""
    return float(np.sqrt(sum(float(np.sum(np.square(w, dtype=np.float64))) for w in weights.values())))


def _config(args: argparse.Namespace) -> Any:
    """The ParallelConfig the flags describe (a UsageError names what does not fit)."""
    from ..errors import UsageError
    from ..parallel import ParallelConfig

    shape = dict(args.mesh.shape) if args.mesh is not None else {"dp": 2, "pp": 2, "tp": 2}
    unknown = sorted(set(shape) - {"dp", "pp", "cp", "tp"})
    if unknown:
        raise UsageError(f"--mesh {args.mesh}: unknown axes {unknown}; train's axes are dp, pp, cp, tp")
    if args.cp is not None:
        if shape.get("cp", args.cp) != args.cp:
            raise UsageError(f"--cp {args.cp} and --mesh's cp={shape['cp']} disagree; give one")
        shape["cp"] = args.cp
    return ParallelConfig(dp=shape.get("dp", 1), tp=shape.get("tp", 1), pp=shape.get("pp", 1),
                          cp=shape.get("cp", 1), microbatches=args.microbatches, schedule=args.schedule,
                          zero=args.zero, sequence_parallel=args.sequence_parallel, recompute=args.recompute)


def _setup(args: argparse.Namespace) -> dict[str, Any]:
    """Everything both drivers need, checked before any device starts."""
    from .. import nn
    from ..errors import UsageError
    from ..parallel import ParallelTrainer
    from ..runtime.hardware_choice import resolve_hardware
    from ._args import default_hardware

    cfg = _config(args)
    model = nn.GPT.preset(args.model, dtype=np.dtype(args.dtype), seed=args.seed)
    seq = args.seq or model.seq_len
    group = cfg.dp * cfg.microbatches
    batch = args.batch or group * -(-8 // group)  # at least 8 rows, a multiple of dp × microbatches
    cfg.check_batch((batch, seq), model.seq_len)
    if args.lr <= 0:
        raise UsageError(f"--lr must be > 0, got {args.lr}")
    trainer = ParallelTrainer(model, cfg, optimizer=nn.AdamW(args.lr))
    hardware = default_hardware(args.hardware, cfg.size)
    _, _, spec = resolve_hardware(hardware, cfg.mesh())
    return {"cfg": cfg, "model": model, "trainer": trainer, "batch": batch, "seq": seq, "hardware": hardware,
            "peak": spec.peak(args.dtype), "capacity": spec.memory_capacity}


class Report:
    """The figures of a run, printed as they come (or kept for ``--json``)."""

    def __init__(self, args: argparse.Namespace, setup: dict[str, Any], first_step: int = 0) -> None:
        self.args, self.s = args, setup
        self.steps: list[dict[str, Any]] = []
        self.first = first_step
        cfg = setup["cfg"]
        if not args.json:
            print(f"training GPT {args.model!r} ({number(setup['model'].num_parameters())} parameters, "
                  f"{args.dtype}) on {cfg.size} devices {cfg.mesh()}: {cfg.microbatches} microbatches, "
                  f"{cfg.schedule}, zero={cfg.zero}, sp={'on' if cfg.sequence_parallel else 'off'}, "
                  f"recompute={'on' if cfg.recompute else 'off'}; batch {setup['batch']} × {setup['seq']} "
                  f"tokens; modelled on {setup['hardware'] or 'NVLink-class links'}")
            print(f"{'step':>5}  {'loss':>8}  {'tokens/s (wall)':>16}  {'modelled step':>14}  {'MFU':>7}")

    def step(self, k: int, loss: float, wall: float, modelled: float) -> None:
        from ..parallel.costs import mfu

        s = self.s
        tokens = s["batch"] * s["seq"]
        util = 0.0
        if modelled > 0:
            util = mfu(s["model"], s["batch"], s["seq"], modelled, s["cfg"].size, s["peak"])
        row = {"step": k, "loss": loss, "tokens_per_second": tokens / wall if wall > 0 else 0.0,
               "wall_seconds": wall, "modelled_step_seconds": modelled, "mfu": util}
        self.steps.append(row)
        if not self.args.json:
            print(f"{k:>5}  {loss:>8.4f}  {count(row['tokens_per_second']):>16}  {seconds(modelled):>14}  "
                  f"{100 * util:>6.2f}%", flush=True)

    def finish(self, memory: list[dict[str, Any]], extra: dict[str, Any]) -> None:
        from ..parallel.plan import device_memory

        s, cfg = self.s, self.s["cfg"]
        itemsize = np.dtype(self.args.dtype).itemsize
        forms = device_memory(s["model"], cfg, s["batch"], s["seq"], itemsize)
        mesh = cfg.mesh()
        rows = []
        for r, got in enumerate(memory):
            want = forms[mesh.index(r).pp]
            at = mesh.index(r)
            rows.append({"device": r, "coords": {a: getattr(at, a) for a in ("dp", "pp", "cp", "tp")},
                         "measured": {k: got[k] for k in ("params", "grads", "optimizer", "activations")},
                         "closed_form": want})
        if self.args.json:
            out = {"command": "train", "model": self.args.model, "dtype": self.args.dtype,
                   "config": {k: getattr(cfg, k) for k in ("dp", "tp", "pp", "cp", "microbatches", "schedule",
                                                            "zero", "sequence_parallel", "recompute")},
                   "batch": s["batch"], "seq": s["seq"], "hardware": s["hardware"], "steps": self.steps,
                   "memory": rows, **extra}
            print(json.dumps(out, indent=1, default=str))
            return
        if self.steps:
            first, last = self.steps[0]["loss"], self.steps[-1]["loss"]
            print(f"loss {first:.4f} -> {last:.4f} over {len(self.steps)} steps")
        kinds = ("params", "grads", "optimizer")
        body = [[r["device"], ",".join(str(v) for v in r["coords"].values()),
                 *(nbytes(r["measured"][k]) for k in kinds), nbytes(sum(r["measured"][k] for k in kinds)),
                 nbytes(sum(r["closed_form"][k] for k in kinds)), nbytes(r["measured"]["activations"]),
                 nbytes(r["closed_form"]["activations"])] for r in rows]
        print(f"\nmemory per device: measured on the device, against the closed forms (ZeRO: (P + G + K)·Ψ "
              f"by stage; Megatron: s·b·h·(34 + 5as/h) per layer at {itemsize}-byte activations, "
              f"divided as "
              f"TP/SP divide it, × layers × the schedule's microbatches in flight); capacity "
              f"{nbytes(s['capacity'])} per device")
        print(table(["device", "dp,pp,cp,tp", "params", "grads", "optimizer", "P+G+K", "ZeRO form",
                     "activations", "Megatron form"], body, width=self.args.width))
        for key, value in extra.items():
            print(f"{key}: {value}")


def _train_emulated(args: argparse.Namespace, s: dict[str, Any]) -> int:
    from ..errors import UsageError
    from ._progress import start_cluster

    trainer, cfg = s["trainer"], s["cfg"]
    if (args.save or args.resume) and not hasattr(trainer, "load"):
        raise UsageError("--save and --resume need ParallelTrainer.save/load (the Recoverable "
                         "checkpoint API), "
                         "which this version of virtualpar.parallel does not have yet")
    with start_cluster(cfg.mesh(), hardware=s["hardware"], timeout=args.timeout) as cluster:
        first = 0
        if args.resume:
            trainer.load(cluster, args.resume)
            first = int(getattr(trainer, "step", 0))
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
        if args.save:
            trainer.save(cluster, args.save)
            extra["checkpoint"] = args.save
        if args.trace:
            extra["trace"] = cluster.trace().write_chrome(args.trace)
    report.finish(memory, extra)
    return 0


def _run(args: argparse.Namespace) -> int:
    from ..errors import UsageError
    from ._mpi_train import under_mpiexec

    try:
        setup = _setup(args)
        if under_mpiexec():
            from ._mpi_train import train_mpi

            return train_mpi(args, setup)
        return _train_emulated(args, setup)
    except UsageError as exc:
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
