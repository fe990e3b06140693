"""The exceptions virtualpar raises.

Every error says what was received, what was expected, and where (rank, mesh index, op and its
sequence number).  All of them pickle: a device raises them in its own process and the driver
re-raises them, so each carries its details as plain attributes and rebuilds itself from
``(message, details)``.

Hierarchy::

    VirtualParError
    ├── MeshError (also ValueError)            bad mesh axes / shapes / names
    │   └── UnknownAxisError (also AttributeError)  ``index.pp`` without an axis pp
    ├── ShardingError (also ValueError)        a tensor that cannot be laid out as asked
    ├── UsageError (also ValueError)           bad arguments to a device call (root, dst, group, out=)
    ├── PayloadError (also TypeError)          a payload that is not an array / cannot be pickled
    ├── DeviceError                            user code raised on a device (remote traceback as cause)
    ├── DeviceDied                             a device process was killed or exited
    ├── DeviceAborted                          a device stopped because another one failed (secondary)
    ├── CollectiveTimeout                      a collective did not complete in time
    ├── CollectiveMismatch                     devices of a group called different collectives
    ├── P2PTimeout                             a send or recv did not complete in time
    ├── RunTimeout (also TimeoutError)         a whole ``cluster.run`` exceeded ``run_timeout``
    ├── UnmatchedMessages                      messages sent and never received (or receives never matched)
    ├── NonFiniteError (also FloatingPointError)  NaN/Inf input with check_nan on
    ├── InjectedFault                          raised by ``cluster.inject(..., action="raise")``
    ├── ResourceLimitError                     the machine cannot hold what was asked (shared memory, devices)
    └── ClusterClosedError                     use of a cluster after close() or after a fatal failure
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Deadlock",
    "VirtualParError",
    "MeshError",
    "UnknownAxisError",
    "ShardingError",
    "UsageError",
    "PayloadError",
    "DeviceError",
    "DeviceDied",
    "DeviceAborted",
    "CollectiveTimeout",
    "CollectiveMismatch",
    "P2PTimeout",
    "RunTimeout",
    "UnmatchedMessages",
    "NonFiniteError",
    "InjectedFault",
    "ClusterClosedError",
    "ResourceLimitError",
    "RemoteTraceback",
]


def _rebuild(cls: type, message: str, details: dict[str, Any]) -> "VirtualParError":
    err = cls.__new__(cls)
    VirtualParError.__init__(err, message, **details)
    return err


class VirtualParError(Exception):
    """Base class of every virtualpar error.

    ``VirtualParError(message, **details)``: the details become attributes (``err.rank``,
    ``err.op``, ...), travel with the error between processes and are shown by ``repr``.
    """

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = dict(details)
        for key, value in details.items():
            setattr(self, key, value)

    def __reduce__(self):  # keep details across pickling (Exception pickles only .args)
        return (_rebuild, (type(self), self.message, self.details))

    def __str__(self) -> str:
        return self.message

    def replace(self, message: str | None = None, **details: Any) -> "VirtualParError":
        """A copy of this error (same type, same cause) with a new message and/or more details."""
        err = _rebuild(type(self), self.message if message is None else message, {**self.details, **details})
        err.__cause__ = self.__cause__
        return err


class MeshError(VirtualParError, ValueError):
    """A mesh that cannot exist: unknown or duplicate axis names, shapes not matching the device count."""


class UnknownAxisError(MeshError, AttributeError):
    """``index.pp`` on a mesh without an axis ``pp``: the user's mistake, named as one (an
    ``AttributeError`` too, so that ``hasattr`` and ``getattr(index, name, default)`` still work)."""


class ShardingError(VirtualParError, ValueError):
    """A tensor that cannot be sharded as asked (e.g. a dim not divisible by the mesh axis size)."""


class UsageError(VirtualParError, ValueError):
    """A bad argument to a device call: root/dst out of range, unknown group, wrong ``out=`` buffer."""


class PayloadError(VirtualParError, TypeError):
    """A payload of the wrong kind: not an array where one is required, or not picklable."""


class DeviceError(VirtualParError):
    """User code raised on a device.

    Attributes: ``rank``, ``index`` (mesh coordinates), ``op_seq`` (the device's last op number),
    ``exc_type`` and ``remote_traceback``; the driver sets the remote traceback as ``__cause__``.
    """


class DeviceDied(VirtualParError):
    """A device process exited or was killed: ``rank``, ``index``, ``exitcode``, ``signal``, ``last_op``."""


class DeviceAborted(VirtualParError):
    """A device gave up its current op because another device failed first (a secondary error)."""


class CollectiveTimeout(VirtualParError):
    """A collective did not complete in time: ``reached`` / ``missing`` ranks, flight records, stacks."""


class CollectiveMismatch(VirtualParError):
    """The devices of a group disagree on the collective call (op, shape, dtype, reduce op, root, dim)."""


class P2PTimeout(VirtualParError):
    """A point-to-point send or recv did not complete in time."""


class RunTimeout(VirtualParError, TimeoutError):
    """A whole ``cluster.run`` did not finish within the cluster's ``run_timeout``.

    Raised by the driver, never on a device: the devices still running were killed and the cluster
    shut down.  Attributes: ``running`` (their ranks), ``last_ops`` and ``stacks`` (rank -> text,
    from the flight recorder and the device's sidecar), ``run_timeout`` and ``function``.
    """


class UnmatchedMessages(VirtualParError):
    """At the end of a run, messages were sent and never received, or receives were posted and never
    matched: ``messages`` lists (src, dst, tag, description); -1 stands for any source or tag."""


class NonFiniteError(VirtualParError, FloatingPointError):
    """A collective input holds NaN or Inf while ``check_nan`` is on."""


class InjectedFault(VirtualParError):
    """Raised on purpose by fault injection (``cluster.inject(rank, at_op=k, action="raise")``)."""


class ClusterClosedError(VirtualParError):
    """The cluster was closed, or shut down after a fatal failure; it cannot run anything more."""


class RemoteTraceback(Exception):
    """Carries the formatted traceback of an exception raised in another process (as ``__cause__``)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n\n" + self.tb


def unpack_error(packaged: tuple) -> BaseException:
    """A device's error as it reached the driver (error, traceback text, ...), with its remote
    traceback attached as ``__cause__``."""
    err, tb, _, _ = packaged
    err.__cause__ = RemoteTraceback(tb)
    return err


class Deadlock(VirtualParError):
    """Devices wait for each other (a cycle) or for devices that will never act, with nothing in
    flight: found by the driver on the wait board (runtime/deadlock.py), long before any timeout.
    ``cycle``: the device ranks in wait order; ``waits``: rank -> what it waits for."""


class ResourceLimitError(VirtualParError):
    """This machine cannot give what was asked, found before or while allocating it: a shared-memory
    segment that could not be made (``requested`` bytes, ``shm_free`` bytes free in /dev/shm), or a
    cluster of more devices than its memory or open-file limit holds (``devices``, ``fits``).
    Nothing it had begun to allocate is left behind."""
