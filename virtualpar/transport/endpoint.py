"""``Endpoint``: one process's side of every channel, with a progress engine and one doorbell.

Every endpoint (a device, or the host) owns one semaphore, its *doorbell*.  Whoever changes
something this endpoint may be waiting for rings it: a producer after publishing bytes, a consumer
after answering an offer (or freeing room the producer asked for, below), the driver when it
aborts.  A blocked endpoint sleeps on its doorbell, wakes, drains the count, and makes progress on
*every* channel: pushes its pending sends and pulls every incoming message, matched or not.

Pulling everything, always, is what makes blocking sends safe: two devices that both send 64 MiB to
each other before receiving do not deadlock, because each one takes the other's message into
private memory while it waits.  Spurious wake-ups are harmless (the state is re-checked) and lost
ones impossible: every change is published *before* its post, and a waiter drains the count only
*before* it re-checks everything, so a post it drains belongs to a change the re-check sees and a
post it does not drain ends its next sleep at once.

Two protocols, chosen per message (MPI's eager/rendezvous split):

* **eager** (payloads under ``RENDEZVOUS_FLOOR`` = 64 KiB, and larger ones the ring can take
  whole right now, i.e. whenever the send would not have to wait): header and payload are copied
  into the ring by the sender and out by the receiver, in ``CHUNK`` pieces so that the two copies
  overlap on two cores; a payload of up to ``SMALL`` bytes is written unwrapped right after its
  header, so the receiver takes it in one copy (a pickle is unpickled straight from the ring).
  The send completes when the last byte is in the ring: it never waits for the receiver.
  Fast path: a small send with nothing queued ahead of it to the same peer writes its whole
  frame inside ``isend`` and publishes it with one store (``VirtualChannel.write_frame``), so the
  receiver never sees a header without its payload; it gets an already-done ``SentRequest``.
  The receiver copies a frame that is whole in the ring straight into its target in one call.
  Both paths keep FIFO order: the fast one is taken only when the send queue is empty.
* **rendezvous** (payloads the ring cannot hold, and those of 64 KiB or more that would have to
  wait for room): the sender writes only a header with its pid, the payload's address and a
  token; the receiver's progress engine copies the payload straight from the sender's memory into
  its final buffer with ``process_vm_readv`` (one copy instead of two, and no dependence on both
  processes being on a core at once), writes the token into the channel's reply word and rings
  the sender, whose send then completes.  If the kernel refuses (another OS, a ptrace policy),
  the receiver answers ``token | 1`` and the payload is streamed through the ring after all: the
  fast path is never a requirement.  As with MPI's rendezvous, the sender must not modify the
  array between ``isend`` and ``wait``.  A send thus blocks only when it would have blocked on a
  full ring anyway, so a lone unmatched message that fits is still buffered and reported.

Receive buffers the transport allocates (no ``out=``) come from a :class:`BufferPool` and return to
it when the user drops the array, so steady-state loops receive into warm memory.

Posting only when it helps: a producer that finds no room raises a *want-room* flag, and the
consumer rings it after freeing room only while that flag is up (see :mod:`.want_room`).

Waiting: when every device can have a core (devices <= usable CPUs), a wait first polls its
doorbell for up to ``SPIN_SECONDS`` (``sched_yield`` between polls after the first ``SPIN_BUSY``,
so a peer queued on the same core runs; a yield is a ~0.5 µs syscall, so the replies of a
ping-pong, due within a few µs, are polled for without one) and only then sleeps on the semaphore — on this VM a cross-core wake-up costs ~30 µs,
more than most of the waits it would end.  With more devices than cores nobody polls: every wait
sleeps at once and chunks are announced once per message.

Matching is FIFO per (source, tag); a message that arrives before its receive is posted waits in
an *unexpected* queue (already in private memory, so the ring keeps flowing).

Payload encoding lives in :mod:`.payload`, the per-message request state in :mod:`.requests`.
"""

from __future__ import annotations

import errno
import logging
import os
import pickle
import time
from collections import defaultdict, deque
from typing import Any, Callable

import numpy as np

