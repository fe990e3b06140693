"""Where every GPT parameter lives: its pipeline stage, its unit, its tensor-parallel split.

A stage holds *units* — ``"embed"`` (token and position embeddings) on the first stage, one unit
per transformer block, ``"final"`` (the last norm and the LM head) on the last — and each unit's
parameters travel and are updated as one flat vector: the local tensor-parallel shards of its
parameters, concatenated in ``state_dict`` order.  The flat vector is what ZeRO shards over dp and
what zero=0's buckets group.

Megatron's tensor-parallel split (Shoeybi et al. 2019), ``Linear`` weights being (in, out)::

    tok_emb.weight          rows      (vocabulary-parallel embedding)
    attn.qkv  weight/bias   columns   (whole heads per device: nn.transformer's head-major layout)
    attn.out.weight         rows      (row-parallel; its bias is added after the reduction)
    mlp.up / mlp.gate       columns   mlp.down.weight rows
    head.weight             columns   (vocabulary-parallel logits, never gathered)
    norms, pos_emb, out.bias, down.bias   replicated over tp

Under sequence parallelism every replicated parameter is used on a sequence shard, so its
gradient is a partial sum over tp (:func:`tp_partial`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UsageError

__all__ = ["Unit", "tp_dim", "stage_units", "shard", "unshard"]


def tp_dim(name: str) -> int | None:
    """The dimension of parameter ``name`` split over tp (None: replicated)."""
    if name == "tok_emb.weight":
        return 0
    if name == "head.weight":
        return 1
    parts = name.split(".")
    if len(parts) == 5 and parts[0] == "blocks":
        layer, leaf = parts[3], parts[4]
        if layer in ("qkv", "up", "gate"):
            return 1 if leaf == "weight" else 0
        if layer in ("out", "down"):
            return 0 if leaf == "weight" else None
    return None


@dataclass(frozen=True)
class Unit:
    """One unit's parameters: ``names`` (full-model keys), their local ``shapes`` on a tp rank, and the
    flat vector's ``size`` and ``padded`` size (a multiple of dp, for ZeRO's equal shards)."""

    name: str
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    size: int
    padded: int

    def offsets(self) -> list[tuple[str, int, int, tuple[int, ...]]]:
        out, at = [], 0
        for n, shape in zip(self.names, self.shapes):
            k = int(np.prod(shape))
            out.append((n, at, at + k, shape))
            at += k
        return out

    def partial_mask(self) -> np.ndarray:
        """True at the entries of replicated parameters (partial over tp under sequence parallelism)."""
        mask = np.zeros(self.padded, bool)
        for n, a, b, _ in self.offsets():
            mask[a:b] = tp_dim(n) is None
        return mask


def _local_shape(shape: tuple[int, ...], dim: int | None, tp: int) -> tuple[int, ...]:
    if dim is None:
        return tuple(shape)
    s = list(shape)
    s[dim] //= tp
    return tuple(s)


def stage_bounds(model: object, stages: int, cuts: list[str] | None = None) -> list[int]:
    """The first block of each stage and the end: the blocks split evenly, or at ``cuts`` — names of
    the blocks that start a new stage (``["blocks.2"]``), as the pipeline's cuts name layers."""
    n = model.n_layers
    if cuts is None:
        return [s * n // stages for s in range(stages + 1)]
    if isinstance(cuts, str) or not all(isinstance(c, str) for c in cuts):
        raise UsageError(f"cuts must be a list of block names such as ['blocks.2'], got {cuts!r}")
    names = [f"blocks.{i}" for i in range(1, n)]
    starts = []
    for c in cuts:
        if c not in names:
            raise UsageError(f"cannot cut the GPT at {c!r}: a stage boundary lies between two blocks, so a "
                             f"cut names the block that starts a stage, one of {names} (the embeddings stay "
                             f"with the first block, the final norm and the head with the last)")
        starts.append(int(c.split(".")[1]))
    if starts != sorted(set(starts)):
        raise UsageError(f"cuts must be increasing and distinct, got {list(cuts)}")
    if len(starts) + 1 != stages:
        raise UsageError(f"{len(cuts)} cuts make {len(cuts) + 1} stages, but the configuration runs {stages} "
                         f"(pp × virtual)")
    return [0, *starts, n]


def stage_units(model: object, stages: int, tp: int, dp: int,
                cuts: list[str] | None = None) -> list[list[Unit]]:
    """The units of each stage (see :func:`stage_bounds`): the embeddings on stage 0, the head on the
    last.  Tied embeddings (one stage) list the head's weight once, under ``tok_emb.weight``."""
    params = model.state_dict()
    bounds = stage_bounds(model, stages, cuts)
    out: list[list[Unit]] = []
    for s in range(stages):
        groups = []
        if s == 0:
            groups.append(("embed", ("tok_emb.", "pos_emb.")))
        groups += [(f"blocks.{i}", (f"blocks.{i}.",)) for i in range(bounds[s], bounds[s + 1])]
        if s == stages - 1:
            groups.append(("final", ("norm.", "head.weight")))
        units = []
        for unit, prefixes in groups:
            names = tuple(k for k in params if k.startswith(prefixes))
            shapes = tuple(_local_shape(params[k].shape, tp_dim(k), tp) for k in names)
            size = sum(int(np.prod(sh)) for sh in shapes)
            units.append(Unit(unit, names, shapes, size, -(-size // dp) * dp))
        out.append(units)
    return out


def shard(full: np.ndarray, name: str, tp: int, rank: int) -> np.ndarray:
    """Tensor-parallel rank ``rank``'s piece of parameter ``name``."""
    dim = tp_dim(name)
    if dim is None:
        return full
    return np.split(full, tp, axis=dim)[rank]


def unshard(pieces: list[np.ndarray], name: str) -> np.ndarray:
    """The whole parameter from the tp ranks' pieces (in tp order)."""
    dim = tp_dim(name)
    return pieces[0] if dim is None else np.concatenate(pieces, axis=dim)


def flatten(unit: Unit, values: dict[str, np.ndarray], dtype: object) -> np.ndarray:
    """The unit's flat vector (zero-padded to ``unit.padded``) from its local parameters."""
    flat = np.zeros(unit.padded, dtype)
    for n, a, b, _ in unit.offsets():
        flat[a:b] = np.asarray(values[n]).reshape(-1)
    return flat
