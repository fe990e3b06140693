"""The driver copy's memory: two slot files per device, in RAM, that only the driver can still reach.

Shipping a committed step's weights to the driver through the reply pipe cost a third of a step
of the pipeline benchmark on this loaded 2-core machine: the pipe moves 64 KiB per wake-up of the
reader.  Instead each device writes its reported stages into a file of its own, with one
``pwrite`` per array — a memcpy into pages the file keeps from step to step — and the driver
reads nothing until it needs the state (a resume, a save).

Lifetime, as the shared arena's (transport/shm.py): the driver creates the files
(``/dev/shm/virtualpar-<pid>-keep-<token>-<rank>-<slot>``, mode 0600) and opens them, every
device opens its own two, and the driver unlinks every name at once: the files then live exactly
as long as some process holds them open — after every device died, the driver's descriptors keep
the committed state; when the driver exits, even killed, nothing is left in /dev/shm.

A slot holds one version of the state: the device writes the arrays, then a JSON header saying
where each lies, then — last — the version number at offset 0.  A step from version v writes slot
``(v + 1) % 2``, so a device killed mid-write can tear only the slot of a version never committed;
the driver reads the slots whose version is the committed one.  Nothing is pickled.
"""

from __future__ import annotations

import json
import os
import secrets
import struct
import tempfile
import weakref
from typing import Any

import numpy as np

__all__ = ["Spill", "open_slots", "write_slot", "read_slot", "open_spill", "hand_copy"]

_HEAD = struct.Struct("<qq")  # version, header length
_ALIGN = 64


def _directory() -> str:
    ram = "/dev/shm"
    return ram if os.path.isdir(ram) and os.access(ram, os.W_OK) else tempfile.gettempdir()


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Spill:
    """The driver's end of one cluster's slot files (see the module doc): ``prefix`` for the devices
    to open theirs by, until :meth:`unlink`; :meth:`read` the stages of a version."""

    def __init__(self, devices: int) -> None:
        self.prefix = os.path.join(_directory(), f"virtualpar-{os.getpid()}-keep-{secrets.token_hex(4)}")
        self.paths: list[str] = []
        self.fds: dict[tuple[int, int], int] = {}
        try:
            for r in range(devices):
                for k in (0, 1):
                    path = f"{self.prefix}-{r}-{k}"
                    self.fds[(r, k)] = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                    self.paths.append(path)
        except BaseException:
            self.unlink()
            _close(list(self.fds.values()))
            raise
        self._finalizer = weakref.finalize(self, _close, list(self.fds.values()))

    def unlink(self) -> None:
        """Remove every name (idempotent): the files live on while a process holds them open."""
        for path in self.paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.paths = []

    def close(self) -> None:
        self.unlink()
        self._finalizer()

    def read(self, version: int) -> dict[int, tuple[dict, dict]]:
        """Every device's reported stages at ``version`` (slots holding another version are skipped)."""
        out: dict[int, tuple[dict, dict]] = {}
        for (_, k), fd in sorted(self.fds.items()):
            if k == version % 2:
                got = read_slot(fd)
                if got is not None and got[0] == version:
                    for s, state in got[1].items():
                        out.setdefault(s, state)
        return out


def open_slots(prefix: str, rank: int) -> tuple[int, int]:
    """A device's two slot files, opened while their names exist."""
    return tuple(os.open(f"{prefix}-{rank}-{k}", os.O_RDWR) for k in (0, 1))  # type: ignore[return-value]


def write_slot(fd: int, version: int, stages: dict[int, tuple[dict, dict]]) -> None:
    """Write ``stages`` ({stage: (weights, optimizer state {"t", "lr", "state"})}) as ``version``."""
    arrays: list[np.ndarray] = []
    meta: dict[str, Any] = {}

    def place(a: Any) -> list:
        a = np.asarray(a)
        arrays.append(a)
        return [a.dtype.str, list(a.shape)]

    for s, (params, opt) in stages.items():
        meta[str(s)] = {"params": {k: place(v) for k, v in params.items()},
                        "t": int(opt["t"]), "lr": float(opt["lr"]),
                        "state": {k: {slot: place(v) for slot, v in d.items()}
                                  for k, d in opt["state"].items()}}
    header = json.dumps(meta).encode()
    offset = -(-(_HEAD.size + len(header)) // _ALIGN) * _ALIGN
    starts = []
    for a in arrays:
        starts.append(offset)
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
    os.pwrite(fd, _HEAD.pack(-1, 0), 0)  # no version while the slot is rewritten
    if os.fstat(fd).st_size != offset:
        os.ftruncate(fd, offset)
    for a, start in zip(arrays, starts):
        if a.nbytes:
            os.pwrite(fd, memoryview(np.ascontiguousarray(a)).cast("B"), start)
    os.pwrite(fd, header, _HEAD.size)
    os.pwrite(fd, _HEAD.pack(version, len(header)), 0)  # last: the slot is whole


def read_slot(fd: int) -> tuple[int, dict[int, tuple[dict, dict]]] | None:
    """``(version, stages)`` of a slot, or None if it was never written or is being rewritten."""
    head = os.pread(fd, _HEAD.size, 0)
    if len(head) < _HEAD.size:
        return None
    version, length = _HEAD.unpack(head)
    if version < 0:
        return None
    meta = json.loads(os.pread(fd, length, _HEAD.size))
    offset = -(-(_HEAD.size + length) // _ALIGN) * _ALIGN

    def take(spec: list) -> np.ndarray:
        nonlocal offset
        a = np.empty(spec[1], np.dtype(spec[0]))
        if a.nbytes:
            os.preadv(fd, [memoryview(a).cast("B")], offset)
        offset += -(-a.nbytes // _ALIGN) * _ALIGN
        return a

    stages = {}
    for s, m in meta.items():  # the order the writer placed them in (JSON keeps it)
        params = {k: take(v) for k, v in m["params"].items()}
        state = {k: {slot: take(v) for slot, v in d.items()} for k, d in m["state"].items()}
        stages[int(s)] = (params, {"t": m["t"], "lr": m["lr"], "state": state})
    return version, stages


# -- what a device runs (the training operations' device programs call these) ---------------------

def open_spill(dev: Any, key: str, prefix: str) -> None:
    """Open this device's two slot files for the driver copy of operation ``key``'s state."""
    dev.state[key]["spill"] = open_slots(prefix, dev.rank)


def hand_copy(st: dict, version: int, mine: Any) -> Any:
    """Hand the driver this device's part ``mine`` of committed state ``version``: written into its
    slot file (the two alternate), or, without slot files, returned to travel with the step's reply."""
    slots = st.get("spill")
    if slots is None:
        return mine
    if mine:
        write_slot(slots[version % 2], version, mine)
    return None
