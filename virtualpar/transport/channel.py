"""``VirtualChannel``: a single-producer, single-consumer byte ring in shared memory.

One channel per directed endpoint pair (device->device, host->device, device->host).  The producer
owns ``head`` (bytes ever written), the consumer owns ``tail`` (bytes ever read); each lives on its
own cache line and is written by exactly one process, so no lock is needed: ``head - tail`` bytes
are readable, ``capacity - (head - tail)`` are writable.  A writer copies its bytes first and
publishes the new ``head`` second; x86-64's total store order makes the bytes visible no later than
the counter (the semaphore post that follows is a full barrier on every architecture).

Messages are framed as ``[header][payload][pad to 8]``.  The 64-byte header (then one int64 per
dimension, then two uint64 for a rendezvous offer) carries everything a receiver and the cost
model need: kind, tag, payload bytes, the sender's modelled departure time, the message number on
this channel, and dtype/shape::

    hdr_len u32 | kind u32 | tag i64 | nbytes u64 | stamp f64 | seq u64 | ndim u32 | pid u32 | dtype 16s
    | shape i64*ndim | [addr u64 | token u64]   (rendezvous offers only, see rendezvous.py)

A header never wraps around the end of the ring: when fewer bytes than the header are left before
the end, the producer writes a zero ``hdr_len`` there and skips to the start (every frame is a
multiple of 8 bytes, so at least 8 bytes are left and the marker always fits).  A header is written
whole and published at once, so a consumer that sees any unread byte at a message boundary parses
the full header in place with one ``struct.unpack_from`` — no intermediate buffer.

Copies go through ``memoryview`` slices (a ``memcpy`` each, ~0.2 µs of Python) rather than numpy
slice assignment (~1 µs): at 4 KiB per message the Python around a copy costs more than the copy.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from .shm import Layout, SharedArena

__all__ = ["VirtualChannel", "Header", "KIND_ARRAY", "KIND_PICKLE", "FLAG_CONTROL", "FLAG_RENDEZVOUS",
           "FLAG_RESENT", "FLAG_SYNC", "OFFER_SLOTS", "offer_slot", "pack_header"]

KIND_ARRAY = 1  # raw bytes of a C-contiguous numpy array
KIND_PICKLE = 2  # a pickled Python object
FLAG_CONTROL = 0x100  # runtime control traffic: not counted as data, costs no modelled time
FLAG_RENDEZVOUS = 0x200  # the payload stays in the sender's memory; the receiver reads it from there
FLAG_RESENT = 0x400  # the streamed payload of an offer the receiver could not read (same seq as the offer)
FLAG_SYNC = 0x800  # done only once a receive took it (strict mode, MPI's Issend): see rendezvous.py
OFFER_SLOTS = 7  # rendezvous offers a channel holds at once: one answer word each, in the consumer's line


def offer_slot(token: int) -> int:
    """The answer word of an offer's token (its low 3 bits: see ``rendezvous.new_offer``)."""
    return token & 7

_FIXED = struct.Struct("<IIqQdQII16s")
assert _FIXED.size == 64
_U32 = struct.Struct("<I")
_OFFER = struct.Struct("<QQ")
_SHAPES = [struct.Struct(f"<{n}q") for n in range(8)]
_new_tuple = tuple.__new__
_NAMES: dict[bytes, str] = {}  # the 16-byte dtype field -> dtype str (a handful of distinct values)
_CODES: dict[str, bytes] = {}  # and back


class Header(NamedTuple):
    kind: int
    tag: int
    nbytes: int
    stamp: float
    seq: int
    dtype: str
    shape: tuple[int, ...]
    length: int  # header bytes, incl. shape (and offer)
    pid: int = 0  # rendezvous offers: the sender's process id
    addr: int = 0  # ... the payload's address in the sender
    token: int = 0  # ... the number the receiver echoes when it has taken the payload

    @property
    def control(self) -> bool:
        return bool(self.kind & FLAG_CONTROL)

    @property
    def rendezvous(self) -> bool:
        return bool(self.kind & FLAG_RENDEZVOUS)

    @property
    def padded(self) -> int:
        """Payload bytes that follow the header in the ring (0 for a rendezvous offer)."""
        return 0 if self.kind & FLAG_RENDEZVOUS else (self.nbytes + 7) & ~7


def header_length(ndim: int, rendezvous: bool = False) -> int:
    return 64 + 8 * ndim + (16 if rendezvous else 0)


def pack_header(kind: int, tag: int, nbytes: int, stamp: float, seq: int, dtype: str, shape: tuple[int, ...],
                pid: int = 0, addr: int = 0, token: int = 0) -> bytes:
    """The header as bytes (for tests and tools; the channel packs straight into the ring)."""
    buf = bytearray(header_length(len(shape), bool(kind & FLAG_RENDEZVOUS)))
    _pack_into(buf, 0, len(buf), kind, tag, nbytes, stamp, seq, dtype, shape, pid, addr, token)
    return bytes(buf)


