# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA driver package set per distribution and branch generation, and what of it is installed.

Pure: no file, process or network access. Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import version_key
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_packages import is_driver_package
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import upstream_version
from ansible_collections.gpufleet.nvidia.plugins.module_utils.distributions import PlanError, check_distribution


# Package names that belong to NVIDIA's driver set but are versioned on their own: never pinned
# to the driver version.
OWN_VERSION = re.compile(r"^nvidia-driver-pinning-.+$")


def generation(distribution: str, branch: str) -> str:
    """The naming generation of a branch on a distribution.

    :returns: ``"suffixed"`` (Ubuntu up to R580: ``libnvidia-compute-580``), ``"unsuffixed"``
        (Ubuntu from R590, Debian 12 always) or ``"module-stream"`` (RHEL).
    """
    check_distribution(distribution)
    if distribution.startswith("rhel"):
        return "module-stream"
    if distribution.startswith("ubuntu") and int(branch) <= 580:
        return "suffixed"
    return "unsuffixed"


def pin_package_name(distribution: str, branch: str) -> Optional[str]:
    """NVIDIA's branch pinning package, ``nvidia-driver-pinning-<branch>``, where it exists.

    Ubuntu: from R590, when the branch suffix was dropped; Debian 12: from R580 (source:
    docs/packages.md, "Pinning packages"). RHEL has none (version lock instead).
    """
    check_distribution(distribution)
    if distribution.startswith("ubuntu") and int(branch) >= 590:
        return "nvidia-driver-pinning-%s" % branch
    if distribution == "debian12" and int(branch) >= 580:
        return "nvidia-driver-pinning-%s" % branch
    return None


def module_stream(branch: str, kernel_module_type: str) -> str:
    """RHEL ``nvidia-driver`` module stream: ``<branch>-open`` or ``<branch>-dkms`` (proprietary,
    built by DKMS). Source: NVIDIA/cuda-repo-management ``genmodules.py`` streams
    ``<b>``, ``<b>-dkms``, ``<b>-open``."""
    return "%s-%s" % (branch, "open" if kernel_module_type == "open" else "dkms")


def package_set(distribution: str, branch: str, kernel_module_type: str, fabric_manager: bool = False,
                persistenced: bool = True) -> List[Dict[str, Any]]:
    """The driver package set for a node (compute-only, headless), by name.

    Debian 12: ``nvidia-driver-cuda``, ``nvidia-kernel-open-dkms`` (open) or ``nvidia-kernel-dkms``
    (proprietary), ``nvidia-kernel-support``, ``firmware-nvidia-gsp``, ``libcuda1``,
    ``libnvidia-ml1``, ``nvidia-smi``, ``nvidia-persistenced``; Fabric Manager
    ``nvidia-fabricmanager`` (``nvidia-fabricmanager-<b>`` up to R575) and ``libnvidia-nscq``
    (``-<b>`` up to R575).

    Ubuntu up to R580 (suffixed) / from R590 (unsuffixed): ``libnvidia-compute[-<b>]``,
    ``nvidia-dkms[-<b>][-open]``, ``nvidia-kernel-common[-<b>]``, ``nvidia-kernel-source[-<b>][-open]``,
    ``nvidia-firmware[-<b>]``, ``nvidia-utils[-<b>]``, ``nvidia-compute-utils[-<b>]`` (holds
    ``nvidia-persistenced``), ``nvidia-modprobe``; Fabric Manager ``nvidia-fabricmanager`` and
    ``libnvidia-nscq`` (suffixed ``-<b>`` up to R575).

    RHEL 8/9: ``nvidia-driver-cuda``, ``nvidia-driver-cuda-libs``, ``nvidia-kmod-common``,
    ``kmod-nvidia-open-dkms`` (open) or ``kmod-nvidia-latest-dkms`` (proprietary),
    ``libnvidia-ml``, ``nvidia-persistenced``, ``nvidia-modprobe``; Fabric Manager
    ``nvidia-fabricmanager`` + ``libnvidia-nscq`` from R580, ``nvidia-fabric-manager`` +
    ``libnvidia-nscq-<b>`` up to R575.

    Sources: docs/packages.md (NVIDIA CUDA repository listings, the Driver Installation Guide's
    compute-only installation, NVIDIA/gpu-driver-container install scripts).

    NSCQ (``libnvidia-nscq``, the NVSwitch library DCGM reads) is installed where the repository
    offers it at the driver version; Fabric Manager itself does not need it.

    :returns: ``[{"name": str, "role": "driver"|"kernel"|"fabric_manager"|"nscq"|"pin"}]`` in install order.
    :raises PlanError: ``unsupported_distribution`` or ``bad_request`` (flavour not open/proprietary).
    """
    check_distribution(distribution)
    if kernel_module_type not in ("open", "proprietary"):
        raise PlanError("bad_request", "kernel_module_type must be open or proprietary, got %r" % (kernel_module_type,))
    b = int(branch)
    open_ = kernel_module_type == "open"
    names = []  # type: List[Tuple[str, str]]
    if distribution == "debian12":
        names += [("nvidia-driver-cuda", "driver"),
                  ("nvidia-kernel-open-dkms" if open_ else "nvidia-kernel-dkms", "kernel"),
                  ("nvidia-kernel-support", "kernel"),
                  ("firmware-nvidia-gsp", "kernel"),
                  ("libcuda1", "driver"),
                  ("libnvidia-ml1", "driver"),
                  ("nvidia-smi", "driver")]
        if persistenced:
            names.append(("nvidia-persistenced", "driver"))
        if fabric_manager:
            sfx = "-%d" % b if b <= 575 else ""
            names += [("nvidia-fabricmanager" + sfx, "fabric_manager"), ("libnvidia-nscq" + sfx, "nscq")]
    elif distribution.startswith("ubuntu"):
        sfx = "-%d" % b if b <= 580 else ""
        flav = "-open" if open_ else ""
        names += [("libnvidia-compute" + sfx, "driver"),
                  ("nvidia-dkms" + sfx + flav, "kernel"),
                  ("nvidia-kernel-common" + sfx, "kernel"),
                  ("nvidia-kernel-source" + sfx + flav, "kernel"),
                  ("nvidia-firmware" + sfx, "kernel"),
                  ("nvidia-utils" + sfx, "driver"),
                  ("nvidia-compute-utils" + sfx, "driver"),
                  ("nvidia-modprobe", "driver")]
        if fabric_manager:
            fsfx = "-%d" % b if b <= 575 else ""
            names += [("nvidia-fabricmanager" + fsfx, "fabric_manager"), ("libnvidia-nscq" + fsfx, "nscq")]
    else:
        names += [("nvidia-driver-cuda", "driver"),
                  ("nvidia-driver-cuda-libs", "driver"),
                  ("nvidia-kmod-common", "kernel"),
                  ("kmod-nvidia-open-dkms" if open_ else "kmod-nvidia-latest-dkms", "kernel"),
                  ("libnvidia-ml", "driver"),
                  ("nvidia-modprobe", "driver")]
        if persistenced:
            names.append(("nvidia-persistenced", "driver"))
        if fabric_manager:
            if b >= 580:
                names += [("nvidia-fabricmanager", "fabric_manager"), ("libnvidia-nscq", "nscq")]
            else:
                names += [("nvidia-fabric-manager", "fabric_manager"), ("libnvidia-nscq-%d" % b, "nscq")]
    pin = pin_package_name(distribution, branch)
    result = []
    if pin:
        result.append({"name": pin, "role": "pin"})
    result.extend({"name": n, "role": r} for n, r in names)
    return result


