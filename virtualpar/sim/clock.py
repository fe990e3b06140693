"""The modelled clock of one device: seconds on the virtual hardware, independent of this machine's load.

Every device process owns one :class:`DeviceClock`.  ``now`` is modelled seconds since the cluster
started; it moves only through the device's own program order:

* **compute** — ``now += max(flops / peak(dtype), bytes / memory_bandwidth)`` (roofline).
* **send** (``on_send``) — the message is injected on the first link of its route at
  ``depart = max(now, busy_until[first link])``; that link is then busy until
  ``depart + nbytes / β_first``.  The sender's ``now`` does *not* advance: sends are asynchronous
  and buffered (the runtime copies the payload out and returns), so a device may post several sends
  back to back and they overlap unless they share a link.  ``depart`` travels in the envelope.
* **receive** (``on_recv``), applied when the receive *completes in program order*::

      arrival = depart + α_route + nbytes / β_route              (α–β / Hockney, cut-through)
      arrival = max(arrival, busy_until[last link] + nbytes / β_last)
      busy_until[last link] = arrival;   now = max(now, arrival)

  A message to oneself costs nothing.

* **the communication stream** (``begin_stream`` … ``end_stream``, ``join_stream``): a second
  timeline beside the compute stream, as a GPU runs NCCL on a side stream.  Between ``begin_stream(
  since)`` and ``end_stream()`` every charge above runs on it: ``now`` starts at ``max(since, the
  stream's last end)`` and the compute stream's ``now`` is restored at the end, unmoved.  The two
  streams keep their own busy-until times (the links' contention between them is not modelled, as
  cross-sender contention is not).  ``join_stream()`` is the compute stream waiting for the other:
  ``now = max(now, stream end)``.

Why this is deterministic: a clock reads the (immutable) topology and keeps busy-until times only
for its own egress links (first hops of its sends) and ingress links (last hops of its receives).
No two processes share mutable state and each update depends only on the device's program order
and on the stamps in the messages it receives, so the modelled time is a pure function of the
program — never of how busy this laptop is or of the wall order in which messages land.

What is and is not contended: two messages on one link *from the same sender* serialize (egress),
and two messages on one link *into the same receiver* serialize (ingress, in the receiver's program
order).  Messages from *different senders* crossing a shared middle link (e.g. a node switch's
uplink to the core switch in ``Topology.hierarchical``) are not arbitrated: that needs a global
order of events, which no single device has.  Such routes still pay the bottleneck bandwidth, so the
model is optimistic only under cross-traffic.  Latency is pipelined with transfers on a link (a link
is busy for ``nbytes / β`` per message, not ``α + nbytes / β``).

Cost: the figures a message needs (first link and β_first for a send; last link, α_route, β_route
and β_last for a receive) are looked up in the topology once per peer and kept, so accounting a
message is a few dict lookups and float operations — the same floats, hence bit-identical times.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Hashable

import numpy as np

from virtualpar.errors import UsageError
from virtualpar.mesh.topology import Topology
from virtualpar.sim.hardware import IDEAL_DEVICE, DeviceSpec
from virtualpar.sim.schedule_charges import ScheduleCharges

__all__ = ["DeviceClock"]

LinkKey = tuple[Hashable, Hashable]
# Per-peer route figures: (first link, β_first, α_route, β_route) of the route to a destination and
# (last link, β_last, α_route, β_route) of the route from a source; the link is None on a self-route.
Figures = tuple["LinkKey | None", float, float, float]


class DeviceClock(ScheduleCharges):
    """Modelled time of device ``rank`` on ``topology`` with compute priced by ``device_spec``.

    Picklable (the topology pickles without its route cache).  Not thread-safe: one per process.
    """

    def __init__(self, rank: int, topology: Topology, device_spec: DeviceSpec = IDEAL_DEVICE) -> None:
        n = topology.num_devices
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
            raise UsageError(f"DeviceClock: rank must be an int in 0..{n - 1} for {topology!r}; got {rank!r}",
                             rank=rank)
        self.rank = rank
        self.topology = topology
        self.device = device_spec
        self.now = 0.0
        # busy-until per directed link; egress links start at self.rank and ingress links end at it,
        # so one dict holds both without collisions
        self._busy: dict[LinkKey, float] = {}
        # route figures per peer, filled on first use; the topology is immutable, so they never go stale
        self._egress: dict[int, Figures] = {}
        self._ingress: dict[int, Figures] = {}
        # this device's column of a schedule's max-plus delay matrix, per (group, schedule, sizes)
        # (sim/schedule_charges.py), and the route figures the schedules need, per group
        self._schedules: dict[tuple, Any] = {}
        # the communication stream: its end and its links; the compute stream's (now, links) while on it
        self._stream_end = 0.0
        self._stream_busy: dict[LinkKey, float] = {}
        self._parked: tuple[float, dict[LinkKey, float]] | None = None

    # -- state ----------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Back to time 0 with every link idle, on the compute stream."""
        if self._parked is not None:
            self._busy = self._parked[1]
            self._parked = None
        self.now = self._stream_end = 0.0
        self._busy.clear()
        self._stream_busy.clear()

    def busy_until(self, u: Hashable, v: Hashable) -> float:
        """When the directed link ``u -> v`` is next free, as this device knows it (0.0 if never used)."""
        return self._busy.get((u, v), 0.0)

    def __repr__(self) -> str:
        return (f"DeviceClock(rank={self.rank}, now={self.now:.9g}s, topology={self.topology.name}, "
                f"device={self.device.name}, links={len(self._busy)})")

    # -- the communication stream -------------------------------------------------------------------
    @property
    def on_stream(self) -> bool:
        """Are the charges going to the communication stream (between begin_stream and end_stream)?"""
        return self._parked is not None

    def begin_stream(self, since: float) -> float:
        """Charge what follows to the communication stream, starting no earlier than ``since`` (a
        time on the compute stream, e.g. when a gradient became final) nor than the stream's last
        end; returns that start.  The compute stream's ``now`` waits aside until :meth:`end_stream`."""
        since = float(since)
        if self._parked is not None:
            raise UsageError(f"DeviceClock.begin_stream on rank {self.rank}: already on the communication "
                             "stream (streams do not nest)", rank=self.rank)
        if math.isnan(since):
            raise UsageError(f"DeviceClock.begin_stream on rank {self.rank}: since must be a time in "
                             "seconds; got nan", rank=self.rank)
        self._parked = (self.now, self._busy)
        self._busy = self._stream_busy
        self.now = max(since, self._stream_end)
        return self.now

    def end_stream(self) -> float:
        """Back to the compute stream, its ``now`` as it was; returns the communication stream's end."""
        if self._parked is None:
            raise UsageError(f"DeviceClock.end_stream on rank {self.rank}: not on the communication stream",
                             rank=self.rank)
        self._stream_end = self.now
        self.now, self._busy = self._parked
        self._parked = None
        return self._stream_end

    def join_stream(self) -> float:
        """The compute stream waits for the communication stream: ``now = max(now, its end)``."""
        if self._parked is not None:
            raise UsageError(f"DeviceClock.join_stream on rank {self.rank}: still on the communication "
                             "stream", rank=self.rank)
        if self._stream_end > self.now:
            self.now = self._stream_end
        return self.now

    # -- compute --------------------------------------------------------------------------------------
    def compute(self, flops: float = 0.0, nbytes: float = 0.0, dtype: Any = "float32") -> tuple[float, float]:
        """Run a kernel of ``flops`` FLOPs touching ``nbytes`` bytes; returns its modelled ``(start,
        end)``."""
        if type(flops) not in (int, float) or type(nbytes) not in (int, float) or not (
                0 <= flops < math.inf and 0 <= nbytes < math.inf):
            flops, nbytes = (self._amount("flops", flops), self._amount("bytes", nbytes))  # (the slow path)
        start = self.now
        self.now = start + self.device.compute_time(flops, nbytes, dtype)
        return start, self.now

    def _amount(self, what: str, v: Any) -> float:
        """``v`` as an amount of work: a finite real number >= 0 (numpy scalars and 0-d arrays too),
        named as ``dev.compute`` names it (an infinite amount would make every later time inf)."""
        if not isinstance(v, (bool, np.bool_, str, bytes)) and np.ndim(v) == 0:
            try:
                x = float(v)
            except (TypeError, ValueError):
                x = -1.0
            if 0 <= x < math.inf and isinstance(v, (numbers.Real, np.ndarray)):
                return x
        raise UsageError(f"compute on rank {self.rank}: {what} must be a finite number >= 0, got {v!r}",
                         rank=self.rank)

    def advance_to(self, t: float) -> float:
        """``now = max(now, t)`` (e.g. wait for an event stamped ``t``); returns the new ``now``."""
        t = float(t)
        if math.isnan(t):
            raise UsageError(f"DeviceClock.advance_to on rank {self.rank}: expected a "
                             "time in seconds; got nan",
                             rank=self.rank)
        self.now = max(self.now, t)
        return self.now

    # -- messages -------------------------------------------------------------------------------------
    def _check_nbytes(self, op: str, peer: int, nbytes: float) -> float:
        if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real) or not nbytes >= 0:
            raise UsageError(f"DeviceClock.{op} on rank {self.rank} (peer {peer}): nbytes must be a number "
                             f">= 0; got {nbytes!r}", rank=self.rank, op=op)
        return nbytes

    def _figures(self, src: int, dst: int, cache: dict[int, Figures], peer: Any, egress: bool) -> Figures:
        """Route figures for ``src -> dst``; validated by ``topology.route``, kept per plain-int peer."""
        route = self.topology.route(src, dst)  # raises MeshError for a peer that is not a device
        if not route.links:
            figures: Figures = (None, math.inf, route.latency, route.bandwidth)
        else:
            link = route.links[0] if egress else route.links[-1]
            figures = (link, self.topology.link(*link).bandwidth, route.latency, route.bandwidth)
        if type(peer) is int:  # not bool or numpy ints: those must keep going through route()'s check
            cache[peer] = figures
        return figures

    def on_send(self, dst: int, nbytes: float) -> float:
        """Account a message of ``nbytes`` leaving for ``dst``; returns its departure stamp for the envelope.

        ``depart = max(now, busy_until[first link])``; the first link is then busy for
        ``nbytes / β_first``.  ``now`` is unchanged (asynchronous, buffered send).
        """
        if type(nbytes) is not int or nbytes < 0:
            self._check_nbytes("on_send", dst, nbytes)
        figures = self._egress.get(dst) if type(dst) is int else None
        if figures is None:
            figures = self._figures(self.rank, dst, self._egress, dst, True)
        first = figures[0]
        if first is None:  # to oneself: no link, no cost
            return self.now
        depart = max(self.now, self._busy.get(first, 0.0))
        # serialization time nbytes / β_first (0 for an empty message, even at β = inf)
        self._busy[first] = depart + (nbytes / figures[1] if nbytes else 0.0)
        return depart

    def route_time(self, dst: int, nbytes: int) -> float:
        """``topology.route(rank, dst).time(nbytes)`` = α_route + nbytes / β_route (0 to oneself), from the
        cache."""
        figures = self._egress.get(dst) if type(dst) is int else None
        if figures is None:
            figures = self._figures(self.rank, dst, self._egress, dst, True)
        if nbytes < 0:
            return self.topology.route(self.rank, dst).time(nbytes)  # raises, with Route's message
        return figures[2] + (nbytes / figures[3] if nbytes else 0.0)

    def on_send_done(self, dst: int, nbytes: int, stamp: float) -> float:
        """A send that departed at ``stamp`` is complete for its sender: ``now = max(now, stamp +
        T_route(nbytes))``.

        Hockney's model charges the sender α + M/β when it waits on the send, so an isend overlapped
        with compute costs max(compute, transfer), not the sum.  Returns ``stamp + T_route(nbytes)``.
        """
        figures = self._egress.get(dst) if type(dst) is int and nbytes >= 0 else None
        if figures is None:
            end = stamp + self.route_time(dst, nbytes)
        else:  # route_time, inlined (hot path)
            end = stamp + (figures[2] + (nbytes / figures[3] if nbytes else 0.0))
        if end != end:  # nan: let advance_to raise its error
            self.advance_to(end)
        if end > self.now:
            self.now = end
        return end

    def on_recv(self, src: int, nbytes: float, stamp: float) -> float:
        """Complete the receive of ``nbytes`` from ``src`` that departed at ``stamp``; returns its arrival.

        ``arrival = max(stamp + α_route + nbytes / β_route, busy_until[last link] + nbytes / β_last)``,
        then ``now = max(now, arrival)``.  Call in program order, not in wall-arrival order.
        """
        if type(nbytes) is not int or nbytes < 0:
            self._check_nbytes("on_recv", src, nbytes)
        if type(stamp) is not float or stamp - stamp != 0.0:  # x - x is 0.0 for every finite float only
            stamp = float(stamp)
            if not math.isfinite(stamp):
                raise UsageError(f"DeviceClock.on_recv on rank {self.rank} (from {src}): the departure stamp "
                                 f"must be a finite time; got {stamp!r}", rank=self.rank, op="on_recv")
        figures = self._ingress.get(src) if type(src) is int else None
        if figures is None:
            figures = self._figures(src, self.rank, self._ingress, src, False)
        last, bw_last, latency, bandwidth = figures
        if last is None:
            return self.advance_to(stamp)  # a self-message left at or before now: costs nothing
        # serialization times (0 for an empty message, even at β = inf); the same float operations in
        # the same order as with a fresh route(), so the times are bit-identical
        t_route = nbytes / bandwidth if nbytes else 0.0
        t_last = nbytes / bw_last if nbytes else 0.0
        arrival = max(stamp + latency + t_route, self._busy.get(last, 0.0) + t_last)
        self._busy[last] = arrival
        if arrival > self.now:
            self.now = arrival
        return arrival
