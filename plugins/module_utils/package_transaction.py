# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The exact package transaction that puts one NVIDIA driver version on a node and pins it.

Given the distribution, the resolved driver (branch, version, kernel module flavour), whether
Fabric Manager is needed, what is installed (``dpkg -l`` / ``rpm -qa`` records from
``driver_state``) and what the repository offers, :func:`plan_transaction` computes:

* the package set by distribution and branch generation - Ubuntu names carry the branch
  (``libnvidia-compute-580``) up to R580 and drop it from R590, where the branch pinning
  package ``nvidia-driver-pinning-<branch>`` takes over; Debian 12 names never carry it
  (Fabric Manager did up to R575); RHEL 8/9 use the ``nvidia-driver`` module stream
  ``<branch>-open`` / ``<branch>-dkms`` (source: docs/packages.md and the NVIDIA Driver
  Installation Guide);
* Fabric Manager and NSCQ at the **same exact version** as the driver (field case 11);
* one transaction that takes the **whole** set to the target, including every driver package of
  the old set renamed for the new branch (field case 18), removing what has no counterpart;
* holds released before and taken again after (every NVIDIA driver package installed, field
  case 17), the apt preferences pin (exact version, priority 1001, which also allows
  downgrades) and an origin pin for the NVIDIA repository (priority 600, field case 18), or for
  dnf the ``versionlock`` entries and ``dnf module reset`` before a stream switch (field case 21);
* the ordered steps, as argv lists and file writes, that the ``driver_transaction`` module runs -
  and shows in check mode.

The package set is in ``package_sets``, the repository's versions in ``repository_versions``, the
apt and dnf halves in ``apt_plan`` and ``dnf_plan``.

