"""The sending half of ``Endpoint``'s progress engine: write queued messages into their rings.

``_push(dst)`` writes what is queued for ``dst``, in order: a header, then (eager) the payload in
``CHUNK`` pieces as the ring has room, the receiver rung after each piece only while devices
have a core each (else once per message); a rendezvous offer is only a header, after which the
next message may go while the offer waits in one of the channel's slots for its answer
(:mod:`.rendezvous`).  A message that must wait for its receive (strict mode, ``Issend``) but
found no free slot goes eager — as does one whose offer the receiver could not read — and is done
only when its receiver says a receive took it whole (``RendezvousState.unacked``,
:func:`.rendezvous.acknowledge`).  A producer that finds no room raises
the channel's want-room flag and returns (:mod:`.want_room`).

``Sending`` is a mixin: the state it uses (channels, queues, offers, doorbells) is ``Endpoint``'s.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from .channel import FLAG_CONTROL, FLAG_RENDEZVOUS, FLAG_SYNC, offer_slot
from .receiving import CHUNK
from .rendezvous import collect_answers, new_offer
from .requests import SEND_NEW, SEND_OFFERED, SEND_STREAM
from .want_room import want_room

__all__ = ["Sending"]


class Sending:
    """``_push`` and ``_count`` of :class:`~virtualpar.transport.endpoint.Endpoint`."""

    def _push(self, dst: int) -> None:
        q = self._sendq[dst]
        ch = self._out[dst]
        offers = self._offers[dst]
        published = False
        try:
            if offers:
                collect_answers(self, dst, ch, offers, q)
            while q:
                req = q[0]
                if req.state == SEND_NEW:
                    rdv = req.kind & FLAG_RENDEZVOUS
                    if rdv:
                        rdv = new_offer(self, req, offers)
                    addr = req.payload.ctypes.data if rdv else 0
                    small = req.padded if not rdv and req.padded <= self._small else 0
                    if not ch.write_header(req.kind, req.tag, req.nbytes, req.stamp, req.seq, req.dtype,
                                           req.shape, self._pid, addr, req.token, small):
                        if want_room(ch):
                            continue  # room appeared before the consumer could see the flag
                        return
                    published = True
                    if rdv:  # done once the receiver answers (collect_answers): the next may go now
                        req.state = SEND_OFFERED
                        offers[offer_slot(req.token)] = req
                        q.popleft()
                        continue
                    req.state = SEND_STREAM
                    if req.kind & FLAG_SYNC:  # done once its receiver says a receive took it (rendezvous)
                        self._unacked[(dst, req.seq)] = req
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
                        self.doorbells[dst].release()  # let the receiver start on this chunk now
                    published = True
                # done, unless it waits for a receive to take it and none has yet (rendezvous.taken)
                req.done = not req.kind & FLAG_SYNC or (dst, req.seq) not in self._unacked
                q.popleft()
            if not offers:
                self._busy.discard(dst)
            if ch.want[0]:
                ch.want[0] = 0  # nothing left to write: stop asking for posts
        finally:
            if published:
                self.doorbells[dst].release()

    def flush_control(self, timeout: float, on_timeout: Callable[[], Exception]) -> None:
        """Write out the queued control messages — acknowledgements a sender waits for
        (:func:`.rendezvous.tell_taken`), queued behind this endpoint's own sends or waiting for
        room — before a run ends: once the run returned, nothing else would write them."""
        for dst in tuple(self._busy):
            for req in [r for r in self._sendq[dst] if r.kind & FLAG_CONTROL]:
                self.wait(lambda req=req: req.done, timeout, on_timeout, req)

    def unfinished_sends(self) -> Iterator[tuple[int, Any]]:
        """(destination, send) of every send not done, per destination: those offered, those
        written whole and waiting to hear a receive took them, then those still queued (once a
        send's header left, its receiver holds the message too: see ``leftovers.pending``)."""
        for dst, q in self._sendq.items():
            unacked = [r for (d, _), r in self._unacked.items() if d == dst and r.written >= r.padded]
            for req in (*self._offers.get(dst, {}).values(), *unacked, *q):  # (one not whole yet: in q)
                yield dst, req

    def _count(self, dst: int, nbytes: int, control: bool) -> None:
        """Count a message to ``dst`` in the shared counters (control traffic apart from data)."""
        if control:
            self._ctrl_mv[dst] += nbytes
        else:
            self._bytes_mv[dst] += nbytes
            self._msgs_mv[dst] += 1
