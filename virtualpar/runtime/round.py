"""What one round of device replies brought (:class:`Collected`) and what the driver makes of it
(:class:`Verdict`, by :func:`judge`): the supervisor fills the one, the cluster acts on the other.

The root cause follows torch's spawn: a deadlock the watch found, else a run past its deadline, else
a death, else the earliest error that an abort did not cause (ties: the lowest rank).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import CollectiveTimeout, DeviceDied, RunTimeout, unpack_error

__all__ = ["Collected", "Verdict", "judge", "root_error"]


@dataclass
class Collected:
    """What one round of replies brought: results in rank order and everything that went wrong.

    ``returned``: rank -> result of every device that returned (a failed round's error carries it).
    ``errors``: ``(rank, packaged error)`` in arrival order (see ``packaging.package_error``).
    ``stuck``: devices given up on, after the abort grace or the run deadline, with their ``stacks``.
    ``timed_out``: the run deadline passed before any failure.
    """

    results: list[Any]
    returned: dict[int, Any] = field(default_factory=dict)  # the devices that returned, and what
    pending: list[tuple] = field(default_factory=list)
    errors: list[tuple[int, tuple]] = field(default_factory=list)
    deaths: list[DeviceDied] = field(default_factory=list)
    stuck: list[int] = field(default_factory=list)
    stacks: dict[int, str] = field(default_factory=dict)
    timed_out: bool = False
    deadlock: BaseException | None = None


@dataclass(frozen=True)
class Verdict:
    """The error to raise, and why the cluster must shut down (``fatal``) or None to reset and go on."""

    error: BaseException
    fatal: str | None


def judge(got: Collected, what: str, run_timeout: float | None, mesh: Any,
          last_op: Callable[[int], str]) -> Verdict | None:
    """The error ``got`` calls for, and whether it is fatal; None if every device succeeded.

    ``mesh`` names the devices by coordinates; ``last_op(rank)`` describes a device's last op (from
    its flight recorder), for a run past its deadline.
    """
    if got.deadlock is not None:
        fatal = (f"devices {got.stuck} were stuck after the deadlock and had to be killed"
                 if got.stuck else None)
        return Verdict(got.deadlock, fatal=fatal or (str(got.deaths[0]) if got.deaths else None))
    if got.timed_out:
        err = _run_timeout(got, what, run_timeout, mesh, last_op)
        return Verdict(err, fatal=f"{what}() exceeded run_timeout={run_timeout:g} s; "
                                  f"devices {got.stuck} were still running and were killed")
    if got.stuck:
        root = got.deaths[0] if got.deaths else root_error(got.errors)
        if isinstance(root, CollectiveTimeout):  # the stuck device is the one the others waited for
            stacks = "".join(f"\n  stack of stuck device {r} {mesh.index(r)}:\n{_indent(got.stacks[r])}"
                             for r in got.stuck)
            root = root.replace(str(root) + stacks, stacks=got.stacks)
        return Verdict(root, fatal=f"devices {got.stuck} were stuck and had to be killed")
    if got.deaths:
        return Verdict(got.deaths[0], fatal=str(got.deaths[0]))
    if got.errors:
        return Verdict(root_error(got.errors), fatal=None)
    return None


def root_error(errors: list[tuple[int, tuple]]) -> BaseException:
    """The first failure that was not itself caused by an abort (earliest, then lowest rank),
    carrying as ``device_failures`` every device's that failed on its own, in rank order."""
    primary = sorted([e for e in errors if not e[1][3]] or errors, key=lambda e: e[0])
    failures = {rank: unpack_error(packaged) for rank, packaged in primary}
    root = failures[min(primary, key=lambda e: (e[1][2], e[0]))[0]]
    with contextlib.suppress(AttributeError):  # a type with __slots__: the root alone is reported
        root.device_failures = failures
    return root


def _run_timeout(got: Collected, what: str, run_timeout: float | None, mesh: Any,
                 last_op: Callable[[int], str]) -> RunTimeout:
    names = ", ".join(f"device {r} {mesh.index(r)}" for r in got.stuck)
    last_ops = {r: last_op(r) for r in got.stuck}
    done = [r for r in range(len(got.results)) if r not in got.stuck]
    lines = [f"{what}() did not finish within run_timeout={run_timeout:g} s; still running: {names}"]
    for r in got.stuck:
        lines.append(f"  device {r} {mesh.index(r)} last op: {last_ops[r]}")
        lines.append(f"  stack of device {r} {mesh.index(r)}:\n{_indent(got.stacks[r])}")
    returned = f"devices {done} had returned; " if done else ""
    lines.append(f"  {returned}the devices still running were killed and the cluster was shut down. "
                 "If this function legitimately runs longer, raise run_timeout (None: no limit).")
    return RunTimeout("\n".join(lines), running=list(got.stuck), last_ops=last_ops,
                      stacks=dict(got.stacks), run_timeout=run_timeout, function=what)


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.rstrip().splitlines())
