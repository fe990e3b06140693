"""``Endpoint``: one process's side of every channel, with a progress engine and one doorbell.

Every endpoint (a device, or the host) owns one semaphore, its *doorbell*.  Whoever changes
something this endpoint may be waiting for rings it: a producer after publishing bytes, a consumer
after freeing room, the driver when it aborts.  A blocked endpoint sleeps on its doorbell (no
spinning: 8 devices on 2 cores must still run), wakes, drains the count, and makes progress on
*every* channel: pushes its pending sends and pulls every incoming message, matched or not.

Pulling everything, always, is what makes blocking sends safe: two devices that both send 64 MiB to
each other before receiving do not deadlock on full rings, because each one drains the other's
ring into private memory while it waits.  Spurious wake-ups are harmless (the state is re-checked)
and lost ones impossible (every change is followed by a post).

Cost of a message of M bytes: one copy into the ring and one copy out, pipelined in chunks of
``CHUNK`` bytes so that the two copies overlap on two cores, plus one semaphore post per chunk.
Matching is FIFO per (source, tag); a message that arrives before its receive is posted waits in
an *unexpected* queue (already in private memory, so the ring keeps flowing).
"""

from __future__ import annotations

import pickle
import time
from collections import defaultdict, deque
from typing import Any, Callable

import numpy as np

from ..errors import DeviceAborted, PayloadError, UsageError
from .channel import FLAG_CONTROL, KIND_ARRAY, KIND_PICKLE, Header, VirtualChannel, pack_header
from .shm import Layout, SharedArena

__all__ = ["Endpoint", "SendRequest", "RecvRequest", "CHUNK"]

CHUNK = 1 << 18  # 256 KiB: the copy granularity that lets sender and receiver overlap
_WAKE_SLICE = 0.5  # longest sleep between re-checks of the abort word


def encode(obj: Any) -> tuple[int, np.ndarray, str, tuple[int, ...]]:
    """(kind, payload bytes as uint8, dtype str, shape) for any picklable object; arrays go raw."""
    if isinstance(obj, np.ndarray) and not obj.dtype.hasobject and len(obj.dtype.str) <= 16 and obj.dtype.names is None:
        arr = np.asarray(obj, order="C")  # keeps 0-d arrays 0-d (ascontiguousarray would not)
        return KIND_ARRAY, arr.reshape(-1).view(np.uint8), arr.dtype.str, arr.shape
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # pickling raises many types (PicklingError, TypeError, AttributeError)
        raise PayloadError(f"cannot send {type(obj).__name__} object: it cannot be pickled ({exc})") from None
    return KIND_PICKLE, np.frombuffer(data, np.uint8), "|u1", ()


class SendRequest:
    """A message on its way out: complete once every byte is in the ring."""

    __slots__ = ("endpoint", "dst", "tag", "header", "payload", "nbytes", "padded", "written", "done", "stamp")

    def __init__(self, endpoint: "Endpoint", dst: int, tag: int, header: bytes, payload: np.ndarray, stamp: float) -> None:
        self.endpoint = endpoint
        self.dst = dst
        self.tag = tag
        self.header = np.frombuffer(header, np.uint8)
        self.payload = payload
        self.nbytes = payload.size
        self.padded = (self.nbytes + 7) & ~7
        self.written = -1  # -1: header not written yet; else payload bytes written (incl. pad)
        self.done = False
        self.stamp = stamp

    def wait(self, timeout: float | None = None, on_timeout: Callable[[], Exception] | None = None) -> None:
        self.endpoint.wait(lambda: self.done, timeout, on_timeout, f"send to {self.dst} (tag {self.tag})")
        self.payload = None  # drop the reference to the caller's buffer


