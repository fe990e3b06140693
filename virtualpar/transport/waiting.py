"""How an endpoint waits: progress, then poll its doorbell briefly, then sleep on it.

Every endpoint (a device, or the host) owns one semaphore, its *doorbell*.  Whoever changes
something this endpoint may be waiting for rings it: a producer after publishing bytes, a consumer
after answering an offer (or freeing room the producer asked for), the driver when it aborts.
A waiting endpoint wakes, drains the count, and makes progress on *every* channel.  Spurious
wake-ups are harmless (the state is re-checked) and lost ones impossible: every change is
published *before* its post, and a waiter drains the count only *before* it re-checks everything,
so a post it drains belongs to a change the re-check sees and a post it does not drain ends its
next sleep at once.

Polling before sleeping: when every device can have a core (devices <= usable CPUs), a wait first
polls its doorbell for up to ``SPIN_SECONDS`` and only then sleeps on the semaphore — on this VM a
cross-core wake-up costs ~30 µs, more than most of the waits it would end.  After the first
``SPIN_BUSY`` of polling it calls ``sched_yield`` between polls, so that a peer queued on the same
core runs (a yield is a ~0.5 µs syscall, so the replies of a ping-pong, due within a few µs, are
polled for without one).  With more devices than cores nobody polls: every wait sleeps at once.
``SPIN_SECONDS = 0`` turns polling off.

Only a wait that goes to sleep touches the wait board (:mod:`.waitboard`): before each sleep it
publishes what it waits for (once per wait) and marks itself asleep, after each wake-up awake, and
it clears the entry when it ends, so the deadlock detector sees blocked devices while polling
waits -- the hot path -- write nothing.

Every sleep is at most ``_WAKE_SLICE`` long, so a wait re-checks the abort word and its deadline
at least that often even if no post ever comes.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Callable

from ..errors import DeviceAborted
from .waitboard import ACK, GEN, KIND, NONE, POKE, describe_wait

if TYPE_CHECKING:  # pragma: no cover
    from .endpoint import Endpoint

__all__ = ["wait", "aborted_error", "spin_seconds", "usable_cpus", "share_cpus", "SPIN_SECONDS", "SPIN_BUSY",
           "SPIN_YIELD"]

SPIN_YIELD = True  # sched_yield between doorbell polls (after the first SPIN_BUSY seconds)
SPIN_SECONDS = 50e-6  # longest doorbell poll before sleeping (only when devices <= cores)
SPIN_BUSY = 10e-6  # ... of which the first this many poll without yielding
_WAKE_SLICE = 0.5  # longest sleep between re-checks of the abort word


_shared_cpus: int | None = None  # set by a device bound to its own cores: its cluster's CPU count


def share_cpus(n: int) -> None:
    """Record that this process's cluster shares ``n`` CPUs (a device does so before it binds
    itself to its own, see runtime/binding.py)."""
    global _shared_cpus
    _shared_cpus = n


def usable_cpus() -> int:
    """The CPUs this process's cluster may run on: those this process may use, or for a device
    bound to its own cores, those its cluster shares."""
    if _shared_cpus is not None:
        return _shared_cpus
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def spin_seconds(devices: int, is_device: bool) -> float:
    """How long a wait of this endpoint polls before sleeping: ``SPIN_SECONDS`` for a device of a
    cluster in which every device can have a core, else 0 (the host never polls)."""
    return SPIN_SECONDS if is_device and devices <= usable_cpus() else 0.0


def wait(
    ep: "Endpoint",
    done: Callable[[], bool],
    timeout: float | None,
    on_timeout: Callable[[], Exception] | None,
    what: object,
    on_idle: Callable[[], None] | None = None,
) -> None:
    """Make progress on ``ep`` until ``done()``; raise on abort or after ``timeout`` seconds
    (``on_timeout()`` builds the error, if given).  ``Endpoint.wait`` is this function.

    ``what`` names the awaited thing in those errors: a string, or an object whose ``str()``
    does (a request passes itself, so a wait that succeeds formats nothing)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    bell = ep.bell
    spin = ep.spin
    clock = time.perf_counter
    spin_until = clock() + spin if spin else 0.0
    busy = min(SPIN_BUSY, spin) if SPIN_YIELD else spin  # poll this long before yielding
    board = ep.board  # the wait board (waitboard.py), written only around a sleep
    published = False
    seen = 0  # the detector's last poke read since this wait's last wake-up
    try:
        while True:
            ep.progress()
            if done():
                return
            if ep.abort_word[0]:
                raise aborted_error(ep, what)
            if on_idle is not None:
                on_idle()
            left = _WAKE_SLICE
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    if on_timeout is not None:
                        raise on_timeout()
                    raise TimeoutError(f"{what} timed out after {timeout} s")
            if spin_until:
                yield_from = spin_until - spin + busy
                while not bell.acquire(False):
                    now = clock()
                    if now >= yield_from:
                        if now >= spin_until:
                            spin_until = 0.0
                            break
                        os.sched_yield()  # a peer queued on this core runs now
                else:
                    while bell.acquire(False):
                        pass
                    spin_until = clock() + spin  # something moved: poll again next time
                    continue
            if board is not None:
                if not published:
                    describe_wait(board, what)
                    published = True
                board[ACK] = seen
                board[GEN] += 1  # odd: asleep
            got = bell.acquire(True, min(left, _WAKE_SLICE))
            if board is not None:
                board[GEN] += 1  # even: awake
                seen = board[POKE]
            if got:
                while bell.acquire(False):
                    pass
                if spin:
                    spin_until = clock() + spin

    finally:
        if published:
            board[KIND] = NONE  # not waiting any more (returned or raised)


def aborted_error(ep: "Endpoint", what: object) -> DeviceAborted:
    """The error of a wait for ``what`` that the abort word ended (it holds the culprit + 1)."""
    culprit = int(ep.abort_word[0]) - 1
    who = "the host" if culprit == ep.layout.host else f"device {culprit}"
    return DeviceAborted(f"aborted while waiting for {what}: {who} failed first", aborted_by=culprit)
