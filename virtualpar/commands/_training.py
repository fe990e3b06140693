"""What ``virtualpar train`` does the same way on the emulator and under ``mpiexec``: the flags' configuration
and setup, the synthetic data, the weights' L2 norm and the report (per-step figures, the memory table).

Both drivers import it (:mod:`.train` for the emulated run, :mod:`._mpi_train` for mpiexec's), so
neither imports the other.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from ..trace.fmt import count, nbytes, number, seconds, table

__all__ = ["PERIOD", "synthetic_batch", "weights_l2", "config", "setup", "Report"]

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


def config(args: argparse.Namespace) -> Any:
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


def setup(args: argparse.Namespace) -> dict[str, Any]:
    """Everything both drivers need, checked before any device starts."""
    from .. import nn
    from ..parallel import ParallelTrainer
    from ..runtime.hardware_choice import resolve_hardware
    from ._args import default_hardware

    cfg = config(args)
    model = nn.GPT.preset(args.model, dtype=np.dtype(args.dtype), seed=args.seed,
                          dropout=getattr(args, "dropout", 0.0))
    seq = args.seq or model.seq_len
    group = cfg.dp * cfg.microbatches
    batch = args.batch or group * -(-8 // group)  # at least 8 rows, a multiple of dp × microbatches
    cfg.check_batch((batch, seq), model.seq_len)
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
        model_dropout = s["model"].dropout
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
                   "dropout": model_dropout,
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
              f"by stage; Megatron: s·b·h·(34 + 5as/h) per layer at 2-byte activations and 1-byte "
              f"masks, here {itemsize}-byte ones{'' if model_dropout else ' and no dropout'}, divided as "
              f"TP/SP divide it, × layers, + the output end e·s·b·(2h + v/t + 1) on the head's stage, × the "
              f"schedule's microbatches in flight); capacity "
              f"{nbytes(s['capacity'])} per device")
        print(table(["device", "dp,pp,cp,tp", "params", "grads", "optimizer", "P+G+K", "ZeRO form",
                     "activations", "Megatron form"], body, width=self.args.width))
        for key, value in extra.items():
            print(f"{key}: {value}")
