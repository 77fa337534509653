# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which packages are the NVIDIA driver, and the versions their records tell.

:func:`is_driver_package` draws the line between the driver package set and other NVIDIA
software with its own version numbers; :func:`userspace_version_from_packages` and
:func:`fabricmanager_version_from_packages` read the driver and Fabric Manager versions from the
records of :mod:`installed_packages`. Pure.

Compatible with Python 3.7 (the managed nodes' floor, see README.md); standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import upstream_version


# Which installed packages are "NVIDIA driver packages". Names from NVIDIA's CUDA repositories
# (Debian 12, Ubuntu 22.04/24.04, RHEL 8/9), the Debian/Ubuntu archives and RPM Fusion /
# negativo17 (see docs/facts.md and the package reference): the driver libraries and tools,
# kernel module packages (DKMS, precompiled kmods, Ubuntu's linux-modules-nvidia-*), GSP
# firmware, X driver, Fabric Manager, NSCQ, IMEX, NVSDM and the pinning packages. Not included: the CUDA toolkit, the container toolkit and other NVIDIA
# software with its own version numbers (see _NOT_DRIVER_PACKAGES).
_DRIVER_PACKAGES = re.compile(
    r"^(?:"
    r"nvidia-.+"
    r"|libnvidia-.+"
    r"|cuda-drivers(?:-.+)?"
    r"|libcuda\d+(?:-.+)?"
    r"|libcudadebugger\d+"
    r"|libnvcuvid\d+"
    r"|libnvoptix\d+"
    r"|lib(?:gl|egl|gles|glx)[\w.+]*-nvidia[\w.+-]*"
    r"|firmware-nvidia-.+"
    r"|xserver-xorg-video-nvidia.*"
    r"|xorg-x11-drv-nvidia.*"
    r"|xorg-x11-nvidia.*"
    r"|kmod-nvidia.*"
    r"|akmod-nvidia.*"
    r"|dkms-nvidia.*"
    r"|linux-(?:modules|objects|signatures)-nvidia-.+"
    r"|libnvsdm.*"
    r"|dnf-plugin-nvidia"
    r"|yum-plugin-nvidia"
    r")$"
)

_NOT_DRIVER_PACKAGES = re.compile(
    r"^(?:"
    r"nvidia-container-.+|libnvidia-container.*|nvidia-docker.*"  # container toolkit
    r"|nvidia-cuda-(?:toolkit|dev|gdb|doc|samples).*"  # Debian's CUDA toolkit
    r"|nvidia-(?:cudnn|tensorrt|profiler|visual-profiler|nsight.*|opencl-dev|openjdk.*)"
    r"|nvidia-fs.*|nvidia-gds.*"  # GPUDirect Storage: own version numbers
    r"|nvidia-mig-manager.*|nvidia-driver-assistant|nvidia-prime.*"
    r"|nvidia-l4t-.+|nvidia-jetpack.*"  # Jetson: L4T release numbers
    r"|libxnvctrl.*"  # NV-CONTROL X client library (nvidia-settings): Debian pulls it in with Chromium
    r")$"
)


def is_driver_package(name: str) -> bool:
    """Tell whether a package name belongs to the NVIDIA driver package set.

    Included (prefix patterns): ``nvidia-*``, ``libnvidia-*``, ``cuda-drivers*``, ``libcuda1``,
    ``libcudadebugger1``, ``libnvcuvid1``, ``libnvoptix1``, ``libglx-nvidia0``-style GL
    libraries, ``firmware-nvidia-*`` (GSP firmware), ``xserver-xorg-video-nvidia*``,
    ``xorg-x11-drv-nvidia*``, ``xorg-x11-nvidia``, ``kmod-nvidia*``, ``akmod-nvidia*``,
    ``dkms-nvidia*``, ``linux-modules-nvidia-*`` / ``linux-objects-nvidia-*`` /
    ``linux-signatures-nvidia-*`` (Ubuntu precompiled modules), ``libnvsdm*``,
    ``dnf-plugin-nvidia``. This takes in Fabric Manager (``nvidia-fabricmanager*``,
    ``nvidia-fabric-manager``), NSCQ (``libnvidia-nscq*``), IMEX (``nvidia-imex*``) and the
    pinning packages (``nvidia-driver-pinning-*``).

    Excluded: CUDA toolkit packages (``cuda-toolkit-*``, ``libcudart*``, Debian's
    ``nvidia-cuda-toolkit``/``-dev``/``-gdb``), the container toolkit (``nvidia-container-*``,
    ``libnvidia-container*``, ``nvidia-docker*``), cuDNN/TensorRT/profilers/Nsight, GPUDirect
    Storage (``nvidia-fs*``, ``nvidia-gds*``), ``nvidia-mig-manager``,
    ``nvidia-driver-assistant``, ``nvidia-prime`` and Jetson ``nvidia-l4t-*`` packages: they have
    their own version numbers; ``libxnvctrl*`` (the NV-CONTROL X client library of
    nvidia-settings): it talks to an X server, not to the kernel module, and Debian installs it
    with Chromium on hosts that have no NVIDIA driver.

    :param name: a package name, with or without a ``:arch`` suffix.
    :returns: ``True`` for a driver package.
    :raises: nothing.
    """
    base = name.split(":", 1)[0].strip().lower()
    if not base or _NOT_DRIVER_PACKAGES.match(base):
        return False
    return bool(_DRIVER_PACKAGES.match(base))


# Packages whose version is the userspace driver version, most authoritative first: the NVML
# library itself, then the compute libraries, then the driver metapackages and tools.
# Debian/CUDA-repo Debian: libnvidia-ml1, nvidia-driver-libs, nvidia-driver-cuda, libcuda1,
# nvidia-smi; Ubuntu: libnvidia-compute-<branch> / libnvidia-compute, nvidia-utils-<branch>,
# libnvidia-common-<branch> (field case 17); RHEL CUDA repo: libnvidia-ml, nvidia-driver-cuda-libs,
# nvidia-driver-cuda, nvidia-driver-libs; RPM Fusion: xorg-x11-drv-nvidia-cuda-libs.
_USERSPACE_PACKAGES = (
    re.compile(r"^libnvidia-ml1?$"),
    re.compile(r"^libnvidia-compute(?:-\d+)?(?:-server)?$"),
    re.compile(r"^nvidia-driver-cuda-libs$"),
    re.compile(r"^nvidia-driver-libs$"),
    re.compile(r"^nvidia-driver-cuda$"),
    re.compile(r"^xorg-x11-drv-nvidia-cuda-libs$"),
    re.compile(r"^libcuda1$"),
    re.compile(r"^nvidia-utils(?:-\d+)?(?:-server)?$"),
    re.compile(r"^nvidia-smi$"),
    re.compile(r"^libnvidia-common(?:-\d+)?(?:-server)?$"),
    re.compile(r"^nvidia-driver(?:-\d+)?(?:-open)?(?:-server)?(?:-open)?$"),
)


def userspace_version_from_packages(packages: Optional[List[Dict[str, Any]]]) -> Optional[str]:
    """Derive the userspace driver version from installed packages.

    The first installed package, in this order of authority, gives the version: ``libnvidia-ml1``
    (Debian) / ``libnvidia-ml`` (RHEL), ``libnvidia-compute[-<branch>]`` (Ubuntu),
    ``nvidia-driver-cuda-libs``, ``nvidia-driver-libs``, ``nvidia-driver-cuda``,
    ``xorg-x11-drv-nvidia-cuda-libs``, ``libcuda1``, ``nvidia-utils[-<branch>]``, ``nvidia-smi``,
    ``libnvidia-common[-<branch>]``, ``nvidia-driver[-<branch>][-open]``. The Debian revision and the rpm epoch/release are stripped
    (:func:`driver_versions.upstream_version`): ``580.126.20-1`` → ``580.126.20``, ``3:580.126.09-1.el9`` →
    ``580.126.09``.

    :param packages: records from :func:`installed_packages.parse_dpkg_l` / :func:`installed_packages.parse_rpm_qa`; records with
        ``installed: False`` (``rc``, ``un``) are ignored.
    :returns: the version, or ``None`` when no such package is installed.
    :raises: nothing.
    """
    installed = [p for p in (packages or []) if p.get("installed", True) and p.get("version")]
    for pattern in _USERSPACE_PACKAGES:
        for package in installed:
            if pattern.match(package.get("name", "")):
                version = upstream_version(package["version"])
                if version:
                    return version
    return None


def fabricmanager_version_from_packages(packages: Optional[List[Dict[str, Any]]]) -> Optional[str]:
    """Return the upstream version of the installed Fabric Manager package.

    Names: ``nvidia-fabricmanager`` (580 on), ``nvidia-fabricmanager-<branch>`` (up to 575),
    ``nvidia-fabric-manager`` (RHEL). It must equal the driver version exactly (field case 11).

    :returns: the version (``"580.126.09"``), or ``None`` when none is installed.
    :raises: nothing.
    """
    for package in packages or []:
        if not package.get("installed", True):
            continue
        if re.match(r"^nvidia-fabric-?manager(?:-\d+)?$", package.get("name", "")):
            return upstream_version(package.get("version"))
    return None