class RecvRequest:
    """A message on its way in; ``wait()`` returns the array (or object)."""

    __slots__ = ("endpoint", "src", "tag", "out", "header", "buf", "got", "done", "value", "error", "claimed")

    def __init__(self, endpoint: "Endpoint", src: int, tag: int, out: np.ndarray | None = None) -> None:
        self.endpoint = endpoint
        self.src = src
        self.tag = tag
        self.out = out
        self.header: Header | None = None
        self.buf: np.ndarray | None = None  # uint8 view of where the payload lands
        self.got = 0
        self.done = False
        self.value: Any = None
        self.error: Exception | None = None
        self.claimed = out is not None or False

    @property
    def nbytes(self) -> int:
        return self.header.nbytes if self.header else 0

    @property
    def stamp(self) -> float:
        return self.header.stamp if self.header else 0.0

    def wait(self, timeout: float | None = None, on_timeout: Callable[[], Exception] | None = None) -> Any:
        self.endpoint.wait(lambda: self.done, timeout, on_timeout, f"recv from {self.src} (tag {self.tag})")
        if self.error is not None:
            raise self.error
        if self.out is not None and self.value is not self.out:
            _check_out(self.out, self.header)  # an unexpected message adopted by a recv with out=
            np.copyto(self.out, self.value)
            self.value = self.out
        return self.value


def _check_out(out: np.ndarray, header: Header | None) -> None:
    if header is None or header.kind & 0xFF != KIND_ARRAY:
        raise UsageError("recv(out=...) needs an array message, but the sender sent a pickled object")
    if tuple(out.shape) != header.shape or out.dtype.str != header.dtype:
        raise UsageError(
            f"recv buffer has shape {tuple(out.shape)} and dtype {out.dtype}, "
            f"but the message holds shape {header.shape} and dtype {np.dtype(header.dtype)}"
        )


