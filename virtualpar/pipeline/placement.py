"""Which pipeline rank holds which stage: ``Placement`` (a frozen map stage → rank).

- ``loop``: stage s on rank s mod R (one stage per rank when S = R; looped / interleaved when
  S = V·R, Narayanan et al. 2021).
- ``vee``: V-shaped, two chunks per rank: stage s < R on rank s, stage s ≥ R on rank 2R−1−s, so
  the first and last stages share rank 0 (the placement of ZB-V).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError

__all__ = ["Placement"]


@dataclass(frozen=True)
class Placement:
    """Where work runs and where weights live.

    ``stage_rank[s]``: the rank that runs stage s (and keeps its weights).  ``compute`` optionally
    overrides the rank per (stage, microbatch) — the unified strategies' "compute worker" — and
    ``weights`` the rank that stores each stage's weights ("weight worker"); where the two
    differ, lowering adds weight transfers to the compute rank and gradient transfers back.
    ``replicated`` stages keep a copy on each of several ranks (data parallelism, looped
    pipelines): the copies' gradients are summed before each copy takes the same optimizer step.
    """

    ranks: int
    stage_rank: tuple[int, ...]  # stage s runs on rank stage_rank[s]
    compute: tuple[tuple[tuple[int, int], int], ...] = ()  # ((stage, microbatch), rank) overrides
    weights: tuple[int, ...] = ()  # stage s's weights on rank weights[s] (default: stage_rank)
    replicated: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (stage, ranks keeping a copy of its weights)

    @property
    def stages(self) -> int:
        return len(self.stage_rank)

    def rank_of(self, stage: int, microbatch: int) -> int:
        """The rank that computes ``stage`` for ``microbatch``."""
        if self.compute:
            table = self.__dict__.get("_compute_table")
            if table is None:
                table = dict(self.compute)
                object.__setattr__(self, "_compute_table", table)
            return table.get((stage, microbatch), self.stage_rank[stage])
        return self.stage_rank[stage]

    def weight_rank(self, stage: int, microbatch: int = 0) -> int:
        if stage in self.copies:
            return self.rank_of(stage, microbatch)  # the computing rank keeps a copy
        return self.weights[stage] if self.weights else self.stage_rank[stage]

    @classmethod
    def loop(cls, ranks: int, virtual: int = 1) -> "Placement":
        _positive("ranks", ranks), _positive("virtual", virtual)
        return cls(ranks, tuple(s % ranks for s in range(ranks * virtual)))

    @classmethod
    def vee(cls, ranks: int) -> "Placement":
        _positive("ranks", ranks)
        return cls(ranks, tuple(s if s < ranks else 2 * ranks - 1 - s for s in range(2 * ranks)))

    def stages_of(self, rank: int) -> list[int]:
        """The stages whose weights ``rank`` keeps."""
        return [s for s in range(self.stages) if rank in self.copies.get(s, ()) or
                (s not in self.copies and self.weight_rank(s) == rank)]

    @property
    def copies(self) -> dict[int, tuple[int, ...]]:
        """Replicated stages: stage -> the ranks that keep a copy of its weights."""
        return dict(self.replicated)


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name} must be a positive int, got {value!r}")
