"""Settings shared by the driver and every device of one cluster, and the runtime's reserved tags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

__all__ = ["ClusterConfig", "check_sizes", "check_fault", "default_ring_bytes", "DEFAULT_SCRATCH_BYTES",
           "TAG_FINGERPRINT", "TAG_VERDICT", "TAG_COLLECTIVE", "TAG_HOST", "FAULT_ACTIONS"]

# User tags are >= 0; the runtime's own traffic uses negative tags so it can never be confused
# with (or steal) a user's message.
TAG_FINGERPRINT = -1  # a device's description of the collective it is entering, to the group leader
TAG_VERDICT = -2  # the leader's answer: None if every device agrees, else every fingerprint
TAG_COLLECTIVE = -3  # the data of collective algorithms
TAG_HOST = -4  # arrays placed on / fetched from devices by the driver

FAULT_ACTIONS = ("raise", "kill", "hang", "exit", "delay")
_FAULT_PARAMS = {"exit": {"code"}, "delay": {"seconds"}}


def check_fault(action: str, params: dict) -> None:
    """A fault ``cluster.inject`` can carry out: a known action, with only the parameters it takes
    (a misspelt ``secs=`` was silently the default delay)."""
    if action not in FAULT_ACTIONS:
        raise UsageError(f"unknown fault action {action!r}; choose one of {FAULT_ACTIONS}")
    known = _FAULT_PARAMS.get(action, set())
    if set(params) - known:
        raise UsageError(f"fault action {action!r} takes {sorted(known) or 'no parameters'}, not "
                         f"{sorted(set(params) - known)}")
    seconds, code = params.get("seconds", 0.0), params.get("code", 1)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < float("inf"):
        raise UsageError(f"fault action 'delay': seconds must be a finite number >= 0, got {seconds!r}")
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
        raise UsageError(f"fault action 'exit': code must be an exit status 0..255, got {code!r}")


@dataclass(frozen=True)
class ClusterConfig:
    """What every device needs to know besides the mesh.

    ``timeout``: seconds any single blocking op (send, recv, collective) may wait before it raises.
    ``check_collectives``: compare a fingerprint of every collective call across its group first.
    ``check_nan``: raise on a collective whose input holds NaN or Inf.
    ``trace``: record events for ``cluster.trace()``; ``max_events`` caps them per device.
    ``eager_limit``: None (channels buffer), or the largest payload in bytes a send may leave in the
    channel before its receive is posted (0: every non-empty send is a rendezvous; see endpoint.py).
    ``shuffle``: None, or the seed of shuffled mode (transport/shuffle.py).
    ``t0``: the driver's ``time.monotonic()`` at start-up; wall times in traces are relative to it.
    ``bind``: every device runs on its own share of the cores (runtime/binding.py).
    ``start_line``: every device begins a run's function once all have been handed it (runtime/start_line.py).
    """

    timeout: float = 60.0
    check_collectives: bool = True
    check_nan: bool = False
    trace: bool = True
    max_events: int = 200_000
    t0: float = 0.0
    eager_limit: int | None = None  # strict mode: sends larger than this wait for their receive
    shuffle: int | None = None  # shuffled mode: the seed of every device's pauses
    bind: bool = True  # devices bound to their own share of the cores
    start_line: bool = True  # a run's devices begin together


DEFAULT_SCRATCH_BYTES = 4 << 20  # per device, for the shared-memory collectives


def default_ring_bytes(n: int) -> int:
    """Ring size per directed channel: larger rings for small clusters (fewer chunks in flight)."""
    return 4 << 20 if n <= 4 else 2 << 20 if n <= 8 else 1 << 20


def check_sizes(ring_bytes: Any, scratch_bytes: Any, abort_grace: Any) -> None:
    """Refuse at construction what would otherwise fail in the first send, or not at all."""
    if ring_bytes is not None and (isinstance(ring_bytes, bool) or not isinstance(ring_bytes, int)
                                   or ring_bytes % 8 or ring_bytes < 4096):
        raise UsageError(f"ring_bytes must be an int multiple of 8 and at least 4096, or None (sized for the "
                         f"cluster), got {ring_bytes!r}")
    if isinstance(scratch_bytes, bool) or not isinstance(scratch_bytes, int) or scratch_bytes < 0:
        raise UsageError("scratch_bytes must be an int >= 0 (0: no shared-memory "
                         f"collectives), got {scratch_bytes!r}")
    if isinstance(abort_grace, bool) or not isinstance(abort_grace, (int, float)) or not abort_grace >= 0:
        raise UsageError(f"abort_grace must be seconds >= 0, got {abort_grace!r}")


def check_options(timeout: Any, run_timeout: Any, eager_limit: Any, shuffle: Any) -> None:
    """Refuse at construction a timeout, run_timeout, eager_limit or shuffle seed that is not one."""
    if not timeout > 0:
        raise UsageError(f"timeout must be positive seconds, got {timeout!r}")
    if run_timeout is not None and (isinstance(run_timeout, bool) or not isinstance(run_timeout, (int, float))
                                    or not run_timeout > 0):
        raise UsageError(f"run_timeout must be positive seconds or None (no limit), got {run_timeout!r}")
    if eager_limit is not None and (isinstance(eager_limit, bool) or not isinstance(eager_limit, int)
                                    or eager_limit < 0):
        raise UsageError(f"eager_limit must be an int >= 0 (bytes; 0: every send waits for its receive) "
                         f"or None (channels buffer), got {eager_limit!r}")
    if shuffle is not None and (isinstance(shuffle, bool) or not isinstance(shuffle, int)):
        raise UsageError(f"shuffle must be an int seed or None (no shuffling), got {shuffle!r}")
