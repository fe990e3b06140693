"""Virtual hardware: what one device computes per second, and how devices are wired together.

A :class:`DeviceSpec` prices compute with the roofline model (Williams, Waterman & Patterson,
"Roofline", CACM 2009)::

    t_compute = max(flops / peak(dtype), bytes / memory_bandwidth)

A :class:`Hardware` pairs a device with the recipe for its network: one node of up to
``devices_per_node`` devices joined by intra-node links (fully connected, as through an NVSwitch),
and, beyond one node, ``Topology.hierarchical`` with inter-node links.  Presets live in the explicit
registry :data:`HARDWARE` and are picked by one word with :func:`get_hardware`.

Figures are peak datasheet numbers; real kernels reach a fraction of them, so modelled times are
lower bounds in the same sense the α–β model's are.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from virtualpar.errors import MeshError
from virtualpar.mesh.presets import INFINIBAND_BANDWIDTH, INFINIBAND_LATENCY, NVLINK_BANDWIDTH, NVLINK_LATENCY
from virtualpar.mesh.topology import Topology

__all__ = ["DeviceSpec", "Hardware", "IDEAL_DEVICE", "HARDWARE", "get_hardware", "dtype_name"]

_FALLBACK_DTYPE = "float32"


_NAMES: dict[Any, str] = {}  # dtype (or name, or type) -> its canonical name: numpy's conversion costs ~10 µs


def dtype_name(dtype: Any) -> str:
    """The canonical name of ``dtype``: numpy's name (``"f4"`` → ``"float32"``), else the string as given.

    Strings numpy does not know (``"bfloat16"`` without ml_dtypes installed) are kept verbatim.
    Cached per hashable ``dtype``: every modelled kernel charge asks.
    """
    try:
        return _NAMES[dtype]
    except (KeyError, TypeError):  # TypeError: unhashable (a structured dtype given as a list)
        pass
    try:
        name = np.dtype(dtype).name
    except TypeError:
        if not isinstance(dtype, str):
            raise TypeError(f"dtype_name: expected a numpy dtype or a dtype name; got {dtype!r}") from None
        name = dtype
    try:
        if len(_NAMES) < 256:
            _NAMES[dtype] = name
    except TypeError:
        pass
    return name


def _nonneg(where: str, name: str, value: float, finite: bool = True) -> float:
    """``value`` as a float >= 0 (finite unless ``finite=False``); True, "1" and NaN are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.number)):
        raise ValueError(f"{where}: {name} must be a number; got {value!r}")
    x = float(value)
    if not x >= 0.0 or (finite and x == math.inf):  # also rejects NaN
        raise ValueError(f"{where}: {name} must be {'a finite number ' if finite else ''}>= 0; got {value!r}")
    return x


