"""Where the modelled clock's hardware comes from: one argument, ``VirtualCluster(hardware=...)``."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..mesh import Mesh, Topology
from ..sim.hardware import HARDWARE, Hardware, get_hardware

__all__ = ["resolve_hardware", "DEFAULT_DEVICE"]

DEFAULT_DEVICE = HARDWARE["h100-node"].device  # matches the mesh's default NVLink-class links


def resolve_hardware(hardware: Any, mesh: Mesh) -> tuple[Hardware | None, Topology, Any]:
    """(the Hardware or None, the topology to model, the device spec) for ``hardware``.

    - ``None``: the mesh's own topology (NVLink-class, fully connected, unless the mesh was given
      another) with H100-class devices;
    - a preset name (``"laptop"``, ``"h100-node"``, ``"h100-cluster"``) or a ``Hardware``: its
      topology for ``mesh.size`` devices and its device spec;
    - a ``Topology``: those links, with ideal devices (compute costs nothing).

    A mesh given its own ``topology=`` takes ``hardware=None`` only: with both, which links to
    model would be a guess (a preset silently replaced the mesh's ring before).
    """
    if hardware is None:
        return None, mesh.topology, DEFAULT_DEVICE
    if mesh._topology is not None:  # two answers to one question: which links to model
        raise UsageError(f"the mesh was given its own topology ({mesh._topology.name}) "
                         f"and hardware={hardware!r} "
                         "brings another; give one: hardware=None to model the mesh's "
                         "links, or a mesh without "
                         "topology=")
    if isinstance(hardware, Topology):
        if hardware.num_devices != mesh.size:
            raise UsageError(f"hardware topology has {hardware.num_devices} devices but the "
                             f"mesh {mesh} has {mesh.size}")
        from ..sim.hardware import IDEAL_DEVICE

        return None, hardware, IDEAL_DEVICE
    try:
        hw = get_hardware(hardware)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return hw, hw.topology(mesh.size), hw.device
