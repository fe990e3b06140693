"""Shared check for tensor-parallel tests: a measured phase equals a policy's closed form exactly."""

from __future__ import annotations


def assert_phase_matches(phase, want, mesh, what: str) -> None:
    """Per device: the collectives (kind and group, in order), bytes sent and FLOPs of ``phase``
    (measured from the cluster) equal those of ``want`` (a PhaseCost)."""
    for rank in range(mesh.size):
        expected = [(c.kind, mesh.group_of(rank, mesh.axes(c.axes))) for c in want.collectives]
        got = list(zip(phase.collectives[rank], phase.groups[rank]))
        assert got == expected, f"{what}: device {rank} ran {got}, closed form says {expected}"
        assert (
            phase.bytes_sent[rank] == want.bytes_sent
        ), f"{what}: device {rank} sent {phase.bytes_sent[rank]} B, closed form {want.bytes_sent}"
        assert (
            phase.flops[rank] == want.flops
        ), f"{what}: device {rank} did {phase.flops[rank]} flops, closed form {want.flops}"
