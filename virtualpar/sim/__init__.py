"""Cost model of virtual hardware: device specs and presets, the per-device modelled clock, closed forms.

Pure: nothing here starts a process.  ``hardware`` describes devices and their network,
``clock.DeviceClock`` turns a device's program order into modelled seconds, and ``analytic`` holds
the α–β closed forms the tests and the non-message collectives use.
"""

from __future__ import annotations

from virtualpar.sim import analytic
from virtualpar.sim.clock import DeviceClock
from virtualpar.sim.hardware import HARDWARE, IDEAL_DEVICE, DeviceSpec, Hardware, dtype_name, get_hardware

__all__ = [
    "DeviceClock",
    "DeviceSpec",
    "Hardware",
    "HARDWARE",
    "IDEAL_DEVICE",
    "analytic",
    "dtype_name",
    "get_hardware",
]
