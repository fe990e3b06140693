"""``ParallelConfig``: the degrees of every parallel dimension, and the checks that they divide.

    cfg = ParallelConfig(dp=2, tp=2, pp=2, microbatches=4, schedule="1f1b", zero=1,
                         sequence_parallel=True)
    cfg.mesh()          # Mesh(dp=2, pp=2, cp=1, tp=2): dp outermost, tp innermost (fastest)

The axes are ordered ``dp, pp, cp, tp`` as Megatron-LM orders its groups: tensor-parallel peers
are neighbours (the highest-bandwidth links of a node), data-parallel replicas farthest apart.

Everything a configuration needs from a model and a batch is checked by :meth:`check` in the
driver before any device starts, naming the dimension that does not divide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..mesh import Mesh
from ..pipeline.schedules import SCHEDULES, default_virtual

__all__ = ["ParallelConfig", "AXES"]

AXES = ("dp", "pp", "cp", "tp")
ZERO_STAGES = (0, 1, 3)


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"ParallelConfig: {name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of data (``dp``), tensor (``tp``), pipeline (``pp``) and context (``cp``) parallelism,
    ``microbatches`` per step and data-parallel replica, the pipeline ``schedule`` (a name in
    ``SCHEDULES``) with ``virtual`` stages per pipeline rank (None: the schedule's default), the
    ZeRO stage (0, 1 or 3), Megatron's ``sequence_parallel`` and per-block ``recompute``.
    ``bucket_bytes``: the size of zero=0's gradient all-reduce buckets (DDP's 25 MiB)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    zero: int = 0
    sequence_parallel: bool = False
    recompute: bool = False
    virtual: int | None = None
    bucket_bytes: int = 25 * 2 ** 20

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "cp", "microbatches", "bucket_bytes"):
            _positive(name, getattr(self, name))
        if self.schedule not in SCHEDULES:
            raise UsageError(f"ParallelConfig: unknown schedule {self.schedule!r}; choose one of "
                             f"{', '.join(SCHEDULES)}")
        if self.zero not in ZERO_STAGES:
            raise UsageError(f"ParallelConfig: zero must be one of {ZERO_STAGES}, got {self.zero!r}")
        if self.virtual is not None:
            _positive("virtual", self.virtual)
        for name in ("sequence_parallel", "recompute"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"ParallelConfig: {name} must be True or False, got {getattr(self, name)!r}")

    @property
    def size(self) -> int:
        """Devices needed: dp·pp·cp·tp."""
        return self.dp * self.pp * self.cp * self.tp

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline rank (the schedule's ``virtual``)."""
        return self.virtual if self.virtual is not None else default_virtual(self.schedule)

    @property
    def stages(self) -> int:
        """Pipeline stages: pp × chunks."""
        return self.pp * self.chunks

    def mesh(self, topology: Any = None) -> Mesh:
        """The mesh ``{"dp", "pp", "cp", "tp"}`` with these degrees (tp fastest)."""
        return Mesh({a: getattr(self, a) for a in AXES}, topology=topology)

    def check_mesh(self, mesh: Any) -> None:
        """Refuse a mesh whose axes or sizes are not this configuration's."""
        want = {a: getattr(self, a) for a in AXES}
        got = dict(getattr(mesh, "shape", {}))
        if got != want:
            size = getattr(mesh, "size", "?")
            raise UsageError(f"ParallelTrainer: the cluster's mesh is {got or mesh!r} ({size} "
                             f"devices), but the configuration needs {want} ({self.size} devices); "
                             f"build the cluster with VirtualCluster(config.mesh())")

    def check_model(self, model: Any, cuts: Any = None) -> None:
        """Refuse a model these degrees do not divide: heads and vocabulary (and the MLP's hidden
        width) by tp, layers by pp × virtual (unless ``cuts`` place the stages); tied embeddings need
        one pipeline stage."""
        tp = self.tp
        where = "ParallelTrainer"
        if model.n_heads % tp:
            raise UsageError(f"{where}: heads={model.n_heads} do not split over tp={tp} (tensor parallelism "
                             f"gives each device whole heads)")
        if model.vocab % tp:
            raise UsageError(f"{where}: vocabulary={model.vocab} does not split over tp={tp} (the embedding "
                             f"and the LM head are vocabulary-parallel)")
        hidden = model.blocks[0].mlp.hidden
        if hidden % tp:
            raise UsageError(f"{where}: the MLP's hidden width {hidden} does not split over tp={tp}")
        if cuts is None and model.n_layers % self.stages:
            raise UsageError(f"{where}: layers={model.n_layers} do not split over pp × virtual = {self.pp} × "
                             f"{self.chunks} = {self.stages} pipeline stages")
        if model.tie_embeddings and self.stages > 1:
            raise UsageError(f"{where}: tied embeddings need the embedding and the head in one stage, but "
                             f"pp × virtual = {self.stages} stages")

    def check_batch(self, shape: tuple[int, ...], seq_len: int) -> None:
        """Refuse a (batch, seq) the degrees do not divide: batch by dp × microbatches, sequence by
        cp (by cp × tp with sequence parallelism)."""
        if len(shape) != 2:
            raise UsageError(f"ParallelTrainer: tokens must be (batch, seq), got shape {tuple(shape)}")
        batch, seq = shape
        if batch % (self.dp * self.microbatches):
            raise UsageError(f"ParallelTrainer: batch={batch} does not split over dp × microbatches = "
                             f"{self.dp} × {self.microbatches} = {self.dp * self.microbatches}")
        parts = self.cp * (self.tp if self.sequence_parallel else 1)
        if seq % parts:
            what = f"cp × tp = {self.cp} × {self.tp}" if self.sequence_parallel else f"cp={self.cp}"
            why = " (sequence parallelism shards it over tp too)" if self.sequence_parallel else ""
            raise UsageError(f"ParallelTrainer: sequence={seq} does not split over {what}{why}")
        if seq > seq_len:
            raise UsageError(f"ParallelTrainer: sequence={seq} is longer than the model's seq_len={seq_len}")