class Endpoint:
    """Endpoint ``me`` of a cluster: sends, receives, progress and waiting."""

    def __init__(self, me: int, arena: SharedArena, layout: Layout, doorbells: list[Any]) -> None:
        self.me = me
        self.layout = layout
        peers = [p for p in range(layout.endpoints) if p != me]
        self._out = {p: VirtualChannel(arena, layout, me, p) for p in peers}
        self._in = {p: VirtualChannel(arena, layout, p, me) for p in peers}
        self._sendq: dict[int, deque[SendRequest]] = {p: deque() for p in peers}
        self._busy: set[int] = set()  # destinations with queued sends
        self._partial: dict[int, RecvRequest | None] = {p: None for p in peers}
        self._posted: defaultdict[tuple[int, int], deque[RecvRequest]] = defaultdict(deque)
        self._unexpected: defaultdict[tuple[int, int], deque[RecvRequest]] = defaultdict(deque)
        self._seq = {p: 0 for p in peers}
        self._bell = doorbells[me]
        self._bells = doorbells
        self._abort = arena.view(layout.abort_offset, 1, np.int64)
        E = layout.endpoints
        counters = arena.view(layout.counters_offset, 3 * E * E, np.int64).reshape(3, E, E)
        self._bytes_row = counters[0, me]
        self._msgs_row = counters[1, me]
        self._ctrl_row = counters[2, me]

    # -- posting ----------------------------------------------------------------------------------
    def isend(self, obj: Any, dst: int, tag: int, stamp: float = 0.0, control: bool = False) -> SendRequest:
        kind, payload, dtype, shape = encode(obj)
        seq = self._seq[dst] = self._seq[dst] + 1
        header = pack_header(kind | (FLAG_CONTROL if control else 0), tag, payload.size, stamp, seq, dtype, shape)
        req = SendRequest(self, dst, tag, header, payload, stamp)
        if control:
            self._ctrl_row[dst] += payload.size
        else:
            self._bytes_row[dst] += payload.size
            self._msgs_row[dst] += 1
        self._sendq[dst].append(req)
        self._busy.add(dst)
        self._push(dst)
        return req

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
        for dst in tuple(self._busy):
            self._push(dst)
        for src in self._in:
            if self._partial[src] is not None or self._in[src].readable():
                self._pull(src)

    def _push(self, dst: int) -> None:
        q = self._sendq[dst]
        ch = self._out[dst]
        bell = self._bells[dst]
        while q:
            req = q[0]
            if req.written < 0:
                if ch.writable() < req.header.size:
                    return
                ch.write(req.header, req.header.size)
                req.written = 0
                if req.nbytes == 0:
                    bell.release()
            while req.written < req.padded:
                room = ch.writable()
                if room <= 0:
                    return
                n = min(room, req.padded - req.written, CHUNK)
                data_n = max(0, min(n, req.nbytes - req.written))
                if data_n:
                    part = req.payload[req.written : req.written + data_n]
                    ch.write(part, data_n)
                if n > data_n:
                    ch.skip_write(n - data_n)
                req.written += n
                bell.release()
            req.done = True
            q.popleft()
        self._busy.discard(dst)

    def _pull(self, src: int) -> None:
        ch = self._in[src]
        bell = self._bells[src]
        while True:
            req = self._partial[src]
            if req is None:
                if not ch.readable():
                    return
                header = ch.read_header()
                req = self._match(src, header)
                self._partial[src] = req
            header = req.header
            assert header is not None
            while req.got < header.padded:
                avail = ch.readable()
                if avail <= 0:
                    return
                n = min(avail, header.padded - req.got, CHUNK)
                data_n = max(0, min(n, header.nbytes - req.got))
                if data_n:
                    ch.read_into(req.buf[req.got : req.got + data_n], data_n)
                if n > data_n:
                    ch.skip_read(n - data_n)
                req.got += n
                bell.release()
            self._finish(req)
            self._partial[src] = None

    def _match(self, src: int, header: Header) -> RecvRequest:
        key = (src, header.tag)
        posted = self._posted.get(key)
        if posted:
            req = posted.popleft()
        else:
            req = RecvRequest(self, src, header.tag)
            self._unexpected[key].append(req)
        req.header = header
        kind = header.kind & 0xFF
        if kind == KIND_ARRAY:
            target = None
            if req.out is not None:
                try:
                    _check_out(req.out, header)
                    if req.out.flags.c_contiguous and req.out.flags.writeable:
                        target = req.out
                except UsageError as exc:
                    req.error = exc  # still drain the bytes, then report at wait()
            if target is None:
                target = np.empty(header.shape, np.dtype(header.dtype))
            req.value = target
            req.buf = target.reshape(-1).view(np.uint8)
        else:
            req.buf = np.empty(header.nbytes, np.uint8)
        if header.nbytes == 0:
            req.buf = np.empty(0, np.uint8)
        return req

    def _finish(self, req: RecvRequest) -> None:
        header = req.header
        if header is not None and header.kind & 0xFF == KIND_PICKLE:
            try:
                req.value = pickle.loads(req.buf.tobytes())
            except Exception as exc:
                req.error = PayloadError(f"message from endpoint {req.src} (tag {req.tag}) could not be unpickled: {exc}")
        req.buf = None
        req.done = True

    # -- waiting ----------------------------------------------------------------------------------
    def wait(
        self,
        done: Callable[[], bool],
        timeout: float | None,
        on_timeout: Callable[[], Exception] | None,
        what: str,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        """Make progress until ``done()``; raise on abort or after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.progress()
            if done():
                return
            if self._abort[0]:
                raise self.aborted_error(what)
            if on_idle is not None:
                on_idle()
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    if on_timeout is not None:
                        raise on_timeout()
                    raise TimeoutError(f"{what} timed out after {timeout} s")
                self._bell.acquire(True, min(left, _WAKE_SLICE))
            else:
                self._bell.acquire(True, _WAKE_SLICE)
            while self._bell.acquire(False):
                pass

    def aborted_error(self, what: str) -> DeviceAborted:
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