def _positive(where: str, name: str, value: float) -> float:
    x = _nonneg(where, name, value, finite=False)
    if x == 0.0:
        raise ValueError(f"{where}: {name} must be > 0 (inf allowed); got {value!r}")
    return x


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator: peak FLOP/s per dtype, memory bandwidth (B/s) and capacity (B).

    ``peak_flops`` may be given as a mapping ``{"float32": 6.7e13, ...}``; it is stored as a sorted
    tuple of ``(dtype name, FLOP/s)`` pairs so the spec stays hashable and picklable.  It must hold
    a ``"float32"`` figure: dtypes without their own figure are priced at the float32 peak.
    """

    name: str
    peak_flops: tuple[tuple[str, float], ...]
    memory_bandwidth: float
    memory_capacity: float

    def __post_init__(self) -> None:
        where = f"DeviceSpec {self.name!r}"
        items = self.peak_flops.items() if isinstance(self.peak_flops, Mapping) else self.peak_flops
        try:
            items = [(k, v) for k, v in items]
        except (TypeError, ValueError):
            raise ValueError(
                f"{where}: peak_flops must be a mapping {{dtype: FLOP/s}} or (dtype, FLOP/s) pairs; "
                f"got {self.peak_flops!r}"
            ) from None
        pairs = tuple(sorted((dtype_name(k), _positive(where, f"peak_flops[{k!r}]", v)) for k, v in items))
        if _FALLBACK_DTYPE not in dict(pairs):
            raise ValueError(f"{where}: peak_flops needs a {_FALLBACK_DTYPE!r} figure (the fallback for "
                             f"other dtypes); got dtypes {[k for k, _ in pairs]}")
        object.__setattr__(self, "peak_flops", pairs)
        object.__setattr__(
            self, "memory_bandwidth", _positive(where, "memory_bandwidth", self.memory_bandwidth)
        )
        object.__setattr__(self, "memory_capacity", _positive(where, "memory_capacity", self.memory_capacity))

    def peak(self, dtype: Any = _FALLBACK_DTYPE) -> float:
        """Peak FLOP/s for ``dtype`` (numpy dtype or name); unknown dtypes use the float32 figure."""
        name = dtype_name(dtype)
        for key, flops in self.peak_flops:
            if key == name:
                return flops
        return dict(self.peak_flops)[_FALLBACK_DTYPE]

    def compute_time(self, flops: float = 0.0, nbytes: float = 0.0, dtype: Any = _FALLBACK_DTYPE) -> float:
        """Roofline seconds: ``max(flops / peak(dtype), nbytes / memory_bandwidth)``.

        ``nbytes`` is the memory traffic (bytes read + written).  Compute and memory traffic are
        assumed to overlap perfectly, hence the max rather than the sum.
        """
        f = _nonneg(f"{self.name}.compute_time", "flops", flops)
        b = _nonneg(f"{self.name}.compute_time", "nbytes", nbytes)
        # 0 work costs 0 even on an ideal device (0 / inf is 0, but guard the 0 * inf paths anyway)
        t_flops = f / self.peak(dtype) if f else 0.0
        t_bytes = b / self.memory_bandwidth if b else 0.0
        return max(t_flops, t_bytes)


#: Infinitely fast device: compute costs 0, so only communication shows up in modelled time.
IDEAL_DEVICE = DeviceSpec("ideal", {_FALLBACK_DTYPE: math.inf}, math.inf, math.inf)


@dataclass(frozen=True)
class Hardware:
    """A device type plus the network recipe: ``topology(n)`` builds the links for ``n`` devices.

    * ``n <= devices_per_node`` (or ``devices_per_node is None``: one node of any size):
      ``Topology.fully_connected(n, intra_latency, intra_bandwidth)``.
    * ``n > devices_per_node``: ``Topology.hierarchical(n // devices_per_node, devices_per_node,
      ...)``, whose cross-node route is 4 inter hops (device → node switch → core → node switch →
      device), so ``inter_latency`` is *per hop*.  ``n`` must then be a multiple of
      ``devices_per_node`` — we refuse ragged last nodes rather than invent a machine that is not sold.
    """

    name: str
    device: DeviceSpec
    intra_latency: float
    intra_bandwidth: float
    devices_per_node: int | None = None
    inter_latency: float | None = None
    inter_bandwidth: float | None = None
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"Hardware {self.name!r}"
        if not isinstance(self.device, DeviceSpec):
            raise ValueError(
                f"{where}: device must be a DeviceSpec (e.g. virtualpar.sim.hardware.H100_SXM); "
                f"got {self.device!r}"
            )
        object.__setattr__(self, "intra_latency", _nonneg(where, "intra_latency", self.intra_latency))
        object.__setattr__(self, "intra_bandwidth", _positive(where, "intra_bandwidth", self.intra_bandwidth))
        dpn = self.devices_per_node
        if dpn is not None and (isinstance(dpn, bool) or not isinstance(dpn, int) or dpn < 1):
            raise ValueError(f"{where}: devices_per_node must be a positive int or None; got {dpn!r}")
        if (self.inter_latency is None) != (self.inter_bandwidth is None):
            raise ValueError(
                f"{where}: give both inter_latency and inter_bandwidth or neither; got "
                f"inter_latency={self.inter_latency!r}, inter_bandwidth={self.inter_bandwidth!r}"
            )
        if self.inter_latency is not None:
            if dpn is None:
                raise ValueError(f"{where}: inter-node links need devices_per_node; got None")
            object.__setattr__(self, "inter_latency", _nonneg(where, "inter_latency", self.inter_latency))
            object.__setattr__(
                self, "inter_bandwidth", _positive(where, "inter_bandwidth", self.inter_bandwidth)
            )

    @property
    def multi_node(self) -> bool:
        """True if this hardware can span several nodes (it has inter-node links)."""
        return self.inter_latency is not None

    def topology(self, n: int) -> Topology:
        """The topology of ``n`` devices of this hardware (see the class docstring for the rule)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise MeshError(f"hardware {self.name!r}: number of devices must be a positive int; got {n!r}")
        dpn = self.devices_per_node
        if dpn is None or n <= dpn:
            return Topology.fully_connected(n, latency=self.intra_latency, bandwidth=self.intra_bandwidth)
        if not self.multi_node:
            raise MeshError(f"hardware {self.name!r} is a single node of at most {dpn} devices; got {n} "
                            f"devices (use a multi-node preset such as 'h100-cluster')")
        if n % dpn:
            raise MeshError(f"hardware {self.name!r}: {n} devices do not fill whole nodes of {dpn} devices; "
                            f"expected a multiple of {dpn} (e.g. {n - n % dpn} or {n - n % dpn + dpn})")
        return Topology.hierarchical(n // dpn, dpn,
                                     intra_latency=self.intra_latency, intra_bandwidth=self.intra_bandwidth,
                                     inter_latency=self.inter_latency, inter_bandwidth=self.inter_bandwidth)

    @classmethod
    def uniform(cls, latency: float, bandwidth: float, device: DeviceSpec = IDEAL_DEVICE,
                name: str | None = None) -> Hardware:
        """Any number of devices, fully connected by links of latency α = ``latency`` s and β =
        ``bandwidth`` B/s.

        With the default ideal device compute is free, so modelled time is pure α–β communication.
        """
        from virtualpar.trace.fmt import rate, seconds  # its name, in the one spelling of units

        named = f"uniform(α={seconds(latency)}, β={rate(bandwidth)})"
        return cls(name or named, device, latency, bandwidth,
                   description="fully connected, uniform α–β links")

    @classmethod
    def unit(cls) -> Hardware:
        """Free links and a device of 1 FLOP/s (float32, any dtype falls back to it): with action
        costs such as ``{"F": 1, "B": 1}`` the modelled clock counts schedule steps, so an executed
        run's timeline is the textbook picture."""
        inf = math.inf
        return cls.uniform(latency=0.0, bandwidth=inf, device=DeviceSpec("unit", {"float32": 1.0}, inf, inf))