_SUFFIX = re.compile(r"^(?P<stem>.+?)-(?P<branch>\d{3})(?P<flav>(?:-open|-server|-open-server)?)$")


def rename_for_branch(name: str, distribution: str, old_branch: Optional[str], new_branch: str) -> str:
    """The name a package of the old branch has in the new branch (field case 18: a branch change
    must request every package of the new branch that the old one had installed).

    ``libnvidia-decode-570`` → ``libnvidia-decode-580`` (Ubuntu, suffixed) or
    ``libnvidia-decode`` (Ubuntu from R590); ``nvidia-dkms-580-open`` → ``nvidia-dkms-open``;
    ``nvidia-headless-no-dkms-450-server`` → ``nvidia-headless-no-dkms-460-server``;
    ``nvidia-fabricmanager-570`` → ``nvidia-fabricmanager`` (from R580). Names without the old
    branch number are returned unchanged.
    """
    match = _SUFFIX.match(name)
    if not match or (old_branch and match.group("branch") != str(old_branch)):
        return name
    stem, flav = match.group("stem"), match.group("flav")
    fm_like = re.match(r"^(?:nvidia-fabricmanager|libnvidia-nscq|nvidia-imex|libnvsdm)$", stem)
    new = int(new_branch)
    if fm_like:
        keep_suffix = new <= 575
    elif distribution.startswith("ubuntu"):
        keep_suffix = new <= 580
    else:
        keep_suffix = False
    return stem + ("-%d" % new if keep_suffix else "") + flav


def installed_map(installed: Optional[Iterable[Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    result = {}
    for pkg in installed or []:
        if not pkg.get("name") or not pkg.get("installed", True):
            continue
        result[pkg["name"]] = pkg
    return result


def _installed_driver_version(installed: Dict[str, Dict[str, Any]]) -> Optional[str]:
    votes = {}  # type: Dict[str, int]
    for name, pkg in installed.items():
        if OWN_VERSION.match(name) or not is_driver_package(name):
            continue
        up = upstream_version(pkg.get("version"))
        if up and re.match(r"^\d+(?:\.\d+){1,3}$", up):
            votes[up] = votes.get(up, 0) + 1
    if not votes:
        return None
    return sorted(votes.items(), key=lambda kv: (kv[1], version_key(kv[0])))[-1][0]


def installed_driver_version(installed: Optional[Iterable[Dict[str, Any]]]) -> Optional[str]:
    """The driver version most installed driver packages carry (pinning packages aside), or ``None``.

    :param installed: records from ``driver_state.parse_dpkg_l`` / ``parse_rpm_qa``.
    """
    return _installed_driver_version(installed_map(installed))


# A precompiled kmod for one kernel: kmod-nvidia-<driver version>-<kernel release> (RHEL stream
# "<branch>"); the DKMS streams this collection installs conflict with it (field case 21).
PRECOMPILED_KMOD = re.compile(r"^kmod-nvidia-\d+\.\d+(?:\.\d+)?-\d.*$")


def is_other_flavour(name: str, kernel_module_type: str) -> bool:
    """Is ``name`` the kernel module package of the other flavour?"""
    open_pkgs = re.compile(r"^(?:nvidia-kernel-open-dkms|nvidia-dkms(?:-\d+)?-open|nvidia-kernel-source(?:-\d+)?-open"
                           r"|kmod-nvidia-open-dkms)$")
    prop_pkgs = re.compile(r"^(?:nvidia-kernel-dkms|nvidia-dkms(?:-\d+)?|nvidia-kernel-source(?:-\d+)?"
                           r"|kmod-nvidia-latest-dkms)$")
    if kernel_module_type == "open":
        return bool(prop_pkgs.match(name))
    return bool(open_pkgs.match(name))
