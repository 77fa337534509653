# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The dnf side of the driver transaction: module stream, flavour swap, kernel excludes, version locks.

Pure: no file, process or network access. Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import re

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import version_key
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import upstream_version
from ansible_collections.gpufleet.nvidia.plugins.module_utils.package_sets import module_stream


VERSIONLOCK_LIST = "/etc/dnf/plugins/versionlock.list"


# dnf: a driver transaction must never change the kernel (field case 21, stackhpc PR #496).
DNF_KERNEL_EXCLUDES = ["kernel", "kernel-core", "kernel-modules", "kernel-modules-core", "kernel-modules-extra"]


def plan_dnf(distribution, branch, version, kernel_module_type, packages, inst, removals,
             current_stream, locked):
    """The dnf half of :func:`package_transaction.plan_transaction`: stream, swap, installs, locks, steps.

    :param packages: the set with the versions picked; :param inst: installed records by name.
    :param removals: names that leave; :param current_stream: the enabled ``nvidia-driver`` stream.
    :param locked: the current versionlock entries of NVIDIA packages.
    :returns: the dnf keys of the plan (``install``, ``module``, ``versionlock``, ``swap``, ``steps``, ...)
        and ``_repin``.
    """
    stream = module_stream(branch, kernel_module_type)
    reset = bool(current_stream) and current_stream != stream
    install = []
    downgrade = []
    for pkg in packages:
        if pkg["installed_version"] and upstream_version(pkg["installed_version"]) == version:
            continue
        spec = "%s-%s" % (pkg["name"], upstream_version(pkg["version"]) if pkg["version"] else version)
        old = upstream_version(pkg["installed_version"]) if pkg["installed_version"] else None
        if old and re.match(r"^\d+(?:\.\d+)+$", old) and version_key(old) > version_key(version):
            downgrade.append(spec)
        else:
            install.append(spec)
    # Field case 21: a precompiled kmod and a DKMS kmod conflict; swap them explicitly in one
    # transaction rather than letting --allowerasing remove the running driver silently.
    swap = []
    new_kmod = [p for p in packages if p["role"] == "kernel" and p["name"].startswith("kmod-nvidia")]
    rest_removals = []
    for name in removals:
        if name.startswith("kmod-nvidia") and new_kmod:
            swap.append([name, "%s-%s" % (new_kmod[0]["name"], version)])
        else:
            rest_removals.append(name)
    if swap:
        swapped = set(s[1] for s in swap)
        install = [s for s in install if s not in swapped]
        downgrade = [s for s in downgrade if s not in swapped]
    versionlock = []
    for pkg in packages:
        full = pkg["version"] or version
        if ":" in full or "-" in full:
            versionlock.append("%s-%s.*" % (pkg["name"], full))
        else:
            versionlock.append("%s-%s" % (pkg["name"], full))
    current_locks = sorted(set(locked or []))
    repin = current_locks != sorted(versionlock)
    changing = bool(install or downgrade or swap or rest_removals or reset or not current_stream)
    steps = []
    if changing:
        if current_locks:
            steps.append({"name": "release version locks", "argv": ["dnf", "versionlock", "delete"] + current_locks})
        if reset:
            steps.append({"name": "reset the module stream", "argv": ["dnf", "-y", "module", "reset", "nvidia-driver"]})
        if reset or not current_stream:
            steps.append({"name": "enable the module stream",
                          "argv": ["dnf", "-y", "module", "enable", "nvidia-driver:%s" % stream]})
        excludes = []
        for kernel in DNF_KERNEL_EXCLUDES:
            excludes += ["--exclude", kernel]
        for old, new in swap:
            steps.append({"name": "swap the kernel module flavour", "argv": ["dnf", "-y"] + excludes + ["swap", old, new]})
        if rest_removals:
            steps.append({"name": "remove packages without a counterpart",
                          "argv": ["dnf", "-y", "remove", "--noautoremove"] + rest_removals})
        if downgrade:
            steps.append({"name": "downgrade the driver set", "argv": ["dnf", "-y"] + excludes + ["downgrade"] + downgrade})
        if install:
            steps.append({"name": "install the driver set", "argv": ["dnf", "-y"] + excludes + ["install"] + install})
    if changing or repin:
        steps.append({"name": "lock the driver set", "argv": ["dnf", "versionlock", "add"] + versionlock})
    return {
        "install": install + downgrade + [s[1] for s in swap],
        "unhold": current_locks if changing else [],
        "hold": [p["name"] for p in packages],
        "preferences": None,
        "origin_preferences": None,
        "module": {"name": "nvidia-driver", "stream": stream, "current": current_stream, "reset": reset},
        "versionlock": versionlock,
        "swap": swap,
        "steps": steps,
        "_repin": repin,
    }
