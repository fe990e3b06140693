"""``cluster.put`` / ``cluster.get``: data between the driver and one device over the host channel.

The host is endpoint ``layout.host`` (index ``n``), with its own rings to and from every device, so
an array crosses in two copies like any device-to-device message.  A transfer has two halves:

1. the driver posts its half on the host endpoint (``put``: the send; ``get``: the receive) and sends
   the command (``("put", key)`` / ``("get", key)``) down the device's pipe;
2. the driver makes progress on the host endpoint until its half is done, sleeping on the host's
   doorbell between checks; the device posts the other half, then replies on its pipe.

The device may fail instead (a missing key, a value it cannot unpickle).  Its error reply arrives on
the pipe, which the driver reads only between doorbell sleeps, so the device rings the host's
doorbell after an error reply to a host command (``worker.device_main``): the driver wakes at once
instead of after its wait slice.  A failed transfer leaves the driver's half posted; the cluster is
then reset exactly as after a failed run, so the next command starts clean.  A timeout or Ctrl-C
leaves the device's state unknown: fatal.

``put(..., block=False)`` skips the wait for the device's reply when the host's half is done at
once: the command is posted (``ClusterControl.post``) and its reply read with the next one from that
device, which is how a pipeline step hands its batch over and starts at once (a blocking put
costs a round trip: ~0.5–1.5 ms per device while the others wait).
"""

from __future__ import annotations

from typing import Any, Callable

from ..errors import P2PTimeout, UsageError, VirtualParError
from .config import TAG_HOST
from .control import ClusterControl
from .supervisor import unpack_error

__all__ = ["put", "get"]


def put(ctl: ClusterControl, rank: int, key: str, x: Any, block: bool = True) -> None:
    """Place ``x`` in ``device.state[key]`` of device ``rank``.  ``block=False``: if the host's half
    is done at once (``x`` fits in the host's ring), post the command and return; its reply is read
    with the next reply from ``rank`` (``ClusterControl.post``)."""
    _check_key("put", key)
    try:
        req = ctl.host.isend(x, rank, TAG_HOST)  # an unpicklable x fails here, before the device is involved
    except VirtualParError:
        raise
    except BaseException as exc:  # interrupted while writing into the ring: the channel is half written
        ctl.fatal_shutdown(f"put {key!r} to device {rank} was interrupted: {type(exc).__name__}")
        raise
    if not block and req.done:
        ctl.post(rank, ("put", key), f"put {key!r}")  # (an interrupt in post closes the cluster)
        return
    _transfer(ctl, rank, ("put", key), lambda: req.done, "put")


def _check_key(what: str, key: Any) -> None:
    """``dev.state`` is keyed by name: a list failed on the device as 'unhashable type'."""
    if not isinstance(key, str):
        raise UsageError(f"cluster.{what}: key must be a str (a name in dev.state), got {key!r}")


def get(ctl: ClusterControl, rank: int, key: str) -> Any:
    """``device.state[key]`` of device ``rank``."""
    _check_key("get", key)
    req = ctl.host.irecv(rank, TAG_HOST)
    _transfer(ctl, rank, ("get", key), lambda: req.done, "get")
    return req.wait(0.0)


def _transfer(ctl: ClusterControl, rank: int, msg: tuple, done: Callable[[], bool], what: str) -> None:
    """Send the command, complete the host's half, and take the device's reply (see module doc)."""
    earlier = ctl.settle(rank)  # earlier posted puts answer first on the pipe: read them before watching it
    if earlier is not None:
        ctl.reset()
        raise earlier
    try:
        ctl.send(rank, msg, what)
        reply = _wait(ctl, rank, done, what)
        ctl.finish(rank, reply, what)
    except P2PTimeout as exc:
        ctl.fatal_shutdown(f"{what} with device {rank} was interrupted: {type(exc).__name__}")
        raise
    except VirtualParError:
        if not ctl.closed:
            ctl.reset()
        raise
    except BaseException as exc:  # Ctrl-C, or any signal handler's exception: the transfer is half done
        ctl.fatal_shutdown(f"{what} with device {rank} was interrupted: {type(exc).__name__}")
        raise


def _wait(ctl: ClusterControl, rank: int, done: Callable[[], bool], what: str) -> tuple | None:
    """Progress the host endpoint until ``done``, watching device ``rank`` for an early reply or death.

    Returns the device's reply if it came while waiting (None: it is still to be read).
    """
    box: list[tuple] = []
    conn, proc = ctl.sup.cmd[rank], ctl.sup.procs[rank]

    def watch() -> None:
        if not box and conn.poll():
            box.append(conn.recv())
            if box[0][0] == "err":
                raise unpack_error(box[0][1])
        if not proc.is_alive():
            died = ctl.sup.died(rank, during=what)
            ctl.fatal_shutdown(str(died))
            raise died

    def timed_out() -> P2PTimeout:
        index = ctl.mesh.index(rank)
        return P2PTimeout(f"host: {what} with device {rank} {index} did not complete within "
                          f"{ctl.config.timeout:g} s", rank=rank, index=str(index))

    ctl.host.wait(done, ctl.config.timeout, timed_out, f"{what} with device {rank}", on_idle=watch)
    return box[0] if box else None
