"""``Endpoint``: one process's side of every channel, with a progress engine and one doorbell.

A blocked endpoint sleeps on its doorbell (:mod:`.waiting`), wakes, and makes progress on *every*
channel: pushes its pending sends and pulls every incoming message, matched or not.  Pulling
everything, always, is what makes blocking sends safe: two devices that both send 64 MiB to each
other before receiving do not deadlock, because each one takes the other's message into private
memory while it waits.

Two protocols, chosen per message (MPI's eager/rendezvous split):

* **eager** (payloads under ``RENDEZVOUS_FLOOR`` = 64 KiB, and larger ones the ring can take whole
  right now): header and payload are copied into the ring by the sender and out by the receiver, in
  ``CHUNK`` pieces so that the two copies overlap on two cores; a payload of up to ``SMALL`` bytes
  follows its header unwrapped, so the receiver takes it in one copy (a pickle is unpickled straight
  from the ring).  The send completes when the last byte is in the ring.  Fast path: a small send
  with nothing queued ahead of it writes its whole frame inside ``isend``, published with one store
  (``VirtualChannel.write_frame``), and gets an already-done ``SentRequest``; the receiver copies a
  frame that is whole in the ring straight into its target.  The fast path is taken only when the
  send queue is empty, so FIFO order holds.
* **rendezvous** (payloads the ring cannot hold, and those of 64 KiB or more that would have to wait
  for room): the receiver copies the payload out of the sender's memory (:mod:`.rendezvous`).  A send
  thus blocks only when it would have blocked on a full ring anyway, so a lone unmatched message
  that fits is still buffered and reported.

**Strict mode** (``eager_limit`` not None, MPI's practice of testing with the eager limit at 0):
every non-control send of more than ``eager_limit`` bytes goes by rendezvous, and the receiver
takes an offer only once a matching receive is posted (until then it is an *unexpected* message
whose payload stays with the sender), so the send completes only when its receive exists.  A
program that relies on the channels buffering then blocks, as on a cluster with small eager
buffers, and deadlock detection names it.  Offers do not wait in line: up to ``OFFER_SLOTS`` (7)
per channel await their receives at once, taken in whatever order the receives come; further ones
travel eagerly and are done when the receiver says a receive took them (``TAG_TAKEN``, see
:mod:`.rendezvous`).  Zero-byte payloads stay eager.  A synchronous send (``sync``, MPI's
``Issend``) is such a send whatever its size, an empty one too.

Matching is FIFO per (source, tag); a message that arrives before its receive is posted waits in an
*unexpected* queue (already in private memory, so the ring keeps flowing).  Receive buffers the
transport allocates (no ``out=``) come from a :class:`BufferPool` and return to it when the user
drops the array, so steady-state loops receive into warm memory.  A producer that finds no room
raises a *want-room* flag and the consumer rings it after freeing room only while the flag is up
(:mod:`.want_room`).  Payload encoding is in :mod:`.payload`, the request state in :mod:`.requests`.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, Callable

import numpy as np

from .arrivals import ArrivalCounters
from .channel import FLAG_CONTROL, FLAG_RENDEZVOUS, FLAG_SYNC, VirtualChannel
from .leftovers import UNFINISHED_RECEIVE
from .payload import encode
from .receiving import CHUNK, Receiving
from .sending import Sending
from .rendezvous import RendezvousState, acknowledge
from .requests import RecvRequest, SendRequest, SentRequest
from .pool import BufferPool
from .lazy import Lazy
from .matching import MatchQueues
from .shm import CROSS_MEMORY, Layout, SharedArena, ring_control
from .traffic import OwedTraffic
from .wildcard import irecv_any
from .waiting import spin_seconds, usable_cpus, wait
from .waitboard import board_view

__all__ = ["Endpoint", "CHUNK", "RENDEZVOUS_MIN", "RENDEZVOUS_FLOOR", "UNFINISHED_RECEIVE"]


SMALL = 1 << 14  # eager payloads up to this size are written unwrapped, right after their header
RENDEZVOUS_MIN: int | None = None  # payloads this large go by rendezvous; None: those the ring cannot hold
RENDEZVOUS_FLOOR = 1 << 16  # ... and payloads this large too when the ring cannot take them right now


class Endpoint(Receiving, Sending):
    """Endpoint ``me`` of a cluster: sends, receives, progress and waiting."""

    def __init__(self, me: int, arena: SharedArena, layout: Layout, doorbells: list[Any]) -> None:
        self.me = me
        self.layout = layout
        peers = [p for p in range(layout.endpoints) if p != me]
        # Channels, send queues: built on first use (transport/lazy.py), so a 256-device start-up
        # does not build 2n channels per device that most devices never use.
        self._out = Lazy(lambda p: VirtualChannel(arena, layout, me, p))
        self._in = Lazy(lambda p: VirtualChannel(arena, layout, p, me))
        self._sendq: Lazy = Lazy(lambda p: deque())  # per destination, FIFO
        self._busy: set[int] = set()  # destinations with queued sends
        self._partial: dict[int, RecvRequest] = {}  # sources whose message is partly received
        self.rendezvous = RendezvousState(peers, CROSS_MEMORY)  # offers, answers, acknowledgements
        # the same containers under the names the per-message code reads (one attribute lookup less)
        rdv = self.rendezvous
        self._offers, self._offer_to = rdv.offered, rdv.offer_to
        self._unacked, self._refused = rdv.unacked, rdv.refused
        # How progress finds the sources with unread bytes: every inbound ring's head against its
        # tail, as two strided memoryviews compared in C (~0.4 µs for 64 sources; a Python loop
        # over the channels cost ~25 µs at 64 devices once the caches had gone cold between
        # wake-ups); only when they differ, one numpy comparison says which.
        E = layout.endpoints
        words = arena.bytes_at(layout.ring_ctrl_offset, E * E * 128).cast("Q")
        self._heads_in, self._tails_in = words[me * 16 :: E * 16], words[me * 16 + 8 :: E * 16]
        ctrl = ring_control(arena, layout)
        self._heads_np, self._tails_np = ctrl[:, me, 0], ctrl[:, me, 8]
        self.queues = MatchQueues()  # posted receives and unexpected messages (matching.py)
        # the same containers under the names the per-message code reads (one attribute lookup less)
        self._posted, self._posted_any = self.queues.posted, self.queues.posted_any
        self._unexpected = self.queues.unexpected
        self._seq = {p: 0 for p in peers}
        self.resets = 0
        # What a wait reads (waiting.wait, this class's ``wait``): its doorbell, the abort word, how
        # long to poll before sleeping, and its view of the wait board.  ``doorbells``: every endpoint's.
        self.bell = doorbells[me]
        self.doorbells = doorbells
        self.abort_word = arena.word_at(layout.abort_offset)
        self.arrivals = ArrivalCounters(arena, layout, me, doorbells) if me < layout.devices else None
        counters = arena.view(layout.counters_offset, 3 * E * E, np.int64).reshape(3, E, E)
        self._bytes_row = counters[0, me]  # numpy views (the driver reads the whole table)
        self._msgs_row = counters[1, me]
        self._ctrl_row = counters[2, me]
        self._bytes_mv = memoryview(self._bytes_row)  # the same words, cheaper to bump
        self._msgs_mv = memoryview(self._msgs_row)
        self._ctrl_mv = memoryview(self._ctrl_row)
        # shared-memory collectives' reads, owed to the counters until the command ends
        self.traffic = OwedTraffic(self._bytes_row, self._msgs_row)
        self._pid = os.getpid()
        self.can_read = CROSS_MEMORY  # False once reading a sender's memory failed
        self.pool = BufferPool()
        self._rdv_min = layout.ring_bytes - 1024  # a frame is header (< 1 KiB) + payload
        self._small = min(SMALL, layout.ring_bytes // 4)  # a header + small payload fits, skip included
        # Devices with a core each overlap sender and receiver: poll before sleeping and post every
        # chunk.  With more devices than cores they take turns: sleep at once, post once per message.
        self._overlap = layout.devices <= usable_cpus()
        self.spin = spin_seconds(layout.devices, me < layout.devices)
        self.eager_limit: int | None = None  # strict mode (see the module doc)
        self.shuffle: Any = None  # shuffled mode: a transport.shuffle.Shuffle, paused on before each post
        self.board = board_view(arena, layout, me) if me < layout.devices else None  # see waitboard.py

    # -- posting ----------------------------------------------------------------------------------
    def isend(self, obj: Any, dst: int, tag: int, stamp: float = 0.0, control: bool = False,
              on_send: Callable[[int, int], float] | None = None,
              sync: bool = False) -> SendRequest | SentRequest:
        """Post ``obj`` to ``dst``, stamped ``stamp`` or ``on_send(dst, nbytes)`` (modelled departure);
        ``sync``: done only once a matching receive has taken it (MPI's ``Issend``), whatever its size."""
        if self.shuffle is not None and not control:
            self.shuffle.pause()
        kind, payload, view, dtype, shape = encode(obj)
        seq = self._seq[dst] = self._seq[dst] + 1
        nbytes = view.nbytes
        if on_send is not None:
            stamp = on_send(dst, nbytes)
        if control:
            kind |= FLAG_CONTROL
        limit = self.eager_limit
        strict = not control and (sync or limit is not None and nbytes > limit and nbytes > 0)
        if strict:  # done only once a receive took it (rendezvous.py)
            kind |= FLAG_SYNC
        if nbytes <= self._small and not self._sendq[dst] and not strict:
            # The eager fast path: nothing queued ahead of it (FIFO) and a small payload, so the
            # whole frame goes into the ring now, published with one store, or not at all.
            if self._out[dst].write_frame(kind, tag, stamp, seq, dtype, shape, view, nbytes):
                self.doorbells[dst].release()
                self._count(dst, nbytes, control)  # once the receiver can have it
                return SentRequest(dst, tag, nbytes, stamp, seq)
        self._count(dst, nbytes, control)
        req = SendRequest(self, dst, tag, kind, payload, view, dtype, shape, seq, stamp)
        if strict or self._offer_to[dst] and nbytes >= RENDEZVOUS_FLOOR and (
                nbytes >= (RENDEZVOUS_MIN or self._rdv_min) or self._sendq[dst]
                or self._out[dst].writable() < nbytes + 2048):  # header + a possible end-of-ring skip
            req.kind |= FLAG_RENDEZVOUS
        self._sendq[dst].append(req)
        self._busy.add(dst)
        self._push(dst)
        return req

    def account(self, dst: int, nbytes: int, messages: int = 1) -> None:
        """Count ``nbytes`` in ``messages`` to ``dst`` that moved without a channel (a peer's read of
        this endpoint's shared memory, in a shared-memory collective)."""
        self._bytes_mv[dst] += nbytes
        self._msgs_mv[dst] += messages

    def inbound(self, src: int) -> VirtualChannel:
        """The channel from ``src`` to this endpoint."""
        return self._in[src]

    def renumber(self) -> None:
        """Number messages from 1 again (a reset; the start-up warm-up, whose messages were all received)."""
        self._seq = {p: 0 for p in self._seq}

    def next_seq(self, dst: int) -> int:
        """The message number the next send to ``dst`` will carry (for trace flow ids)."""
        return self._seq[dst] + 1

    def irecv(self, src: int | None, tag: int | None, out: np.ndarray | None = None) -> RecvRequest:
        # user receives: the runtime's own tags are negative (a range is the mpi4py facade's ANY_TAG)
        if self.shuffle is not None and (tag is None or type(tag) is range or tag >= 0):
            self.shuffle.pause()
        if src is None or tag is None or type(tag) is range:  # any source / any tag (transport/wildcard.py)
            return irecv_any(self, src, tag, out)
        key = (src, tag)
        waiting = self._unexpected.get(key)
        if waiting:
            req = waiting.popleft()  # the oldest message with this key, complete or still arriving
            req.out = out
            req.claimed = True
            if req.header is not None and req.header.kind & FLAG_SYNC:  # strict mode, Issend: it waits for us
                acknowledge(self, req)
            return req
        req = RecvRequest(self, src, tag, out)
        if self._posted_any:  # posting order matters only against waiting wildcard receives
            queues = self.queues
            req.order = queues.order = queues.order + 1
        self._posted[key].append(req)
        self.progress()
        return req

    # -- progress ---------------------------------------------------------------------------------
    def progress(self) -> None:
        if self._busy:
            for dst in tuple(self._busy):
                self._push(dst)
        # A partly received message needs a pull only once more bytes arrived, so unread bytes are
        # the one thing to look for.  (``nonzero`` of the comparison, not ``np.flatnonzero``: its
        # Python wrappers cost ~0.9 of its 1.5 µs, on the path of every message received.)
        if self._heads_in == self._tails_in:
            return
        for src in (self._heads_np != self._tails_np).nonzero()[0].tolist():
            self._pull(src)

    # -- waiting (see waiting.py) ----------------------------------------------------------------
    wait = wait  # (self, done, timeout, on_timeout, what, on_idle=None): progress until done()

    # -- bookkeeping --------------------------------------------------------------------------------
    def drain(self) -> None:
        """Pull every byte already published to this endpoint."""
        self.progress()

    def reset(self) -> None:
        """Forget all in-flight state (after the driver zeroed the rings)."""
        for q in self._sendq.values():
            q.clear()
        for offers in self._offers.values():
            offers.clear()
        self._unacked.clear()
        self._busy.clear()
        self.queues.clear()
        self._drop_partial()
        for ch in self._out.values():
            ch.sync_local(producer=True)
        for ch in self._in.values():
            ch.sync_local(producer=False)
        if self.arrivals is not None:
            self.arrivals.reset()
        self.renumber()
        self.resets += 1  # every device resets together: message numbers restart, the count tells them apart
        while self.bell.acquire(False):
            pass
