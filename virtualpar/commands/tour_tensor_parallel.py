"""The tensor-parallel part of ``virtualpar tour``: every MatMul and FeedForward policy on a 2x2 mesh."""

from __future__ import annotations

from typing import TextIO

import numpy as np

from ..mesh import Mesh
from ..runtime import VirtualCluster
from ..tensor_parallel.explore import explore
from ..tensor_parallel.table import policy_rows
from ..trace.fmt import fit, nbytes, seconds
from .policies import format_rows

__all__ = ["tour_section"]

_CASES = ((False, (64, 32, 48), "MatMul C = A·B, m,k,n"), (True, (2, 16, 32, 64), "FeedForward, b,s,m,h"))


def tour_section(out: TextIO, hardware: str | None) -> bool:
    """Run every policy once (float64, small shapes), print the table, the explorer's top three.
    True when every output matched numpy and every byte and FLOP count matched its closed form."""
    mesh = Mesh({"x": 2, "y": 2})
    ok = True
    with VirtualCluster(mesh, hardware=hardware or "h100-node") as cluster:
        for ffn, shape, what in _CASES:
            rows = policy_rows(cluster, shape, ffn=ffn, dtype=np.float64)
            head = (f"{what} = {','.join(map(str, shape))}, float64, mesh {mesh}; /dev: the most any "
                    "device sent, computed or held; weights resident")
            out.write("\n".join(fit(head, 100)) + "\n")
            out.write(format_rows(rows) + "\n\n")
            ok &= all(r.correct and r.matches_closed_form for r in rows if not r.error)
        hw = cluster.hardware
    best = explore(4096, 2048, 4096, Mesh({"x": 2, "y": 4}), hw, "float32", replicate_output=True)[:3]
    out.write(f"explorer, 4096x2048 @ 2048x4096 float32 on x=2,y=4 ({hw.name}), C replicated: "
              "fastest of 81\n")
    for c in best:
        colls = " ".join(map(str, c.cost.forward.collectives)) or "-"
        out.write(f"  {c.layer.name:<28} {colls:<36} modelled {seconds(c.modelled_forward_s)}, "
                  f"peak {nbytes(c.peak_bytes)}\n")
    out.write("every policy matched numpy and its closed-form bytes and FLOPs\n" if ok
              else "SOME POLICY FAILED its checks\n")
    return bool(ok)
