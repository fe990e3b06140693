"""What one round of device replies brought (:class:`Collected`) and what the driver makes of it
(:class:`Verdict`): the types the supervisor fills and the cluster acts on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import DeviceDied

__all__ = ["Collected", "Verdict"]


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