# --- presets -----------------------------------------------------------------------------------
GB = 1e9
TERA = 1e12

# Laptop CPU (e.g. 4 cores × ~3 GHz × 2 FMA units × 8 fp32 lanes (AVX2) × 2 flop/FMA ≈ 384 GFLOP/s;
# fp64 has half the lanes).  numpy has no fp16/bf16 arithmetic, so those run at the fp32 rate
# (converted), and integer SIMD multiply-add is taken at the fp64 rate.  Dual-channel DDR5 ≈ 50 GB/s.
LAPTOP_CPU = DeviceSpec(
    "laptop-cpu",
    {"float32": 384e9, "float64": 192e9, "float16": 384e9, "bfloat16": 384e9, "int64": 192e9, "int32": 384e9},
    memory_bandwidth=50 * GB,
    memory_capacity=16 * 2**30,
)

# NVIDIA H100 SXM5, dense figures (NVIDIA H100 Tensor Core GPU datasheet: the starred tensor figures
# are "shown with sparsity", dense is half): FP64 tensor 67 TFLOP/s, FP32 (no TF32) 67, TF32 tensor
# 494.7, BF16/FP16 tensor 989.4, FP8 / INT8 tensor 1979; INT32 33.5 TOP/s (64 INT32 lanes/SM vs 128 FP32,
# NVIDIA Hopper architecture whitepaper).  INT64 has no native multiply: an estimate, a quarter of INT32.
# HBM3: 80 GB at 3.35 TB/s (datasheet).
H100_SXM = DeviceSpec(
    "h100-sxm",
    {"float64": 67 * TERA, "float32": 67 * TERA, "tfloat32": 494.7 * TERA, "bfloat16": 989.4 * TERA,
     "float16": 989.4 * TERA, "float8": 1979 * TERA, "int8": 1979 * TERA, "int32": 33.5 * TERA,
     "int64": 33.5 * TERA / 4},
    memory_bandwidth=3.35 * TERA,
    memory_capacity=80 * GB,
)

# The figures measured on this machine (/work/shared/PERFORMANCE_NOTES.md): a shared-memory message
# is one memcpy at ~4.85 GB/s (receiver reading in place) and a 4 KiB one-way notify costs ~23 µs.
LAPTOP_LINK_LATENCY = 23e-6
LAPTOP_LINK_BANDWIDTH = 4.85 * GB

#: Presets by name.  Unknown names are rejected by :func:`get_hardware` with the list of valid ones.
HARDWARE: dict[str, Hardware] = {
    "laptop": Hardware(
        "laptop", LAPTOP_CPU, LAPTOP_LINK_LATENCY, LAPTOP_LINK_BANDWIDTH,
        description="one laptop CPU; devices are processes talking through shared memory"),
    # NVLink 4 through NVSwitch: 18 links × 25 GB/s = 450 GB/s per direction per GPU (900 GB/s
    # bidirectional, H100 datasheet), a few µs latency (mesh.presets.NVLINK_*).
    "h100-node": Hardware(
        "h100-node", H100_SXM, NVLINK_LATENCY, NVLINK_BANDWIDTH, devices_per_node=8,
        description="one DGX/HGX H100: 8 × H100 SXM5, NVLink 4 via NVSwitch"),
    # DGX H100 user guide: 8 ConnectX-7 ports, one per GPU, InfiniBand NDR 400 Gb/s = 50 GB/s per
    # direction; ~1 µs per hop, 4 hops across nodes (mesh.presets.INFINIBAND_*).
    "h100-cluster": Hardware(
        "h100-cluster", H100_SXM, NVLINK_LATENCY, NVLINK_BANDWIDTH, devices_per_node=8,
        inter_latency=INFINIBAND_LATENCY, inter_bandwidth=INFINIBAND_BANDWIDTH,
        description="DGX H100 nodes of 8 GPUs joined by InfiniBand NDR 400 Gb/s per GPU"),
}


def get_hardware(hardware: str | Hardware) -> Hardware:
    """``hardware`` itself if it is a :class:`Hardware`, else the preset of that name from
    :data:`HARDWARE`."""
    if isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, str) and hardware in HARDWARE:
        return HARDWARE[hardware]
    raise ValueError(f"unknown hardware {hardware!r}; expected a Hardware or one of "
                     f"{', '.join(repr(k) for k in HARDWARE)}")
