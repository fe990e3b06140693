"""virtualpar: one laptop as a virtual cluster.

``VirtualDevice`` processes, connected by shared-memory ``VirtualChannel``s and laid out on a
``Mesh`` with named axes, run SPMD functions with real collectives; every device also keeps a
modelled clock of the hardware the mesh's topology describes.

    import numpy as np
    from virtualpar import Mesh, VirtualCluster

    def step(dev, x):
        return dev.all_reduce(x * (dev.rank + 1), group="tp")

    with VirtualCluster(Mesh({"dp": 2, "tp": 2})) as cluster:
        print(cluster.run(step, np.ones(4)))
"""

from __future__ import annotations

from .errors import (ClusterClosedError, CollectiveMismatch, CollectiveTimeout, DeviceAborted, DeviceDied,
                     DeviceError, InjectedFault, MeshError, NonFiniteError, P2PTimeout, PayloadError,
                     RunTimeout, Deadlock, ShardingError, UnknownAxisError, UnmatchedMessages, UsageError,
                     VirtualParError, ResourceLimitError)
from .device import Device
from .mesh import Mesh, MeshIndex, Topology
from .runtime import VirtualCluster, VirtualDevice
from .runtime.status import ANY_SOURCE, ANY_TAG, Status
from .transport.channel import VirtualChannel

__version__ = "0.1.0"

__all__ = [
    "Mesh", "MeshIndex", "Topology", "VirtualCluster", "VirtualDevice", "VirtualChannel", "Device",
    "ANY_SOURCE", "ANY_TAG", "Status",
    "VirtualParError", "MeshError", "UnknownAxisError", "ShardingError", "UsageError", "PayloadError",
    "DeviceError", "DeviceDied", "DeviceAborted", "CollectiveTimeout", "CollectiveMismatch", "P2PTimeout",
    "RunTimeout", "Deadlock", "UnmatchedMessages", "NonFiniteError", "InjectedFault", "ClusterClosedError",
    "ResourceLimitError",
    "__version__",
]
