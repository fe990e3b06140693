"""virtualpar and MPI: a facade of mpi4py's common subset on the emulator (``virtualpar run --mpi``).

Imports without mpi4py installed; the facade never needs it."""

from __future__ import annotations

__all__ = ["facade"]
