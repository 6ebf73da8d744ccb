"""The registry of GPU vendors and the availability probe that picks one.

Each vendor's module implements :class:`~perseus_client.gpu.base.GpuBackend` over its library
and gives a :class:`~perseus_client.gpu.base.GpuVendor` entry; :data:`VENDORS` lists the
entries, and :func:`choose_vendor` takes the first whose probe says its GPUs are here (else the
first entry, whose error then says why clock control cannot be had). The rank client's default
backend (:func:`perseus_client.defaults.backend_factory`) and the node daemon
(``perseus_gpud.devices.open_devices``, in the daemon's own package) both open GPUs through the chosen entry.

Adding a vendor (AMD through ``amdsmi``, say) is one module with its backend and its
``VENDOR``, and one line here; nothing else in the client or the daemon names a vendor.
"""

from __future__ import annotations

from collections.abc import Sequence

from perseus_client.gpu import nvml
from perseus_client.gpu.base import GpuVendor

__all__ = ["VENDORS", "GpuVendor", "choose_vendor"]

#: Every vendor this client can drive, in the order they are probed.
VENDORS: tuple[GpuVendor, ...] = (nvml.VENDOR,)


def choose_vendor(vendors: Sequence[GpuVendor] | None = None) -> GpuVendor:
    """The first of ``vendors`` whose probe says its GPUs are here; else the first one.

    ``vendors`` defaults to :data:`VENDORS`; when none is here, opening the first one's GPU
    fails with the reason.
    """
    vendors = VENDORS if vendors is None else vendors
    if not vendors:
        raise ValueError("vendors: no GPU vendor is registered")
    for entry in vendors:
        if entry.available():
            return entry
    return vendors[0]
