# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the node's driver looks like from its files: userspace, on-disk module, loaded module.

- userspace version: the file ``libnvidia-ml.so.1`` points to in ``/usr/lib/x86_64-linux-gnu``
  (``libnvidia-ml.so.<version>``), installed by the ``libnvidia-ml1`` package;
- on-disk module: ``.modinfo`` of ``/lib/modules/<release>/updates/dkms/nvidia.ko`` (what
  ``modinfo nvidia`` answers), built by the kernel-module package's maintainer script;
- loaded module: ``/sys/module/nvidia/version`` and ``/proc/driver/nvidia/version``, written by
  the boot unit on tmpfs mounts inside the node.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
from typing import Any, Dict, List, Optional

from . import LIB_RELDIR, NVML_SONAME, PROC_DRIVER_RELDIR, SYS_MODULE_RELDIR, kernel_release, kmod, root_dir

_LIB_RE = re.compile(r"^libnvidia-ml\.so\.(\d+(?:\.\d+)+)$")


def userspace_version(root: Optional[str] = None) -> Optional[str]:
    """Version of the installed NVML library (from the name ``libnvidia-ml.so.1`` resolves to).

    None when the library is absent (or a dangling link), as when ``dlopen`` would fail.
    """
    link = os.path.join(root_dir(root), LIB_RELDIR, NVML_SONAME)
    if not os.path.exists(link):
        return None
    target = os.path.basename(os.path.realpath(link))
    match = _LIB_RE.match(target)
    if match:
        return match.group(1)
    marker = os.path.join(os.path.dirname(link), "libnvidia-ml.version")
    try:
        with open(marker, "r", encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def on_disk_module(root: Optional[str] = None, release: Optional[str] = None) -> Optional[Dict[str, str]]:
    """``{"version", "flavor", "path"}`` of the nvidia.ko built for ``release``, or None."""
    path = kmod.module_path(root_dir(root), kernel_release(release))
    info = kmod.read_modinfo(path)
    if not info or not info.get("version"):
        return None
    return {"version": info["version"][0], "flavor": kmod.module_flavor(info), "path": path}


def loaded_module(root: Optional[str] = None) -> Optional[Dict[str, str]]:
    """``{"version", "flavor"}`` of the loaded nvidia module, or None when not loaded."""
    base = root_dir(root)
    try:
        with open(os.path.join(base, SYS_MODULE_RELDIR, "nvidia/version"), "r", encoding="utf-8") as handle:
            version = handle.read().strip()
    except OSError:
        return None
    flavor = "proprietary"
    try:
        with open(os.path.join(base, PROC_DRIVER_RELDIR, "nvidia/version"), "r", encoding="utf-8") as handle:
            if "Open Kernel Module" in handle.read():
                flavor = "open"
    except OSError:
        pass
    return {"version": version, "flavor": flavor}


def status(root: Optional[str] = None, release: Optional[str] = None) -> Dict[str, Any]:
    """Everything above in one dict: userspace_version, on_disk (dict|None), loaded (dict|None)."""
    return {
        "userspace_version": userspace_version(root),
        "on_disk": on_disk_module(root, release),
        "loaded": loaded_module(root),
        "kernel_release": kernel_release(release),
    }


def _build_stamp(version: str) -> str:
    """A stable, plausible build date for a driver version (the text after the version)."""
    digest = int(hashlib.sha256(version.encode()).hexdigest()[:8], 16)
    stamp = 1735689600 + digest % (365 * 86400)
    return time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime(stamp))


def proc_version_text(version: str, flavor: str) -> str:
    """Contents of ``/proc/driver/nvidia/version`` in the driver's format for each flavor."""
    if flavor == "open":
        first = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (dvs-builder@U22-I3-B17-02-5)  %s" % (
            version, _build_stamp(version))
    else:
        first = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  %s" % (version, _build_stamp(version))
    return first + "\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n"


def load_banner(version: str, flavor: str) -> str:
    """The kernel log line the module prints when it loads."""
    if flavor == "open":
        return "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (dvs-builder@U22-I3-B17-02-5)  %s" % (
            version, _build_stamp(version))
    return "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  %s  %s" % (version, _build_stamp(version))


def write_loaded(root: Optional[str], version: str, flavor: str, gpus: List[Dict[str, Any]]) -> None:
    """Write the loaded-module files under ``root`` (the tmpfs mounts in a booted node).

    Writes ``/sys/module/nvidia/{version,initstate}``, ``/proc/driver/nvidia/version`` and
    ``/proc/driver/nvidia/gpus/<bus id>/information`` for each GPU present on the bus.
    """
    base = root_dir(root)
    mod_dir = os.path.join(base, SYS_MODULE_RELDIR, "nvidia")
    os.makedirs(mod_dir, exist_ok=True)
    with open(os.path.join(mod_dir, "version"), "w", encoding="utf-8") as handle:
        handle.write(version + "\n")
    with open(os.path.join(mod_dir, "initstate"), "w", encoding="utf-8") as handle:
        handle.write("live\n")
    proc = os.path.join(base, PROC_DRIVER_RELDIR, "nvidia")
    os.makedirs(proc, exist_ok=True)
    with open(os.path.join(proc, "version"), "w", encoding="utf-8") as handle:
        handle.write(proc_version_text(version, flavor))
    gpus_dir = os.path.join(proc, "gpus")
    shutil.rmtree(gpus_dir, ignore_errors=True)
    for minor, gpu in enumerate(gpus):
        bus = gpu["pci"]["bus_id"][4:].lower()  # "0000:18:00.0"
        gdir = os.path.join(gpus_dir, bus)
        os.makedirs(gdir, exist_ok=True)
        with open(os.path.join(gdir, "information"), "w", encoding="utf-8") as handle:
            handle.write(
                "Model: \t\t %s\nIRQ:   \t\t %d\nGPU UUID: \t %s\nVideo BIOS: \t %s\nBus Type: \t PCIe\n"
                "DMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\n"
                "GPU Firmware: \t %s\nGPU Excluded:\t No\n"
                % (gpu["name"], 200 + minor, gpu["uuid"], gpu["vbios_version"].lower(), bus, gpu["minor_number"],
                   version))


def clear_loaded(root: Optional[str] = None) -> None:
    """Remove the loaded-module files (the module is not loaded)."""
    base = root_dir(root)
    shutil.rmtree(os.path.join(base, SYS_MODULE_RELDIR, "nvidia"), ignore_errors=True)
    shutil.rmtree(os.path.join(base, PROC_DRIVER_RELDIR, "nvidia"), ignore_errors=True)


def install_userspace(root: Optional[str], version: str) -> str:
    """Lay out the NVML library stand-in for ``version`` (host-side tests; packages do it on nodes).

    Writes ``libnvidia-ml.so.<version>`` and the relative link ``libnvidia-ml.so.1`` to it.
    Returns the link path.
    """
    libdir = os.path.join(root_dir(root), LIB_RELDIR)
    os.makedirs(libdir, exist_ok=True)
    target = "libnvidia-ml.so.%s" % version
    with open(os.path.join(libdir, target), "wb") as handle:
        handle.write(b"simgpu NVML stand-in " + version.encode() + b"\n")
    link = os.path.join(libdir, NVML_SONAME)
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(target, link)
    return link
