"""The unified scheme's part of ``virtualpar tour``: one table, one diagram, checked numbers."""

from __future__ import annotations

from typing import TextIO

from .render import to_text
from .simulate import simulate
from .work import STRATEGIES, GPipe

__all__ = ["tour_section"]


def tour_section(out: TextIO, hardware: str | None) -> bool:
    W, S, B = 4, 4, 8
    out.write(f"Every strategy is two functions of a unit of work (who computes it, who stores its weights).\n"
              f"{W} workers, {S} stages, {B} batches, forward 1, backward 2:\n\n")
    out.write(f"{'strategy':<11}{'latency':>8}{'throughput':>11}{'peak act.':>10}{'act. tx':>8}{'weight tx':>10}\n")
    runs = {}
    for name in ("ddp", "fsdp", "gpipe", "looped", "fs_looped", "cuckoo"):
        run = runs[name] = simulate(W, S, B, STRATEGIES[name](W, S, B, 2))
        out.write(f"{name:<11}{run.latency:>8g}{run.throughput:>11.3f}{run.peak_activations:>10}"
                  f"{run.activation_transmissions:>8}{run.weight_transmissions:>10}\n")
    capped = simulate(W, S, B, GPipe, max_activations=S)
    out.write(f"\nGPipe's mapping with at most {S} activations per worker: 1F1B emerges "
              f"(latency {capped.latency:g}, peak {capped.peak_activations} instead of {runs['gpipe'].peak_activations}):\n")
    out.write(to_text(capped) + "\n")
    return runs["gpipe"].latency == 33 and capped.peak_activations == S and capped.latency == runs["gpipe"].latency
