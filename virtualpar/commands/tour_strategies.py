"""The unified scheme's part of ``virtualpar tour``: one table, one diagram, checked numbers."""

from __future__ import annotations

from typing import TextIO

from ..strategies.render import to_text
from ..strategies.simulate import simulate
from ..strategies.work import STRATEGIES, GPipe
from ..trace.fmt import WIDTH, number, table

__all__ = ["tour_section"]

_HEAD = ("strategy", "latency", "throughput", "peak act.", "act. tx", "weight tx")


def tour_section(out: TextIO, hardware: str | None) -> bool:
    W, S, B = 4, 4, 8
    out.write("Every strategy is two functions of a unit of work (who computes it, who stores its weights).\n"
              f"{W} workers, {S} stages, {B} batches, forward 1, backward 2:\n\n")
    runs = {}
    rows = []
    for name in ("ddp", "fsdp", "gpipe", "looped", "fs_looped", "cuckoo"):
        run = runs[name] = simulate(W, S, B, STRATEGIES[name](W, S, B, 2))
        rows.append((name, number(run.latency), number(run.throughput, 3), run.peak_activations,
                     run.activation_transmissions, run.weight_transmissions))
    out.write(table(_HEAD, rows) + "\n")
    capped = simulate(W, S, B, GPipe, max_activations=S)
    out.write(f"\nGPipe's mapping with at most {S} activations per worker: 1F1B emerges\n"
              f"(latency {number(capped.latency)}, peak {capped.peak_activations} instead of "
              f"{runs['gpipe'].peak_activations}):\n")
    out.write(to_text(capped, WIDTH) + "\n")
    return (runs["gpipe"].latency == 33 and capped.peak_activations == S
            and capped.latency == runs["gpipe"].latency)
