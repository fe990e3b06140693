"""The want-room flag: a producer short of room asks its consumer for a doorbell post.

Posting only when it helps: a producer that finds no room raises a *want-room* flag in its line of
the channel, and the consumer rings it after freeing room only while that flag is up (see
:func:`want_room` for why no wake-up is lost; the consumer's side is ``Endpoint._room_freed``).
Without the flag every consumed message would wake its sender, which, in a ring collective, is
asleep waiting for a different peer: 8 devices on 2 cores made ~40% fewer context switches and ran
~10% faster with the flag.
"""

from __future__ import annotations

import platform
import threading

from .channel import VirtualChannel

__all__ = ["FENCED", "fence", "want_room"]

# The want-room handshake needs a store-load fence on both sides; a locked instruction is one on
# x86 (an uncontended Lock acquire/release runs two).  Elsewhere consumers post after every read.
FENCED = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")
_FENCE_LOCK = threading.Lock()


def fence() -> None:
    """A full store-load fence on x86: an uncontended ``Lock`` acquire and release."""
    _FENCE_LOCK.acquire()
    _FENCE_LOCK.release()


def want_room(ch: VirtualChannel) -> bool:
    """Raise the producer's want-room flag; True if the caller should re-check the room once.

    Lost wake-ups are impossible: the producer stores the flag, fences, re-reads ``tail``; the
    consumer stores ``tail``, fences, reads the flag.  In any order of those four events either
    the consumer sees the flag (and posts) or the producer sees the freed room (and writes).  If
    the producer still lacks room the ring holds unread bytes, and the consumer's next read, in
    whatever wait it is next, sees the flag and posts.
    """
    if not FENCED or ch.want[0]:
        return False
    ch.want[0] = 1
    fence()
    return True