Everything here is pure: no file, process or network access.

Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import version_key
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_packages import is_driver_package
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import upstream_version
from ansible_collections.gpufleet.nvidia.plugins.module_utils.apt_plan import DEFAULT_ORIGIN_PIN, plan_apt
from ansible_collections.gpufleet.nvidia.plugins.module_utils.distributions import (
    PlanError,
    check_distribution,
    package_manager,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.dnf_plan import plan_dnf
from ansible_collections.gpufleet.nvidia.plugins.module_utils.package_sets import (
    OWN_VERSION,
    PRECOMPILED_KMOD,
    generation,
    installed_driver_version,
    installed_map,
    is_other_flavour,
    package_set,
    pin_package_name,
    rename_for_branch,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.repository_versions import pick_version


def plan_transaction(distribution: str, branch: str, version: str, kernel_module_type: str,
                     fabric_manager: bool = False, persistenced: bool = True,
                     installed: Optional[Iterable[Dict[str, Any]]] = None,
                     available: Optional[Dict[str, List[str]]] = None,
                     held: Optional[Iterable[str]] = None,
                     current_stream: Optional[str] = None,
                     locked: Optional[Iterable[str]] = None,
                     origin_pin: str = DEFAULT_ORIGIN_PIN,
                     current_preferences: Optional[str] = None) -> Dict[str, Any]:
    """Plan the exact transaction that installs and pins one driver version.

    :param distribution: one of :data:`DISTRIBUTIONS`.
    :param branch: ``"580"``; :param version: ``"580.126.20"``; :param kernel_module_type:
        ``open`` or ``proprietary`` (already resolved).
    :param fabric_manager: NVSwitch systems: add Fabric Manager and NSCQ at the same version.
    :param persistenced: add ``nvidia-persistenced`` where it is a package of its own.
    :param installed: installed package records (``driver_state.parse_dpkg_l`` / ``parse_rpm_qa``);
        only driver packages matter.
    :param available: ``{name: [full versions]}`` the repository offers (``parse_apt_cache_madison``,
        ``parse_dnf_list``); ``None`` when unknown (then Debian versions are taken as
        ``<version>-1`` and Ubuntu's are left as ``<version>-*`` patterns).
    :param held: names on hold (``apt-mark showhold``); default: ``held`` of ``installed``.
    :param current_stream: RHEL: the enabled ``nvidia-driver`` stream, ``None`` if none.
    :param locked: RHEL: current versionlock entries of NVIDIA packages (to delete before).
    :param origin_pin: apt ``Pin:`` value of the repository origin pin.
    :param current_preferences: apt: the current content of the pin file, to tell whether it changes.
    :returns: ``{"distribution", "package_manager", "branch", "version", "kernel_module_type",
        "generation", "current_version", "packages": [{"name", "version", "role", "installed_version"}],
        "install": [str], "remove": [str], "skipped": [str] (optional packages the repository lacks),
        "unhold": [str], "hold": [str], "pin_package": str|None,
        "preferences": {"path", "content"}|None, "origin_preferences": {"path", "content"}|None,
        "module": {"name", "stream", "current", "reset": bool}|None, "versionlock": [str]|None,
        "swap": [[old, new]], "steps": [{"name", "argv"|"path"+"content"}],
        "changes": {"install", "upgrade", "downgrade", "branch_change", "flavour_change",
        "repin"}, "noop": bool}``.
    :raises PlanError: ``not_in_repository`` naming the packages and versions missing,
        ``unsupported_distribution``, ``bad_request``.
    """
    check_distribution(distribution)
    branch = str(branch)
    if upstream_version(version) != version or not re.match(r"^\d+(?:\.\d+){1,3}$", str(version)):
        raise PlanError("bad_request", "version must be an NVIDIA driver version such as 580.126.20, got %r"
                        % (version,))
    if version.split(".")[0] != branch:
        raise PlanError("bad_request", "version %s is not in branch R%s" % (version, branch))
    pm = package_manager(distribution)
    inst = installed_map(installed)
    held_names = set(held) if held is not None else set(p["name"] for p in installed or [] if p.get("name") and p.get("held"))
    current_version = installed_driver_version(inst.values())
    current_branch = current_version.split(".")[0] if current_version else None

    wanted = package_set(distribution, branch, kernel_module_type, fabric_manager, persistenced)
    wanted_names = [w["name"] for w in wanted]
    # Field case 18: every driver package of the old set comes along, renamed for the new branch.
    removals = []
    for name in sorted(inst):
        if not is_driver_package(name) or name in wanted_names:
            continue
        if OWN_VERSION.match(name):
            if name != pin_package_name(distribution, branch):
                removals.append(name)
            continue
        renamed = rename_for_branch(name, distribution, current_branch, branch)
        if renamed in wanted_names:
            if renamed != name:
                removals.append(name)
            continue
        if is_other_flavour(renamed, kernel_module_type) or PRECOMPILED_KMOD.match(name):
            removals.append(name)
            continue
        if available is not None and pick_version(renamed, version, available, distribution) is None:
            removals.append(name)
            continue
        if renamed != name:
            removals.append(name)
        wanted.append({"name": renamed, "role": "carried"})
        wanted_names.append(renamed)

    packages = []
    missing = []
    skipped = []
    for item in wanted:
        name = item["name"]
        if item["role"] == "pin":
            versions = (available or {}).get(name) if available is not None else None
            if available is not None and not versions:
                missing.append("%s (any version)" % name)
                continue
            full = sorted(versions)[-1] if versions else None
        else:
            full = pick_version(name, version, available, distribution)
            if full is None and available is not None:
                if item["role"] == "nscq":
                    skipped.append(name)
                    continue
                missing.append("%s=%s" % (name, version))
                continue
        packages.append({
            "name": name,
            "version": full,
            "role": item["role"],
            "installed_version": (inst.get(name) or {}).get("version"),
        })
    if missing:
        raise PlanError("not_in_repository", "the repository does not offer %s; R%s %s cannot be installed as a "
                        "whole set" % (", ".join(missing), branch, version))

    if pm == "apt":
        plan = plan_apt(distribution, branch, version, packages, inst, held_names, removals,
                        origin_pin, current_preferences)
    else:
        plan = plan_dnf(distribution, branch, version, kernel_module_type, packages, inst, removals,
                        current_stream, locked)
    plan.update({
        "distribution": distribution,
        "package_manager": pm,
        "branch": branch,
        "version": version,
        "kernel_module_type": kernel_module_type,
        "generation": generation(distribution, branch),
        "current_version": current_version,
        "packages": packages,
        "remove": removals,
        "pin_package": pin_package_name(distribution, branch),
        "skipped": skipped,
    })
    downgrade = bool(current_version) and version_key(current_version) > version_key(version)
    upgrade = bool(current_version) and version_key(current_version) < version_key(version)
    plan["changes"] = {
        "install": bool(plan["install"]),
        "upgrade": upgrade,
        "downgrade": downgrade,
        "branch_change": bool(current_branch) and current_branch != branch,
        "flavour_change": any(is_other_flavour(n, kernel_module_type) or PRECOMPILED_KMOD.match(n)
                              for n in removals),
        "repin": plan.pop("_repin"),
    }
    plan["noop"] = not plan["install"] and not removals and not plan["changes"]["repin"]
    return plan
