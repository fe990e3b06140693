"""Which labs exist: virtualpar's own (an explicit table) and third parties' (entry points).

A course ships its own labs as a package that declares, in its packaging metadata,

    [options.entry_points]
    virtualpar.labs =
        my-lab = my_course.labs:LAB

where ``LAB`` is a :class:`~virtualpar.labs.lab.Lab` (or a function of no arguments returning one).
See docs/labs.md for a worked example.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from ..errors import UsageError
from .lab import Lab

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "available", "get"]

ENTRY_POINT_GROUP = "virtualpar.labs"

#: name -> module (under virtualpar.labs.builtin) whose ``LAB`` is the lab, in teaching order
BUILTIN: dict[str, str] = {
    "ring-allreduce": "ring_allreduce",
    "latency-bandwidth": "latency_bandwidth",
    "megatron-mlp": "megatron_mlp",
    "sharding-policy": "sharding_policy",
    "one-f-one-b": "one_f_one_b",
    "zero1": "zero1",
    "timeline-gru": "timeline_gru",
    "pipeline-dp": "pipeline_dp",
    "parallel-3d": "parallel_3d",
}


def _builtin(module: str) -> Lab:
    return importlib.import_module(f"{__package__}.builtin.{module}").LAB


def _plugins() -> dict[str, Lab]:
    labs = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            lab = ep.load()
            lab = lab() if callable(lab) and not isinstance(lab, Lab) else lab
        except Exception as exc:  # a broken plugin must not hide the others
            raise UsageError(f"lab plugin {ep.name!r} ({ep.value}) failed to load: "
                             f"{type(exc).__name__}: {exc}") \
                from exc
        if not isinstance(lab, Lab):
            raise UsageError(f"lab plugin {ep.name!r} ({ep.value}) is a "
                             f"{type(lab).__name__}, not a virtualpar Lab")
        labs[lab.name] = lab
    return labs


def available() -> dict[str, Lab]:
    """Every lab by name: the built-in ones in teaching order, then the plugins'."""
    labs = {name: _builtin(module) for name, module in BUILTIN.items()}
    for name, lab in _plugins().items():
        if name in labs:
            raise UsageError(f"lab plugin {name!r} has the name of a built-in lab; rename it")
        labs[name] = lab
    return labs


def get(name: str) -> Lab:
    if name in BUILTIN:
        return _builtin(BUILTIN[name])
    labs = _plugins()
    if name not in labs:
        known = ", ".join([*BUILTIN, *labs])
        raise UsageError(f"no lab named {name!r}; the labs are: {known} (virtualpar lab list)")
    return labs[name]