from ..errors import DeviceAborted, PayloadError, UsageError
from .arrivals import ArrivalCounters
from .channel import FLAG_CONTROL, FLAG_RENDEZVOUS, KIND_ARRAY, KIND_PICKLE, Header, VirtualChannel
from .payload import byte_view, check_out, encode, header_dtype
from .requests import SEND_NEW, SEND_OFFERED, SEND_STREAM, RecvRequest, SendRequest, SentRequest
from .shm import CROSS_MEMORY, PERMANENT_ERRORS, BufferPool, Layout, SharedArena, read_remote
from .want_room import FENCED, fence, want_room

__all__ = ["Endpoint", "CHUNK", "RENDEZVOUS_MIN", "RENDEZVOUS_FLOOR", "SPIN_SECONDS"]

log = logging.getLogger(__name__)

CHUNK = 1 << 18  # 256 KiB: the copy granularity of eager messages, so sender and receiver overlap
SMALL = 1 << 14  # eager payloads up to this size are written unwrapped, right after their header
RENDEZVOUS_MIN: int | None = None  # payloads this large go by rendezvous; None: those the ring cannot hold
RENDEZVOUS_FLOOR = 1 << 16  # ... and payloads this large too when the ring cannot take them right now
SPIN_YIELD = True  # sched_yield between doorbell polls (after the first SPIN_BUSY seconds)
SPIN_SECONDS = 50e-6  # longest doorbell poll before sleeping (only when devices <= cores)
SPIN_BUSY = 10e-6  # ... of which the first this many poll without yielding (a yield is a ~0.5 µs syscall)
_WAKE_SLICE = 0.5  # longest sleep between re-checks of the abort word


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Endpoint:
    """Endpoint ``me`` of a cluster: sends, receives, progress and waiting."""

    def __init__(self, me: int, arena: SharedArena, layout: Layout, doorbells: list[Any]) -> None:
        self.me = me
        self.layout = layout
        peers = [p for p in range(layout.endpoints) if p != me]
        self._out = {p: VirtualChannel(arena, layout, me, p) for p in peers}
        self._in = {p: VirtualChannel(arena, layout, p, me) for p in peers}
        self._inlist = list(self._in.items())
        self._sendq: dict[int, deque[SendRequest]] = {p: deque() for p in peers}
        self._busy: set[int] = set()  # destinations with queued sends
        self._partial: dict[int, RecvRequest | None] = {p: None for p in peers}
        self._posted: defaultdict[tuple[int, int], deque[RecvRequest]] = defaultdict(deque)
        self._unexpected: defaultdict[tuple[int, int], deque[RecvRequest]] = defaultdict(deque)
        self._seq = {p: 0 for p in peers}
        self._bell = doorbells[me]
        self._bells = doorbells
        self._abort = arena.word_at(layout.abort_offset)
        self.arrivals = ArrivalCounters(arena, layout, me, doorbells) if me < layout.devices else None
        E = layout.endpoints
        counters = arena.view(layout.counters_offset, 3 * E * E, np.int64).reshape(3, E, E)
        self._bytes_row = counters[0, me]  # numpy views, read by the runtime
        self._msgs_row = counters[1, me]
        self._ctrl_row = counters[2, me]
        self._bytes_mv = memoryview(self._bytes_row)  # the same words, cheaper to bump
        self._msgs_mv = memoryview(self._msgs_row)
        self._ctrl_mv = memoryview(self._ctrl_row)
        self._pid = os.getpid()
        self._token = 0
        self._offer_to = {p: CROSS_MEMORY for p in peers}  # False once p could not read our memory
        self._can_read = CROSS_MEMORY  # False once reading a sender's memory failed
        self._pool = BufferPool()
        self._rdv_min = layout.ring_bytes - 1024  # a frame is header (< 1 KiB) + payload
        self._small = min(SMALL, layout.ring_bytes // 4)  # so a header + small payload always fits, skip included
        # Devices with a core each overlap sender and receiver: poll before sleeping and post every
        # chunk.  With more devices than cores they take turns: sleep at once, post once per message.
        self._overlap = layout.devices <= _usable_cpus()
        self._spin = SPIN_SECONDS if self._overlap and me < layout.devices else 0.0

    # -- posting ----------------------------------------------------------------------------------
    def isend(self, obj: Any, dst: int, tag: int, stamp: float = 0.0, control: bool = False) -> SendRequest | SentRequest:
        kind, payload, view, dtype, shape = encode(obj)
        seq = self._seq[dst] = self._seq[dst] + 1
        nbytes = view.nbytes
        if control:
            kind |= FLAG_CONTROL
        if nbytes <= self._small and not self._sendq[dst]:
            # The eager fast path: nothing queued ahead of it (FIFO) and a small payload, so the
            # whole frame goes into the ring now, published with one store, or not at all.
            if self._out[dst].write_frame(kind, tag, stamp, seq, dtype, shape, view, nbytes):
                self._bells[dst].release()
                self._count(dst, nbytes, control)  # once the receiver can have it
                return SentRequest(dst, tag, nbytes, stamp, seq)
        self._count(dst, nbytes, control)
        req = SendRequest(self, dst, tag, kind, payload, view, dtype, shape, seq, stamp)
        if nbytes >= RENDEZVOUS_FLOOR and self._offer_to[dst] and (
                nbytes >= (RENDEZVOUS_MIN or self._rdv_min) or self._sendq[dst]
                or self._out[dst].writable() < nbytes + 2048):  # header + a possible end-of-ring skip
            req.kind |= FLAG_RENDEZVOUS
            self._token += 1
            req.token = self._token
        self._sendq[dst].append(req)
        self._busy.add(dst)
        self._push(dst)
        return req

    def _count(self, dst: int, nbytes: int, control: bool) -> None:
        """Count a message to ``dst`` in the shared counters (control traffic apart from data)."""
        if control:
            self._ctrl_mv[dst] += nbytes
        else:
            self._bytes_mv[dst] += nbytes
            self._msgs_mv[dst] += 1

    def next_seq(self, dst: int) -> int:
        """The message number the next send to ``dst`` will carry (for trace flow ids)."""
        return self._seq[dst] + 1

    def irecv(self, src: int, tag: int, out: np.ndarray | None = None) -> RecvRequest:
        key = (src, tag)
        waiting = self._unexpected.get(key)
        if waiting:
            req = waiting.popleft()  # the oldest message with this key, complete or still arriving
            req.out = out
            req.claimed = True
            return req
        req = RecvRequest(self, src, tag, out)
        self._posted[key].append(req)
        self.progress()
        return req

    # -- progress ---------------------------------------------------------------------------------
    def progress(self) -> None:
        if self._busy:
            for dst in tuple(self._busy):
                self._push(dst)
        partial = self._partial
        for src, ch in self._inlist:
            if ch._head[0] != ch._local or partial[src] is not None:
                self._pull(src)

    def _push(self, dst: int) -> None:
        q = self._sendq[dst]
        ch = self._out[dst]
        published = False
        try:
            while q:
                req = q[0]
                if req.state == SEND_NEW:
                    rdv = req.kind & FLAG_RENDEZVOUS
                    addr = req.payload.ctypes.data if rdv else 0
                    small = req.padded if not rdv and req.padded <= self._small else 0
                    if not ch.write_header(req.kind, req.tag, req.nbytes, req.stamp, req.seq, req.dtype, req.shape,
                                           self._pid, addr, req.token, small):
                        if want_room(ch):
                            continue  # room appeared before the consumer could see the flag
                        return
                    published = True
                    req.state = SEND_OFFERED if rdv else SEND_STREAM
                if req.state == SEND_OFFERED:
                    answer = ch.reply()
                    if answer == req.token << 1:
                        req.done = True
                        q.popleft()
                        continue
                    if answer != (req.token << 1) | 1:
                        return  # the receiver has not taken it yet
                    self._offer_to[dst] = False  # it cannot read our memory: stream this and later ones
                    req.state = SEND_STREAM
                while req.written < req.padded:
                    room = ch.writable()
                    if room <= 0:
                        if want_room(ch):
                            continue
                        return
                    n = min(room, req.padded - req.written, CHUNK)
                    data_n = min(n, req.nbytes - req.written)
                    if data_n > 0:
                        ch.write(req.view[req.written :], data_n)
                    if n > data_n:
                        ch.skip_write(n - max(data_n, 0))
                    req.written += n
                    if req.written < req.padded and self._overlap:
                        self._bells[dst].release()  # let the receiver start on this chunk now
                    published = True
                req.done = True
                q.popleft()
            self._busy.discard(dst)
            if ch._want[0]:
                ch._want[0] = 0  # nothing left to write: stop asking for posts
        finally:
            if published:
                self._bells[dst].release()

    def _pull(self, src: int) -> None:
        ch = self._in[src]
        freed = False
        try:
            while True:
                req = self._partial[src]
                if req is None:
                    if ch._head[0] == ch._local:
                        return
                    header = ch.read_header()
                    freed = True
                    if header is None:
                        continue  # an end-of-ring marker
                    req = self._match(src, header)
                    if header.kind & FLAG_RENDEZVOUS:
                        self._take_offer(ch, req)
                        if req.done:
                            continue
                    elif req.expect == 0:
                        self._finish(req)
                        continue
                    elif req.buf is not None and ch._head[0] - ch._local >= req.expect:
                        # The whole array is in the ring (always so for a fast-path frame): one copy.
                        ch.read_into(req.buf, header.nbytes, req.expect)
                        req.buf = req.target = None
                        req.done = True
                        continue
                    elif req.buf is None and ch.readable() >= req.expect:  # a whole pickle in the ring
                        view = ch.peek(req.header.nbytes)
                        if view is not None:
                            self._finish(req, view)
                            ch.skip_read(req.expect)
                            continue
                    self._partial[src] = req
                    if req.buf is None:
                        req.target = self._pool.raw(req.header.nbytes)
                        req.buf = memoryview(req.target)
                while req.got < req.expect:
                    avail = ch.readable()
                    if avail <= 0:
                        return
                    n = min(avail, req.expect - req.got, CHUNK)
                    data_n = min(n, req.header.nbytes - req.got)
                    if data_n > 0:
                        ch.read_into(req.buf[req.got :], data_n)
                    if n > data_n:
                        ch.skip_read(n - max(data_n, 0))
                    req.got += n
                    freed = False
                    if req.got < req.expect:
                        self._room_freed(ch, src)  # room for the sender's next chunk
                    else:
                        freed = True
                self._partial[src] = None
                self._finish(req)
        finally:
            if freed:
                self._room_freed(ch, src)

    def _room_freed(self, ch: VirtualChannel, src: int) -> None:
        """Ring ``src``'s doorbell if it waits for room in ``ch`` (always, where we cannot fence)."""
        if FENCED:
            fence()
            if not ch._want[0]:
                return
        self._bells[src].release()

    def _take_offer(self, ch: VirtualChannel, req: RecvRequest) -> None:
        """Copy a rendezvous payload out of the sender's memory, or ask for it through the ring."""
        h = req.header
        assert h is not None
        if req.target is None:
            req.target = self._pool.raw(h.nbytes)
        err = read_remote(h.pid, h.addr, req.target, h.nbytes) if self._can_read else errno.EPERM
        if not err:
            ch.answer(h.token << 1)
            self._bells[req.src].release()
            self._finish(req)
        else:
            if err in PERMANENT_ERRORS:
                self._can_read = False  # the kernel will always refuse: stream every later offer too
                log.info("endpoint %d cannot read endpoint %d's memory (%s): large messages go through the rings",
                         self.me, req.src, os.strerror(err))
            req.expect = (h.nbytes + 7) & ~7
            req.buf = byte_view(req.target) if h.nbytes else None
            ch.answer((h.token << 1) | 1)
            self._bells[req.src].release()
            self._partial[req.src] = req

    def _match(self, src: int, header: Header) -> RecvRequest:
        key = (src, header.tag)
        posted = self._posted.get(key)
        if posted:
            req = posted.popleft()
        else:
            req = RecvRequest(self, src, header.tag)
            self._unexpected[key].append(req)
        req.header = header
        req.expect = 0 if header.kind & FLAG_RENDEZVOUS else (header.nbytes + 7) & ~7  # header.padded, inlined
        if header.kind & 0xFF == KIND_ARRAY:
            target = None
            out = req.out
            if out is not None:
                if out.shape == header.shape and out.dtype is header_dtype(header.dtype):
                    if req.out_bytes is not None:
                        target = out  # the common case, checked in full below otherwise
                else:
                    try:
                        check_out(out, header)
                        if req.out_bytes is not None:
                            target = out
                    except UsageError as exc:
                        req.error = exc  # still drain the bytes, then report at wait()
            if target is None:
                if header.nbytes < self._pool.min_bytes:  # what the pool would do, minus its np.prod
                    target = np.empty(header.shape, header_dtype(header.dtype))
                else:
                    target = self._pool.array(header.shape, header_dtype(header.dtype))
            req.value = target
            if header.nbytes:
                req.target = target  # C-contiguous: a rendezvous reads into its address
                req.buf = req.out_bytes if target is out else byte_view(target)
        return req

    def _finish(self, req: RecvRequest, data: Any = None) -> None:
        header = req.header
        if header is not None and header.kind & 0xFF == KIND_PICKLE:
            try:
                req.value = pickle.loads(data if data is not None else req.target)
            except Exception as exc:
                req.error = PayloadError(f"message from endpoint {req.src} (tag {req.tag}) could not be unpickled: {exc}")
            if data is None:
                req.buf = None  # drop our view before the raw buffer goes back to the pool
                self._pool.give_back(req.target)
        req.buf = req.target = None
        req.done = True

    # -- waiting ----------------------------------------------------------------------------------
    def wait(
        self,
        done: Callable[[], bool],
        timeout: float | None,
        on_timeout: Callable[[], Exception] | None,
        what: object,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        """Make progress until ``done()``; raise on abort or after ``timeout`` seconds.

        ``what`` names the awaited thing in those errors: a string, or an object whose ``str()``
        does (a request passes itself, so a wait that succeeds formats nothing)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bell = self._bell
        spin = self._spin
        clock = time.perf_counter
        spin_until = clock() + spin if spin else 0.0
        busy = min(SPIN_BUSY, spin) if SPIN_YIELD else spin  # poll this long before yielding
        while True:
            self.progress()
            if done():
                return
            if self._abort[0]:
                raise self.aborted_error(what)
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
            if bell.acquire(True, min(left, _WAKE_SLICE)):
                while bell.acquire(False):
                    pass
                if spin:
                    spin_until = clock() + spin

    def aborted_error(self, what: object) -> DeviceAborted:
        culprit = int(self._abort[0]) - 1
        who = "the host" if culprit == self.layout.host else f"device {culprit}"
        return DeviceAborted(f"aborted while waiting for {what}: {who} failed first", aborted_by=culprit)

    # -- bookkeeping --------------------------------------------------------------------------------
    def drain(self) -> None:
        """Pull every byte already published to this endpoint."""
        self.progress()

    def pending(self) -> list[tuple[int, int, int, str]]:
        """Messages not consumed by a receive, as (src, dst, tag, description); and unfinished sends."""
        out = []
        for (src, tag), q in self._unexpected.items():
            for req in q:
                h = req.header
                desc = "pickled object" if h and h.kind & 0xFF == KIND_PICKLE else f"array{h.shape} {np.dtype(h.dtype)}" if h else "?"
                state = "" if req.done else " (partly received)"
                out.append((src, self.me, tag, desc + state))
        for dst, q in self._sendq.items():
            for req in q:
                out.append((self.me, dst, req.tag, f"{req.nbytes} bytes still being sent"))
        return out

    def reset(self) -> None:
        """Forget all in-flight state (after the driver zeroed the rings)."""
        for q in self._sendq.values():
            q.clear()
        self._busy.clear()
        self._posted.clear()
        self._unexpected.clear()
        for p in self._partial:
            self._partial[p] = None
        for ch in self._out.values():
            ch.sync_local(producer=True)
        for ch in self._in.values():
            ch.sync_local(producer=False)
        self._seq = {p: 0 for p in self._seq}
        while self._bell.acquire(False):
            pass