_STRUCTS: list[struct.Struct] = []  # ndim -> the fixed part and the shape as one Struct


def _struct(ndim: int) -> struct.Struct:
    while len(_STRUCTS) <= ndim:
        _STRUCTS.append(struct.Struct(f"<IIqQdQII16s{len(_STRUCTS)}q"))
    return _STRUCTS[ndim]


def _code(dtype: str) -> bytes:
    code = _CODES.get(dtype)
    if code is None:
        code = _CODES[dtype] = dtype.encode("ascii")
    return code


def _pack_into(buf, pos: int, length: int, kind: int, tag: int, nbytes: int, stamp: float, seq: int,
               dtype: str, shape: tuple[int, ...], pid: int, addr: int, token: int) -> None:
    ndim = len(shape)
    st = _STRUCTS[ndim] if ndim < len(_STRUCTS) else _struct(ndim)
    st.pack_into(buf, pos, length, kind, tag, nbytes, stamp, seq, ndim, pid, _code(dtype), *shape)
    if kind & FLAG_RENDEZVOUS:
        _OFFER.pack_into(buf, pos + 64 + 8 * ndim, addr, token)


class VirtualChannel:
    """The ring from endpoint ``src`` to endpoint ``dst`` inside a cluster's shared arena."""

    # ``head`` (the producer's published position), ``want`` (its want-room flag, want_room.py) and
    # ``local`` (this side's own position) are read by the endpoint's progress engine on every message.
    __slots__ = ("src", "dst", "capacity", "head", "_tail", "want", "_reply", "_ring", "local")

    def __init__(self, arena: SharedArena, layout: Layout, src: int, dst: int) -> None:
        self.src = src
        self.dst = dst
        self.capacity = layout.ring_bytes
        if self.capacity % 8 or self.capacity < 4096:
            raise ValueError(f"ring_bytes must be a multiple of 8 and at least 4096, got {self.capacity}")
        self.head = arena.word_at(layout.head_offset(src, dst))
        self._tail = arena.word_at(layout.tail_offset(src, dst))
        self.want = arena.word_at(layout.want_offset(src, dst))  # producer: "post me when you free room"
        # one answer word per offer slot
        self._reply = arena.bytes_at(layout.reply_offset(src, dst), 8 * OFFER_SLOTS).cast("Q")
        self._ring = arena.bytes_at(layout.ring_offset(src, dst), layout.ring_bytes)
        self.local = 0  # this side's own counter (head for the producer, tail for the consumer)

    def __repr__(self) -> str:
        return f"VirtualChannel({self.src}->{self.dst}, {self.capacity} bytes)"

    # -- producer side ------------------------------------------------------------------------
    def writable(self) -> int:
        return self.capacity - (self.local - self._tail[0])

    def write_header(self, kind: int, tag: int, nbytes: int, stamp: float, seq: int, dtype: str,
                     shape: tuple[int, ...], pid: int = 0, addr: int = 0, token: int = 0,
                     contiguous: int = 0) -> bool:
        """Write and publish one header (plus room for ``contiguous`` payload bytes right after it,
        unwrapped); False if the ring has no room yet (nothing was written)."""
        length = header_length(len(shape), bool(kind & FLAG_RENDEZVOUS))
        pos = self.local % self.capacity
        to_end = self.capacity - pos
        skip = to_end if to_end < length + contiguous else 0
        if self.capacity - (self.local - self._tail[0]) < skip + length + contiguous:
            return False
        if skip:
            _U32.pack_into(self._ring, pos, 0)  # "nothing more before the end": the consumer skips
            self.local += skip
            pos = 0
        _pack_into(self._ring, pos, length, kind, tag, nbytes, stamp, seq, dtype, shape, pid, addr, token)
        self.local += length
        self.head[0] = self.local
        return True

    def write_frame(self, kind: int, tag: int, stamp: float, seq: int, dtype: str, shape: tuple[int, ...],
                    data: memoryview | None, nbytes: int) -> bool:
        """Write an eager message whole (header, then the ``nbytes`` of ``data`` unwrapped, then the
        pad) and publish it with one store; False if the ring has no room for it yet (nothing written).

        The receiver thus never sees a header without its payload: it takes the message in one copy.
        """
        ndim = len(shape)
        length = 64 + 8 * ndim
        frame = length + ((nbytes + 7) & ~7)
        cap = self.capacity
        local = self.local
        pos = local % cap
        skip = cap - pos if cap - pos < frame else 0
        if cap - (local - self._tail[0]) < skip + frame:
            return False
        ring = self._ring
        if skip:
            _U32.pack_into(ring, pos, 0)  # "nothing more before the end": the consumer skips
            pos = 0
        st = _STRUCTS[ndim] if ndim < len(_STRUCTS) else _struct(ndim)
        st.pack_into(ring, pos, length, kind, tag, nbytes, stamp, seq, ndim, 0,
                     _CODES.get(dtype) or _code(dtype), *shape)
        if nbytes:
            pos += length
            ring[pos : pos + nbytes] = data
        self.local = local = local + skip + frame
        self.head[0] = local
        return True

    def write(self, src: memoryview, n: int) -> None:
        """Copy the first ``n`` bytes of the byte memoryview ``src`` in and publish them
        (the caller checked ``writable() >= n``)."""
        pos = self.local % self.capacity
        first = self.capacity - pos
        if n <= first:
            self._ring[pos : pos + n] = src[:n]
        else:
            self._ring[pos:] = src[:first]
            self._ring[: n - first] = src[first:n]
        self.local += n
        self.head[0] = self.local

    def skip_write(self, n: int) -> None:
        """Publish ``n`` padding bytes without writing them."""
        self.local += n
        self.head[0] = self.local

    def reply(self, slot: int) -> int:
        """The consumer's answer to the rendezvous offer this producer made last in ``slot``
        (see :meth:`answer`)."""
        return self._reply[slot]

    # -- consumer side ------------------------------------------------------------------------
    def readable(self) -> int:
        return self.head[0] - self.local

    def read_header(self) -> Header | None:
        """Parse and consume the header at the read position (the caller checked ``readable() > 0``);
        None if it was only an end-of-ring marker (consumed too)."""
        ring = self._ring
        pos = self.local % self.capacity
        if not _U32.unpack_from(ring, pos)[0]:
            self.skip_read(self.capacity - pos)
            return None
        length, kind, tag, nbytes, stamp, seq, ndim, pid, dtype = _FIXED.unpack_from(ring, pos)
        shape: tuple[int, ...] = _SHAPES[ndim].unpack_from(ring, pos + 64) if ndim < 8 else \
            struct.unpack_from(f"<{ndim}q", ring, pos + 64)
        addr = token = 0
        if kind & FLAG_RENDEZVOUS:
            addr, token = _OFFER.unpack_from(ring, pos + 64 + 8 * ndim)
        self.local = local = self.local + length
        self._tail[0] = local
        name = _NAMES.get(dtype)
        if name is None:
            name = _NAMES[dtype] = dtype.rstrip(b"\0").decode("ascii")
        # tuple.__new__ skips the NamedTuple's Python-level __new__ (~0.2 µs a message)
        return _new_tuple(Header, (kind, tag, nbytes, stamp, seq, name, shape, length, pid, addr, token))

    def peek(self, n: int) -> memoryview | None:
        """The next ``n`` unread bytes as a view into the ring, if they do not wrap (else None)."""
        pos = self.local % self.capacity
        return self._ring[pos : pos + n] if pos + n <= self.capacity else None

    def read_into(self, dst: memoryview, n: int, advance: int = 0) -> None:
        """Copy ``n`` unread bytes into the byte memoryview ``dst`` and release ``max(n, advance)``
        bytes (the copied ones and any pad after them) to the producer."""
        pos = self.local % self.capacity
        first = self.capacity - pos
        if n <= first:
            dst[:n] = self._ring[pos : pos + n]
        else:
            dst[:first] = self._ring[pos:]
            dst[first:n] = self._ring[: n - first]
        self.local = local = self.local + (advance if advance > n else n)
        self._tail[0] = local

    def skip_read(self, n: int) -> None:
        self.local += n
        self._tail[0] = self.local

    def answer(self, token: int, refused: bool = False, for_good: bool = False) -> None:
        """Publish this consumer's answer to the producer's rendezvous offer ``token``: taken
        (``token << 2``), or to be streamed through the ring (``| 1``), and so will every later
        one from this producer (``| 2``: the kernel will always refuse)."""
        self._reply[offer_slot(token)] = token << 2 | for_good << 1 | refused

    # -- both -----------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything in flight (only while neither side is using the channel)."""
        self.local = 0
        self.head[0] = 0
        self._tail[0] = 0
        self.want[0] = 0
        self._clear_replies()

    def _clear_replies(self) -> None:
        for slot in range(OFFER_SLOTS):
            self._reply[slot] = 0

    def sync_local(self, producer: bool) -> None:
        """Re-read this side's counter from shared memory (after the driver reset the ring)."""
        self.local = self.head[0] if producer else self._tail[0]
        if producer:
            self.want[0] = 0
        else:
            self._clear_replies()  # the consumer owns the reply words; a stale answer must not match
