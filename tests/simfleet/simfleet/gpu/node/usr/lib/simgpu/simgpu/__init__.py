# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""simgpu: the simulated GPU boundary of a simfleet node (standard library only).

One model of the GPUs of a node, kept in ``<root>/var/lib/simgpu/state.json``, is read and
written by every front end: the drop-in ``pynvml`` (``simgpu.nvmlfake``), the simulated
``nvidia-smi`` (``simgpu.smi``), the ``dmesg`` stand-in (``simgpu.klog``) and the boot unit
(``simgpu.boot``). The driver itself is seen through the same files a real node has:
``/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`` (userspace version),
``/lib/modules/<release>/updates/dkms/nvidia.ko`` (built module, read like ``modinfo``),
``/sys/module/nvidia/version`` and ``/proc/driver/nvidia/version`` (loaded module).

Every path is taken below ``SIMGPU_ROOT`` (default ``/``) so the same code runs on a build
host against a temporary directory.
"""

from __future__ import annotations

import os

STATE_RELPATH = "var/lib/simgpu/state.json"
LIB_RELDIR = "usr/lib/x86_64-linux-gnu"
NVML_SONAME = "libnvidia-ml.so.1"
SYS_MODULE_RELDIR = "sys/module"
PROC_DRIVER_RELDIR = "proc/driver"


def root_dir(root: str | None = None) -> str:
    """Return the node root: ``root`` if given, else ``$SIMGPU_ROOT``, else ``/``."""
    if root:
        return root
    return os.environ.get("SIMGPU_ROOT") or "/"


def rpath(root: str | None, relpath: str) -> str:
    """Join a node-relative path (no leading slash needed) under the node root."""
    return os.path.join(root_dir(root), relpath.lstrip("/"))


def state_path(root: str | None = None) -> str:
    """Path of the node's GPU state file."""
    return rpath(root, STATE_RELPATH)


def kernel_release(explicit: str | None = None) -> str:
    """Running kernel release: ``explicit``, else ``$SIMGPU_KERNEL_RELEASE``, else ``uname -r``."""
    if explicit:
        return explicit
    return os.environ.get("SIMGPU_KERNEL_RELEASE") or os.uname().release


def is_root() -> bool:
    """True when the caller may use NVML/nvidia-smi setters (effective uid 0).

    ``$SIMGPU_FAKE_UID`` overrides the uid, so tests can act as an unprivileged user.
    """
    fake = os.environ.get("SIMGPU_FAKE_UID")
    if fake not in (None, ""):
        return int(fake) == 0
    return os.geteuid() == 0
