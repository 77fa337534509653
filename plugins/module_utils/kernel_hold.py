# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel packages to hold under a built driver, and the automatic-update exclusions.

Pure: no file, process or network access. Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, Optional


_KERNEL_META = re.compile(
    r"^linux-(?:image-|headers-|modules-)?(?:generic|virtual|lowlatency|amd64|cloud-amd64|rt-amd64|aws|azure|gcp|"
    r"oracle|kvm|nvidia|generic-hwe-\d+\.\d+|virtual-hwe-\d+\.\d+|oem-\d+\.\d+\w*)$"
)


def kernel_hold_packages(running_kernel: str, installed: Iterable[Any], package_manager_name: str = "apt") -> Dict[str, Any]:
    """The kernel packages to hold so the running kernel stays the one the driver was built for.

    apt: the running kernel's ``linux-image-<r>``, ``linux-image-unsigned-<r>``,
    ``linux-headers-<r>``, ``linux-modules-<r>``, ``linux-modules-extra-<r>`` and the kernel meta
    packages that would pull a new kernel (Debian ``linux-image-amd64``/``linux-headers-amd64``,
    Ubuntu ``linux-generic``, ``linux-image-generic``, ``linux-headers-generic``, HWE and cloud
    flavours); ``linux-headers-<r>-common`` and ``linux-kbuild-*`` come along where installed.
    dnf: ``kernel``, ``kernel-core``, ``kernel-modules``, ``kernel-modules-core``,
    ``kernel-modules-extra``, ``kernel-devel``, ``kernel-headers`` at the running release (the
    versionlock plugin then refuses other kernel versions).

    :param running_kernel: ``uname -r``.
    :param installed: installed package names or records with ``name`` (and ``version`` for dnf).
    :returns: ``{"hold": [names], "running_kernel_package": str|None, "versionlock": [specs] (dnf)}``.
    """
    names = []
    for item in installed or []:
        names.append(item["name"] if isinstance(item, dict) else str(item))
    names = sorted(set(names))
    if package_manager_name == "dnf":
        release = re.sub(r"\.(x86_64|aarch64|noarch)$", "", running_kernel)
        wanted = ("kernel", "kernel-core", "kernel-modules", "kernel-modules-core", "kernel-modules-extra",
                  "kernel-devel", "kernel-headers")
        present = [n for n in wanted if n in names]
        return {"hold": present, "running_kernel_package": "kernel-core" if "kernel-core" in names else None,
                "versionlock": ["%s-%s" % (n, release) for n in present]}
    exact = []
    for prefix in ("linux-image-", "linux-image-unsigned-", "linux-headers-", "linux-modules-",
                   "linux-modules-extra-"):
        if prefix + running_kernel in names:
            exact.append(prefix + running_kernel)
    common = re.sub(r"-[a-z][a-z0-9]*$", "-common", running_kernel)
    if "linux-headers-" + common in names and common != running_kernel:
        exact.append("linux-headers-" + common)
    metas = [n for n in names if _KERNEL_META.match(n)]
    kbuild = [n for n in names if n.startswith("linux-kbuild-")]
    hold = sorted(set(exact + metas + kbuild))
    image = "linux-image-" + running_kernel
    return {"hold": hold, "running_kernel_package": image if image in names else None, "versionlock": None}


UNATTENDED_UPGRADES_BLACKLIST = (
    "linux-image-", "linux-headers-", "linux-modules-", "linux-generic", "linux-virtual", "linux-kbuild-",
    "nvidia-", "libnvidia-", "libcuda", "libnvcuvid", "libnvoptix", "firmware-nvidia-", "cuda-drivers",
    "libxnvctrl", "libnvsdm", "xserver-xorg-video-nvidia",
)


def unattended_upgrades_config(extra: Optional[Iterable[str]] = None) -> str:
    """apt.conf snippet that keeps unattended-upgrades off the kernel and the NVIDIA driver.

    ``Unattended-Upgrade::Package-Blacklist`` takes regular expressions matched from the start of
    the package name (unattended-upgrades(8), 50unattended-upgrades); list values from several
    apt.conf.d files add up, so this file extends, never replaces, the site's list (field case 17:
    ``libnvidia-common-460`` was upgraded under a loaded module).
    """
    entries = list(UNATTENDED_UPGRADES_BLACKLIST) + [e for e in (extra or []) if e]
    lines = ["// Managed by gpufleet.nvidia (role kernel_hold): kernel and NVIDIA driver packages",
             "// change only through the driver and kernel_hold roles.",
             "Unattended-Upgrade::Package-Blacklist {"]
    for entry in entries:
        lines.append('    "%s";' % entry.replace('"', ""))
    lines.append("};")
    return "\n".join(lines) + "\n"
