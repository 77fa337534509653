# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The apt side of the driver transaction: holds, the pin and origin pin files, and the install steps.

Pure: no file, process or network access. Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

from typing import Iterable

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import version_key
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_packages import is_driver_package
from ansible_collections.gpufleet.nvidia.plugins.module_utils.package_sets import installed_driver_version


PREFERENCES_PATH = "/etc/apt/preferences.d/gpufleet-nvidia-driver"


ORIGIN_PREFERENCES_PATH = "/etc/apt/preferences.d/gpufleet-nvidia-origin"


DEFAULT_ORIGIN_PIN = "release l=NVIDIA CUDA"


APT_INSTALL_OPTIONS = [
    "-y",
    "--no-install-recommends",
    "-o", "Dpkg::Options::=--force-confdef",
    "-o", "Dpkg::Options::=--force-confold",
]


APT_PIN_GLOBS = ("nvidia-*", "libnvidia-*", "libcuda*", "libnvcuvid*", "libnvoptix*", "firmware-nvidia-*",
                 "cuda-drivers*", "xserver-xorg-video-nvidia*", "libxnvctrl*", "libnvsdm*")


def apt_preferences(names: Iterable[str], version: str, branch: str) -> str:
    """Content of the apt preferences file that pins the driver set at one version.

    One record, priority 1001, for every NVIDIA driver package name (globs ``nvidia-*``,
    ``libnvidia-*``, ``libcuda*``, ``firmware-nvidia-*``, ``cuda-drivers*`` ...) at the target
    version: apt makes exactly this version the candidate of every package of the set - also of
    dependencies the transaction does not name, which otherwise resolve to the newest branch
    (``cuda-drivers-580`` depends on ``nvidia-driver (>= 580.65.06)`` and pulled 590) - even
    where that is a downgrade (apt_preferences(5): P >= 1000 "causes a version to be installed
    even if this constitutes a downgrade"). Other versions keep their default priority: the
    holds stop them. The Debian revision is matched by ``-*`` (Debian ``580.126.20-1``, Ubuntu
    ``580.126.20-1ubuntu1``, Fabric Manager ``580.126.20-1``). The file sorts before NVIDIA's own
    ``nvidia-driver-pin`` file, so for the target version this record is the first match.

    :param names: the package set, listed in the explanation.
    """
    listed = " ".join(sorted(set(names)))
    return (
        "# Managed by gpufleet.nvidia (role driver). Change the driver through the role.\n"
        "# Set: %s\n"
        "Explanation: NVIDIA driver R%s pinned at %s\n"
        "Package: %s\n"
        "Pin: version %s-*\n"
        "Pin-Priority: 1001\n" % (listed, branch, version, " ".join(APT_PIN_GLOBS), version)
    )


def apt_origin_preferences(origin_pin: str = DEFAULT_ORIGIN_PIN) -> str:
    """Content of the origin pin that prefers the NVIDIA repository (priority 600) over other
    origins offering the same package names (Debian's own ``nvidia-driver``, Canonical's
    ``nvidia-*-server``): field case 18, NVIDIA/ansible-role-nvidia-driver PR #11.

    :param origin_pin: the ``Pin:`` value, e.g. ``"release l=NVIDIA CUDA"`` or ``"origin mirror.example"``.
    """
    return (
        "# Managed by gpufleet.nvidia (role driver).\n"
        "Explanation: prefer the NVIDIA driver repository over other origins of the same names\n"
        "Package: *\n"
        "Pin: %s\n"
        "Pin-Priority: 600\n" % origin_pin
    )


def plan_apt(distribution, branch, version, packages, inst, held_names, removals, origin_pin,
             current_preferences):
    """The apt half of :func:`package_transaction.plan_transaction`: install specs, holds, pin files, steps.

    :param packages: the set with the versions picked (``plan_transaction``'s ``packages``).
    :param inst: installed records by name (``package_sets.installed_map``).
    :param held_names: names on hold now; :param removals: names that leave.
    :param current_preferences: the pin file's content now, or ``None``.
    :returns: the apt keys of the plan (``install``, ``unhold``, ``hold``, ``preferences``,
        ``origin_preferences``, ``steps``, ...) and ``_repin``.
    """
    install = []
    for pkg in packages:
        if pkg["installed_version"] and pkg["installed_version"] == pkg["version"]:
            continue
        if pkg["version"] is None:
            install.append(pkg["name"])
        else:
            install.append("%s=%s" % (pkg["name"], pkg["version"]))
    set_names = [p["name"] for p in packages]
    pinned_names = [p["name"] for p in packages if p["role"] != "pin"]
    # Field case 17: every NVIDIA driver package that stays installed is held.
    keep = [n for n in inst if is_driver_package(n) and n not in removals]
    hold = sorted(set(set_names) | set(keep))
    # A hold blocks apt whether or not the package is installed: a driver package held while not
    # installed (``hn``: removed by a failed transaction, then held again) is released as well,
    # or the install of the set stops at "Held packages were changed".
    unhold = sorted(n for n in held_names if n in removals or n in set_names or is_driver_package(n))
    preferences = apt_preferences(pinned_names, version, branch)
    origin = apt_origin_preferences(origin_pin)
    repin = (current_preferences != preferences) or sorted(held_names & set(hold)) != hold
    steps = []
    if install or removals:
        if unhold:
            steps.append({"name": "release holds", "argv": ["apt-mark", "unhold"] + unhold})
        steps.append({"name": "write the origin pin", "path": ORIGIN_PREFERENCES_PATH, "content": origin})
        steps.append({"name": "write the pin file", "path": PREFERENCES_PATH, "content": preferences})
        argv = ["apt-get", "install"] + list(APT_INSTALL_OPTIONS)
        inst_version = installed_driver_version(inst.values())
        if inst_version and version_key(inst_version) > version_key(version):
            argv.append("--allow-downgrades")
        argv += install + ["%s-" % n for n in removals]
        steps.append({"name": "install the driver set", "argv": argv})
        steps.append({"name": "hold the driver set", "argv": ["apt-mark", "hold"] + hold})
    elif repin:
        steps.append({"name": "write the origin pin", "path": ORIGIN_PREFERENCES_PATH, "content": origin})
        steps.append({"name": "write the pin file", "path": PREFERENCES_PATH, "content": preferences})
        steps.append({"name": "hold the driver set", "argv": ["apt-mark", "hold"] + hold})
    return {
        "install": install,
        "unhold": unhold if (install or removals) else [],
        "hold": hold,
        "preferences": {"path": PREFERENCES_PATH, "content": preferences},
        "origin_preferences": {"path": ORIGIN_PREFERENCES_PATH, "content": origin},
        "module": None,
        "versionlock": None,
        "swap": [],
        "steps": steps,
        "_repin": repin,
    }
