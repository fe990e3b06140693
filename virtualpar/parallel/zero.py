"""Gradient reduction and the optimizer step over dp (and cp, and tp under SP), by ZeRO stage.

Each stage's gradients arrive as one flat vector per unit (:mod:`.layout`), summed over the
step's microbatches by the pipeline executor (each seeded with 1/M: the microbatches' mean).

1. Sequence parallelism: the replicated parameters' entries are partial sums over tp → all_reduce
   them over tp.
2. Context parallelism: every device's gradient is its own tokens' part of the loss → sum over cp.
3. Data parallelism (Rajbhandari et al. 2020, Ψ parameters, N_d = dp replicas, ring costs):

   - ``zero=0``: all_reduce (sum, then ÷ dp) in buckets of ``bucket_bytes`` (DDP): 2(N_d−1)/N_d·Ψ
     elements sent per device; every device steps the whole optimizer.
   - ``zero=1``: reduce_scatter (N_d−1)/N_d·Ψ; each device steps the optimizer on its 1/N_d
     shard (its Adam moments: 2Ψ/N_d … the K·Ψ/N_d of the paper), then all_gathers the
     parameters, (N_d−1)/N_d·Ψ: the same bytes as zero=0.
   - ``zero=3``: the parameters themselves are shards; the backward's reduce_scatter (from the
     forward's all_gather) already summed the gradient shards, so only ÷ dp remains.

The optimizer is elementwise (SGD, Adam, AdamW), so stepping flat shards gives exactly the
whole-parameter step.  The new parameters and optimizer states are computed next to the committed
ones and swapped in by the next step or weight fetch, once the driver knows every device finished
(all or nothing, :mod:`.device_step`).

zero=0's buckets overlap the backward on the modelled clock (:mod:`.overlap`): each bucket is
all-reduced as soon as the last microbatch's backward has made its gradients final, in the order
the backward produces them (the head's first, the embeddings' last), while the rest of that
backward's compute goes on.  ZeRO-3 frees each unit's gathered parameters after its forward and
gathers them again for its backward (:mod:`.fsdp`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..collectives.selection import SHM_MIN_BYTES
from ..tensor_parallel.autodiff import local_slice

__all__ = ["reduce_gradients", "apply_update", "full_params"]


def ring(x: np.ndarray) -> str | None:
    """The ring below the shared-memory threshold (where the runtime would pick a tree, whose bytes
    per device are uneven), so the per-device closed forms hold at every size; the shm algorithm
    above it is counted as the ring (as :mod:`virtualpar.tensor_parallel.autodiff` does)."""
    return "ring" if x.nbytes < SHM_MIN_BYTES else None


def buckets(units: list, itemsize: int, limit: int) -> list[list]:
    """DDP's buckets: the units in the order their gradients become final — the reverse of the
    forward's — grouped greedily up to ``limit`` bytes (a unit larger than ``limit`` is a bucket alone)."""
    out: list[list] = [[]]
    total = 0
    for u in reversed(units):
        nbytes = u.padded * itemsize
        if out[-1] and total + nbytes > limit:
            out.append([])
            total = 0
        out[-1].append(u)
        total += nbytes
    return out


def sp_reduce(dev: Any, meta: dict, unit: Any, g: np.ndarray) -> np.ndarray:
    """A copy of unit ``unit``'s gradient with its replicated parameters' entries summed over tp
    (under sequence parallelism they are partial sums over the sequence shards)."""
    g = np.array(g, copy=True)
    if meta["sp"] and meta["tp"] > 1:
        mask = unit.partial_mask()
        if meta["zero"] == 3 and meta["dp"] > 1:
            mask = local_slice(mask, dev, 0, "dp")
        if mask.any():
            part = np.ascontiguousarray(g[mask])
            g[mask] = dev.all_reduce(part, group="tp", algorithm=ring(part))
    return g


def all_reduce_bucket(dev: Any, grads: dict[str, np.ndarray], bucket: list) -> None:
    """Sum one bucket's flat gradients over dp and cp, in place in ``grads``: one all_reduce."""
    flat = np.concatenate([grads[u.name] for u in bucket])
    flat = dev.all_reduce(flat, group=("dp", "cp"), algorithm=ring(flat))
    at = 0
    for u in bucket:
        grads[u.name] = flat[at:at + grads[u.name].size]
        at += grads[u.name].size


def reduce_gradients(dev: Any, meta: dict, units: list, grads: dict[str, np.ndarray],
                     summed: bool = False) -> dict[str, np.ndarray]:
    """Gradients of one stage → what its optimizer steps on (whole flat vectors, or dp shards for
    zero 1 and 3); see the module doc for the collectives.  ``summed``: zero=0's buckets were
    already reduced during the backward (:mod:`.overlap`), only the ÷ dp remains."""
    dp, zero = meta["dp"], meta["zero"]
    if summed:
        out = dict(grads)
    else:
        out = {u.name: sp_reduce(dev, meta, u, grads[u.name]) for u in units}
        if zero == 0:
            if dp * meta["cp"] > 1:
                itemsize = next(iter(out.values())).itemsize
                for bucket in buckets(units, itemsize, meta["bucket_bytes"]):
                    all_reduce_bucket(dev, out, bucket)
        else:
            for u in units:
                n = u.name
                if meta["cp"] > 1:
                    out[n] = dev.all_reduce(out[n], group="cp", algorithm=ring(out[n]))
                if zero == 1 and dp > 1:
                    out[n] = dev.reduce_scatter(out[n], dim=0, group="dp")
    if dp > 1:
        out = {n: (v / dp).astype(v.dtype) for n, v in out.items()}
    return out


def apply_update(dev: Any, meta: dict, params: dict[str, np.ndarray], optimizer: Any,
                 grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One optimizer step of a stage; returns its new parameters (as stored: whole, or shards)."""
    if meta["zero"] != 1 or meta["dp"] == 1:
        return optimizer.step(params, grads)
    mine = {n: np.ascontiguousarray(local_slice(p, dev, 0, "dp")) for n, p in params.items()}
    new = optimizer.step(mine, grads)
    return {n: dev.all_gather(v, dim=0, group="dp") for n, v in new.items()}


def full_params(dev: Any, meta: dict, params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A stage's whole local (tp-sharded) flat vectors: ZeRO-3's shards all-gathered over dp."""
    if meta["zero"] == 3 and meta["dp"] > 1:
        return {n: dev.all_gather(p, dim=0, group="dp") for n, p in params.items()}
    return dict(params)
