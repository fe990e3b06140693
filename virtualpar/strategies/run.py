"""What a strategy's run is: the scheduled items and their statistics.

Statistics (f, b the forward and backward costs; W workers; B batches; S stages; T the latency):

- ``latency`` T: when the last item ends.  ``throughput``: 2SB / (T·W), work items per unit time
  per worker.  ``busy`` / ``utilisation`` per worker.
- ``activation_transmissions``: consecutive items of a batch on different workers (an activation
  forward, a gradient backward).  ``weight_transmissions``: items whose weights live elsewhere
  (fetched to the compute worker); ``gradient_transmissions``: backward items among those (their
  gradient goes back to the weight worker).
- ``weight_storage``: per worker, the stages whose weights it keeps.
- activation storage: the forward of stage s for batch b stashes its input on its compute worker
  until the backward of (s, b) ends; ``peak_activations`` is the most any worker holds at once,
  ``mean_activations`` the time average of what a worker holds, averaged over the workers.

The bound ρ ≤ M/S (ρ the throughput above, M the peak activation storage of a worker, S the
stages).  What we can prove: the activation of (s, b) is held at least from the start of F(s, b)
to the end of B(s, b), which spans the forward and backward of stages s…S−1: (S−s)(f+b).  Summed
over one batch that is (f+b)·S(S+1)/2, and over the run at most W·M·T is available, so
ρ = 2SB/(TW) ≤ 4M / ((f+b)(S+1)) — for f+b = 3 this is ρ ≤ (4/3)·M/(S+1), which implies ρ ≤ M/S
for S ≤ 3; for larger S the tests check ρ ≤ M/S on every built-in strategy, and the proven bound
always.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .work import ComputeAndWeightWorkers, Direction, Work

__all__ = ["ScheduledWork", "StrategyRun", "activation_stats"]


@dataclass(frozen=True)
class ScheduledWork:
    """One scheduled item: ``work`` on ``workers`` (compute and weight), computing from ``start`` to
    ``end``."""

    work: Work
    workers: ComputeAndWeightWorkers
    start: float
    end: float


@dataclass
class StrategyRun:
    """What ``simulate`` returns: its sizes and costs (f, b), the ``items`` scheduled, the
    transmission counts, ``peak_activations`` / ``mean_activations`` and ``busy`` per worker;
    ``latency``, ``throughput`` (2SB / (T·W)), ``utilisation`` and ``weight_storage`` derive from
    these (see the module doc)."""

    num_workers: int
    num_stages: int
    num_batches: int
    items: list[ScheduledWork]
    forward_cost: float
    backward_cost: float
    activation_transmissions: int
    weight_transmissions: int
    gradient_transmissions: int
    peak_activations: int
    mean_activations: float
    busy: list[float] = field(default_factory=list)

    @property
    def latency(self) -> float:
        return max((i.end for i in self.items), default=0.0)

    @property
    def throughput(self) -> float:
        return len(self.items) / (self.latency * self.num_workers) if self.latency else 0.0

    @property
    def utilisation(self) -> list[float]:
        return [b / self.latency if self.latency else 0.0 for b in self.busy]

    @property
    def weight_storage(self) -> list[int]:
        stores: list[set[int]] = [set() for _ in range(self.num_workers)]
        for i in self.items:
            stores[i.workers.weight].add(i.work.stage)
        return [len(s) for s in stores]

    def proven_bound(self) -> float:
        """4M / ((f+b)(S+1)): the throughput no schedule can beat at this peak storage."""
        return 4 * self.peak_activations / ((self.forward_cost + self.backward_cost) * (self.num_stages + 1))


def activation_stats(items: list[ScheduledWork], workers: int) -> tuple[int, float]:
    """Peak over workers and time of stashed activations, and the mean over time and workers."""
    events: list[list[tuple[float, int]]] = [[] for _ in range(workers)]
    start_of: dict[tuple[int, int], tuple[int, float]] = {}
    for i in items:
        if i.work.direction is Direction.FORWARD:
            start_of[(i.work.stage, i.work.batch)] = (i.workers.compute, i.start)
    for i in items:
        if i.work.direction is Direction.BACKWARD:
            worker, t0 = start_of[(i.work.stage, i.work.batch)]
            events[worker] += [(t0, 1), (i.end, -1)]
    latency = max((i.end for i in items), default=0.0)
    peak, area = 0, 0.0
    for ev in events:
        ev.sort(key=lambda e: (e[0], e[1]))
        n, last = 0, 0.0
        for t, d in ev:
            area += n * (t - last)
            n, last = n + d, t
            peak = max(peak, n)
    mean = area / (latency * workers) if latency else 0.0
    return peak, mean
