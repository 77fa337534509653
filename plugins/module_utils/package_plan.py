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
* the ordered steps, as argv lists and file writes, that the role runs - and shows in check mode.

The classifiers at the end read the outputs of apt and dnf (field cases 18, 20, 21) and the
module a build left on disk (field cases 23, 24).

Everything here is pure: no file, process or network access.

Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils.branch_catalog import version_key
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_state import (
    is_driver_package,
    upstream_version,
    versions_match,
)

DISTRIBUTIONS = ("debian12", "ubuntu2204", "ubuntu2404", "rhel8", "rhel9")

PREFERENCES_PATH = "/etc/apt/preferences.d/gpufleet-nvidia-driver"
ORIGIN_PREFERENCES_PATH = "/etc/apt/preferences.d/gpufleet-nvidia-origin"
DEFAULT_ORIGIN_PIN = "release l=NVIDIA CUDA"
VERSIONLOCK_LIST = "/etc/dnf/plugins/versionlock.list"

APT_INSTALL_OPTIONS = [
    "-y",
    "--no-install-recommends",
    "-o", "Dpkg::Options::=--force-confdef",
    "-o", "Dpkg::Options::=--force-confold",
]

# dnf: a driver transaction must never change the kernel (field case 21, stackhpc PR #496).
DNF_KERNEL_EXCLUDES = ["kernel", "kernel-core", "kernel-modules", "kernel-modules-core", "kernel-modules-extra"]

# Package names that belong to NVIDIA's driver set but are versioned on their own: never pinned
# to the driver version.
_OWN_VERSION = re.compile(r"^nvidia-driver-pinning-.+$")


class PlanError(ValueError):
    """The transaction cannot be planned: a package is missing from the repository, the
    distribution is not supported, or the request contradicts itself.

    :ivar code: ``unsupported_distribution``, ``not_in_repository``, ``bad_request``.
    """

    def __init__(self, code: str, message: str):
        ValueError.__init__(self, message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------------------------------------
# Distributions and package names
# ---------------------------------------------------------------------------------------------


def distribution_id(distribution: str, major_version: Any, version: Any = None) -> str:
    """Map Ansible's ``ansible_facts['distribution']`` and version to a plan distribution.

    ``("Debian", "12")`` → ``"debian12"``; ``("Ubuntu", "22", "22.04")`` → ``"ubuntu2204"``;
    ``("RedHat"|"Rocky"|"AlmaLinux"|"CentOS"|"OracleLinux", "9")`` → ``"rhel9"``.

    :raises PlanError: ``unsupported_distribution`` for anything else.
    """
    name = str(distribution or "").strip().lower()
    major = str(major_version or "").strip()
    if name == "debian" and major == "12":
        return "debian12"
    if name == "ubuntu":
        full = str(version or "").strip()
        if full.startswith("22.04") or (not full and major == "22"):
            return "ubuntu2204"
        if full.startswith("24.04") or (not full and major == "24"):
            return "ubuntu2404"
    if name in ("redhat", "rhel", "rocky", "almalinux", "centos", "oraclelinux") and major in ("8", "9"):
        return "rhel" + major
    raise PlanError("unsupported_distribution", "unsupported distribution %s %s; supported: %s"
                    % (distribution, version or major_version, ", ".join(DISTRIBUTIONS)))


def package_manager(distribution: str) -> str:
    """``"apt"`` for Debian and Ubuntu, ``"dnf"`` for RHEL."""
    _check_distribution(distribution)
    return "dnf" if distribution.startswith("rhel") else "apt"


def _check_distribution(distribution: str) -> None:
    if distribution not in DISTRIBUTIONS:
        raise PlanError("unsupported_distribution", "unsupported distribution %r; supported: %s"
                        % (distribution, ", ".join(DISTRIBUTIONS)))


def generation(distribution: str, branch: str) -> str:
    """The naming generation of a branch on a distribution.

    :returns: ``"suffixed"`` (Ubuntu up to R580: ``libnvidia-compute-580``), ``"unsuffixed"``
        (Ubuntu from R590, Debian 12 always) or ``"module-stream"`` (RHEL).
    """
    _check_distribution(distribution)
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
    _check_distribution(distribution)
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
    _check_distribution(distribution)
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


# ---------------------------------------------------------------------------------------------
# Versions in the repository
# ---------------------------------------------------------------------------------------------


def parse_apt_cache_madison(text: Optional[str]) -> Dict[str, List[str]]:
    """Parse ``apt-cache madison <names>``: ``name | version | source`` lines.

    :returns: ``{name: [full Debian versions, as listed]}``; lines for source packages
        (``Sources`` index) are skipped.
    :raises: nothing.
    """
    found = {}  # type: Dict[str, List[str]]
    for raw in (text or "").splitlines():
        parts = [p.strip() for p in raw.split("|")]
        if len(parts) < 3 or not parts[0] or not parts[1]:
            continue
        if parts[2].endswith("Sources"):
            continue
        found.setdefault(parts[0], [])
        if parts[1] not in found[parts[0]]:
            found[parts[0]].append(parts[1])
    return found


def parse_dnf_list(text: Optional[str]) -> Dict[str, List[str]]:
    """Parse ``dnf list --showduplicates --available <names>``: ``name.arch  [epoch:]version-release  repo``.

    :returns: ``{name: ["3:580.126.20-1.el9", ...]}``.
    :raises: nothing.
    """
    found = {}  # type: Dict[str, List[str]]
    for raw in (text or "").splitlines():
        words = raw.split()
        if len(words) < 2 or "." not in words[0] or not re.match(r"^(?:\d+:)?\d", words[1]):
            continue
        name = words[0].rsplit(".", 1)[0]
        found.setdefault(name, [])
        if words[1] not in found[name]:
            found[name].append(words[1])
    return found


def driver_versions_available(available: Optional[Dict[str, List[str]]], probe: Iterable[str]) -> List[str]:
    """Upstream driver versions the repository offers for any of the ``probe`` package names
    (e.g. ``libnvidia-ml1`` on Debian), newest last: the input of ``resolve_driver``."""
    versions = set()
    for name in probe:
        for version in (available or {}).get(name, []):
            up = upstream_version(version)
            if up and re.match(r"^\d+(?:\.\d+){1,3}$", up):
                versions.add(up)
    return sorted(versions, key=version_key)


def version_probe_packages(distribution: str) -> List[str]:
    """Package names whose repository versions tell which driver versions exist (every branch,
    every flavour): ``libnvidia-ml1`` (Debian), ``libnvidia-compute`` and
    ``libnvidia-compute-<b>`` (Ubuntu; the caller adds the suffixed names), ``libnvidia-ml`` (RHEL)."""
    _check_distribution(distribution)
    if distribution == "debian12":
        return ["libnvidia-ml1", "nvidia-driver-cuda"]
    if distribution.startswith("ubuntu"):
        return ["libnvidia-compute"] + ["libnvidia-compute-%d" % b for b in (535, 550, 570, 575, 580)]
    return ["libnvidia-ml", "nvidia-driver-cuda"]


def _pick_version(name: str, version: str, available: Optional[Dict[str, List[str]]],
                  distribution: str) -> Optional[str]:
    """The full package version of ``name`` whose upstream part is ``version``."""
    if available is None:
        if distribution == "debian12":
            return "%s-1" % version
        if distribution.startswith("rhel"):
            return version
        return None
    matches = [v for v in available.get(name, []) if upstream_version(v) == version]
    if not matches:
        return None
    return sorted(matches)[-1]


# ---------------------------------------------------------------------------------------------
# The transaction
# ---------------------------------------------------------------------------------------------


def _installed_map(installed: Optional[Iterable[Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    result = {}
    for pkg in installed or []:
        if not pkg.get("name") or not pkg.get("installed", True):
            continue
        result[pkg["name"]] = pkg
    return result


def _installed_driver_version(installed: Dict[str, Dict[str, Any]]) -> Optional[str]:
    votes = {}  # type: Dict[str, int]
    for name, pkg in installed.items():
        if _OWN_VERSION.match(name) or not is_driver_package(name):
            continue
        up = upstream_version(pkg.get("version"))
        if up and re.match(r"^\d+(?:\.\d+){1,3}$", up):
            votes[up] = votes.get(up, 0) + 1
    if not votes:
        return None
    return sorted(votes.items(), key=lambda kv: (kv[1], version_key(kv[0])))[-1][0]


APT_PIN_GLOBS = ("nvidia-*", "libnvidia-*", "libcuda*", "libnvcuvid*", "libnvoptix*", "firmware-nvidia-*",
                 "cuda-drivers*", "xserver-xorg-video-nvidia*", "libxnvctrl*", "libnvsdm*")


def installed_driver_version(installed: Optional[Iterable[Dict[str, Any]]]) -> Optional[str]:
    """The driver version most installed driver packages carry (pinning packages aside), or ``None``.

    :param installed: records from ``driver_state.parse_dpkg_l`` / ``parse_rpm_qa``.
    """
    return _installed_driver_version(_installed_map(installed))


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
    _check_distribution(distribution)
    branch = str(branch)
    if upstream_version(version) != version or not re.match(r"^\d+(?:\.\d+){1,3}$", str(version)):
        raise PlanError("bad_request", "version must be an NVIDIA driver version such as 580.126.20, got %r"
                        % (version,))
    if version.split(".")[0] != branch:
        raise PlanError("bad_request", "version %s is not in branch R%s" % (version, branch))
    pm = package_manager(distribution)
    inst = _installed_map(installed)
    held_names = set(held) if held is not None else set(p["name"] for p in installed or [] if p.get("name") and p.get("held"))
    current_version = _installed_driver_version(inst)
    current_branch = current_version.split(".")[0] if current_version else None

    wanted = package_set(distribution, branch, kernel_module_type, fabric_manager, persistenced)
    wanted_names = [w["name"] for w in wanted]
    # Field case 18: every driver package of the old set comes along, renamed for the new branch.
    removals = []
    for name in sorted(inst):
        if not is_driver_package(name) or name in wanted_names:
            continue
        if _OWN_VERSION.match(name):
            if name != pin_package_name(distribution, branch):
                removals.append(name)
            continue
        renamed = rename_for_branch(name, distribution, current_branch, branch)
        if renamed in wanted_names:
            if renamed != name:
                removals.append(name)
            continue
        if _is_other_flavour(renamed, kernel_module_type) or _PRECOMPILED_KMOD.match(name):
            removals.append(name)
            continue
        if available is not None and _pick_version(renamed, version, available, distribution) is None:
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
            full = _pick_version(name, version, available, distribution)
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
        plan = _plan_apt(distribution, branch, version, packages, inst, held_names, removals,
                         origin_pin, current_preferences)
    else:
        plan = _plan_dnf(distribution, branch, version, kernel_module_type, packages, inst, removals,
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
        "flavour_change": any(_is_other_flavour(n, kernel_module_type) or _PRECOMPILED_KMOD.match(n)
                              for n in removals),
        "repin": plan.pop("_repin"),
    }
    plan["noop"] = not plan["install"] and not removals and not plan["changes"]["repin"]
    return plan


# A precompiled kmod for one kernel: kmod-nvidia-<driver version>-<kernel release> (RHEL stream
# "<branch>"); the DKMS streams this collection installs conflict with it (field case 21).
_PRECOMPILED_KMOD = re.compile(r"^kmod-nvidia-\d+\.\d+(?:\.\d+)?-\d.*$")


def _is_other_flavour(name: str, kernel_module_type: str) -> bool:
    """Is ``name`` the kernel module package of the other flavour?"""
    open_pkgs = re.compile(r"^(?:nvidia-kernel-open-dkms|nvidia-dkms(?:-\d+)?-open|nvidia-kernel-source(?:-\d+)?-open"
                           r"|kmod-nvidia-open-dkms)$")
    prop_pkgs = re.compile(r"^(?:nvidia-kernel-dkms|nvidia-dkms(?:-\d+)?|nvidia-kernel-source(?:-\d+)?"
                           r"|kmod-nvidia-latest-dkms)$")
    if kernel_module_type == "open":
        return bool(prop_pkgs.match(name))
    return bool(open_pkgs.match(name))


def _plan_apt(distribution, branch, version, packages, inst, held_names, removals, origin_pin,
              current_preferences):
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
        inst_version = _installed_driver_version(inst)
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


def _plan_dnf(distribution, branch, version, kernel_module_type, packages, inst, removals,
              current_stream, locked):
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


# ---------------------------------------------------------------------------------------------
# Kernel holds and automatic updates
# ---------------------------------------------------------------------------------------------

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


def dnf_automatic_excludes(extra: Optional[Iterable[str]] = None) -> List[str]:
    """Globs for ``exclude=`` in the ``[base]`` section of ``/etc/dnf/automatic.conf``: the kernel
    and the NVIDIA driver (``dnf-automatic(8)``: ``[base]`` overrides dnf.conf options)."""
    return ["kernel*", "kmod-nvidia*", "nvidia-*", "libnvidia-*", "cuda-drivers*"] + [e for e in (extra or []) if e]


# ---------------------------------------------------------------------------------------------
# Reading what apt, dnf and the module build left behind
# ---------------------------------------------------------------------------------------------


def classify_apt_failure(rc: Optional[int], stdout: Optional[str] = "", stderr: Optional[str] = "") -> Dict[str, Any]:
    """Classify a failed apt-get run.

    Field case 18: rc 100 with "Unable to correct problems, you have held broken packages" is a
    **dependency conflict** (a pin, a hold or a missing package of the set), not a transient
    error: do not retry; show the "unmet dependencies" block.

    Field case 34: ``Failed to fetch … 404 Not Found`` means the repository answered and the file
    is gone: a stale index or a pinned version the archive withdrew (``withdrawn``), not an
    outage; retrying the same command fails the same way.

    :returns: ``{"kind": "dependency_conflict"|"lock"|"network"|"dpkg_interrupted"|"not_found"|
        "withdrawn"|"other", "retry": bool, "unmet": [lines], "message": str}``.
    """
    text = "%s\n%s" % (stdout or "", stderr or "")
    unmet = []
    capture = False
    for line in text.splitlines():
        stripped = line.strip()
        if "unmet dependencies" in stripped:
            capture = True
            continue
        if capture:
            if stripped.startswith("E:"):
                capture = False
            elif stripped:
                unmet.append(stripped)
    if "held broken packages" in text or "unmet dependencies" in text:
        kind, retry = "dependency_conflict", False
        message = ("apt could not resolve the dependencies of the requested set (rc %s): a hold, a pin or a "
                   "package of another origin or branch blocks it; not retried" % rc)
    elif "Could not get lock" in text or "Unable to acquire the dpkg frontend lock" in text:
        kind, retry, message = "lock", True, "another package manager holds the dpkg lock"
    elif "dpkg was interrupted" in text:
        kind, retry, message = "dpkg_interrupted", False, "dpkg was interrupted; run 'dpkg --configure -a'"
    elif "Unable to locate package" in text or "Version '" in text and "was not found" in text:
        kind, retry, message = "not_found", False, "a requested package or version is not in the repository"
    elif re.search(r"\b404\s+Not Found\b", text):
        kind, retry = "withdrawn", False
        message = ("the repository answered 404 Not Found for a package of the pinned version: the package index "
                   "is stale or the version was withdrawn; run apt-get update and check the exact version with "
                   "apt-cache madison, or choose a published version or a mirror; not retried")
    elif re.search(r"(Temporary failure resolving|Failed to fetch|Could not connect|Connection failed)", text):
        kind, retry, message = "network", True, "the repository could not be reached"
    else:
        kind, retry, message = "other", False, "apt-get failed (rc %s)" % rc
    return {"kind": kind, "retry": retry, "unmet": unmet, "message": message, "rc": rc}


def classify_dnf_kernel_hold(text: Optional[str]) -> Dict[str, Any]:
    """Read the output of ``dnf update`` / ``dnf nvidia-plugin`` on a node with precompiled kmods.

    Field case 20. NVIDIA's dnf plugin skips a kernel for which no precompiled
    ``kmod-nvidia-<driver>-<kernel>`` exists: that is an **expected hold** (report the candidate
    kernel and the driver), not a broken host. A Python exception from the plugin
    ("kernel exclude error ...") is a **failure of the kernel blocker** itself.

    :returns: ``{"verdict": "kernel_held_expected"|"kernel_blocker_failure"|"none",
        "driver_version": str|None, "candidate_kernel": str|None, "kmod_package": str|None,
        "excluded_packages": [str], "error_text": str|None}``.
    """
    result = {"verdict": "none", "driver_version": None, "candidate_kernel": None, "kmod_package": None,
              "excluded_packages": [], "error_text": None}
    body = text or ""
    failure = re.search(r"WARNING: kernel exclude error (.+)", body)
    if failure:
        result["verdict"] = "kernel_blocker_failure"
        result["error_text"] = failure.group(1).strip()
    skip = re.search(r"no kernel module package (\S+) for kernel version (\S+) and NVIDIA driver (\S+) could be found",
                     body)
    if skip:
        result["kmod_package"] = skip.group(1)
        result["candidate_kernel"] = skip.group(2)
        result["driver_version"] = skip.group(3)
    report = re.search(r"Excluded kernel packages during update \(([^)]+)\):", body)
    if report:
        result["candidate_kernel"] = result["candidate_kernel"] or report.group(1)
        tail = body[report.end():]
        for line in tail.splitlines():
            word = line.strip()
            if not word:
                if result["excluded_packages"]:
                    break
                continue
            if re.match(r"^kernel[\w.+-]*-\d", word):
                result["excluded_packages"].append(word)
            else:
                break
    if result["verdict"] == "none" and (skip or report or "filtered due to missing precompiled modules" in body):
        result["verdict"] = "kernel_held_expected"
    return result


def classify_dnf_failure(text: Optional[str]) -> Dict[str, Any]:
    """Classify a failed dnf driver transaction (field case 21).

    :returns: ``{"kind": "stream_switch_refused"|"flavour_conflict"|"depsolve_conflict"|"other",
        "from_stream": str|None, "to_stream": str|None, "packages": [str], "remedy": str}``:
        a stream switch needs ``dnf module reset nvidia-driver`` first; a precompiled kmod
        conflicts with a DKMS kmod (swap them explicitly, never ``--allowerasing``); a depsolve
        problem names the packages whose versions must be pinned together.
    """
    body = text or ""
    switch = re.search(r"switching of module '([^']+)' stream\s+'([^']*)' to stream '([^']+)'", body)
    if switch or "module_stream_switch" in body:
        return {"kind": "stream_switch_refused",
                "from_stream": switch.group(2) if switch else None,
                "to_stream": switch.group(3) if switch else None,
                "packages": [], "remedy": "dnf module reset %s, then enable the new stream and install"
                % (switch.group(1) if switch else "nvidia-driver")}
    conflict = re.search(r"package (kmod-nvidia\S+) from @System conflicts with (\S+) provided by (\S+)", body)
    if conflict:
        return {"kind": "flavour_conflict", "from_stream": None, "to_stream": None,
                "packages": [conflict.group(1), conflict.group(3)],
                "remedy": "the installed precompiled module and the DKMS module are exclusive: keep the installed "
                          "flavour or swap it explicitly (dnf swap); never --allowerasing on a running node"}
    problem = re.search(r"Problem: package (\S+) from \S+ requires (.+?), but none of the providers", body)
    if problem:
        return {"kind": "depsolve_conflict", "from_stream": None, "to_stream": None,
                "packages": [problem.group(1), problem.group(2).strip()],
                "remedy": "pin the driver and the CUDA packages to versions that agree"}
    return {"kind": "other", "from_stream": None, "to_stream": None, "packages": [], "remedy": ""}


def verify_module_build(target_version: str, on_disk_version: Optional[str], running_kernel: Optional[str] = None,
                        modules_by_kernel: Optional[Dict[str, List[str]]] = None) -> Dict[str, Any]:
    """Check, before any reboot, that the module the running kernel will load is the target build.

    Field case 23: DKMS left 595.80 on disk while the userspace is 595.84 - **broken**, a reboot
    does not help. Field case 24: no ``nvidia.ko`` for the running kernel at all (only for an older
    one) - **not built for the running kernel**.

    :param target_version: the driver version just installed.
    :param on_disk_version: ``modinfo -F version nvidia`` for the running kernel, ``None`` when
        modinfo found no module.
    :param running_kernel: ``uname -r``.
    :param modules_by_kernel: ``{kernel release: [module files]}`` (``driver_state.nvidia_modules_by_kernel``).
    :returns: ``{"verdict": "ok"|"broken"|"not_built_for_running_kernel", "expected", "found",
        "running_kernel", "module_present_for": [kernels], "message": str}``.
    """
    present = sorted(k for k, mods in (modules_by_kernel or {}).items() if mods)
    result = {"expected": target_version, "found": on_disk_version, "running_kernel": running_kernel,
              "module_present_for": present}
    if not on_disk_version:
        result["verdict"] = "not_built_for_running_kernel"
        result["message"] = ("no nvidia module for the running kernel %s%s; rebuild it (DKMS) or boot a kernel it "
                             "was built for" % (running_kernel or "?",
                                                " (present for %s)" % ", ".join(present) if present else ""))
    elif versions_match(on_disk_version, target_version):
        result["verdict"] = "ok"
        result["message"] = "the module on disk for %s is %s" % (running_kernel or "the running kernel", on_disk_version)
    else:
        result["verdict"] = "broken"
        where = running_kernel or "the running kernel"
        result["message"] = ("the module on disk for %s is %s but the driver installed is %s: a reboot would load "
                             "the wrong module; rebuild or reinstall it" % (where, on_disk_version, target_version))
    return result


# ---------------------------------------------------------------------------------------------
# Local facts: current, last known-good, history
# ---------------------------------------------------------------------------------------------


def update_local_facts(previous: Optional[Dict[str, Any]], version: str, branch: str, when: str,
                       action: str, verified_good: Optional[str] = None, history_limit: int = 50,
                       kernel_module_type: Optional[str] = None) -> Dict[str, Any]:
    """The next content of the driver's local facts (``/etc/ansible/facts.d/gpufleet_driver.fact``).

    :param previous: the current content (``{}``/``None`` on a fresh node).
    :param version: the version now installed and pinned; :param branch: its branch.
    :param when: an ISO 8601 timestamp.
    :param action: ``install``, ``upgrade``, ``downgrade``, ``branch_change``, ``repin`` or
        ``known_good``.
    :param verified_good: a version seen running healthy (loaded == installed, state ``ok``) in
        this run; it becomes ``last_known_good``.
    :returns: ``{"schema_version": 1, "current": {"version", "branch", "kernel_module_type",
        "since"}, "previous": {...}|None, "last_known_good": {"version", "branch", "since"}|None,
        "history": [{"time", "action", "from", "to"}] newest last, at most ``history_limit``}``.
    """
    prev = dict(previous or {})
    current = prev.get("current") or None
    history = list(prev.get("history") or [])
    result = {
        "schema_version": 1,
        "current": current,
        "previous": prev.get("previous"),
        "last_known_good": prev.get("last_known_good"),
        "history": history,
    }
    if verified_good:
        lkg = result["last_known_good"] or {}
        if lkg.get("version") != verified_good:
            result["last_known_good"] = {"version": verified_good, "branch": verified_good.split(".")[0],
                                         "since": when}
    from_version = current.get("version") if current else None
    if from_version != version:
        result["previous"] = current
        result["current"] = {"version": version, "branch": str(branch), "kernel_module_type": kernel_module_type,
                             "since": when}
        history.append({"time": when, "action": action, "from": from_version, "to": version})
    elif action == "repin":
        history.append({"time": when, "action": action, "from": from_version, "to": version})
    elif verified_good and verified_good != (prev.get("last_known_good") or {}).get("version"):
        history.append({"time": when, "action": "known_good", "from": from_version, "to": version})
    result["history"] = history[-history_limit:]
    return result


# ---------------------------------------------------------------------------------------------
# Repository signing key
# ---------------------------------------------------------------------------------------------


def normalize_fingerprint(value: Any) -> str:
    """``"a1b2 C3D4 ..."`` → ``"A1B2C3D4..."`` (upper case, no spaces or ``0x``)."""
    text = re.sub(r"\s+", "", str(value or "")).upper()
    return text[2:] if text.startswith("0X") else text


def gpg_primary_fingerprints(colons: Optional[str]) -> List[str]:
    """Primary-key fingerprints in ``gpg --show-keys --with-colons`` output (gpg(1), DETAILS:
    a ``pub`` record is followed by its ``fpr`` record, field 10 the fingerprint; ``sub``
    records and their ``fpr`` are subkeys and are skipped).

    :returns: upper-case fingerprints in file order.
    """
    found = []
    expect = False
    for line in (colons or "").splitlines():
        fields = line.split(":")
        if fields[0] == "pub":
            expect = True
        elif fields[0] == "sub":
            expect = False
        elif fields[0] == "fpr" and expect and len(fields) > 9:
            found.append(fields[9].upper())
            expect = False
    return found


def check_signing_key(colons: Optional[str], expected: Any) -> Dict[str, Any]:
    """Verify that a repository key file holds exactly the expected primary key.

    :param colons: ``gpg --show-keys --with-colons`` output for the key file.
    :param expected: the fingerprint the operator pinned (``driver_apt_key_fingerprint``).
    :returns: ``{"ok": bool, "expected": str, "found": [str], "message": str}``; ``ok`` only when
        the file holds one primary key and it is the expected one (a file that adds other keys
        is refused too: it would widen trust).
    """
    want = normalize_fingerprint(expected)
    found = gpg_primary_fingerprints(colons)
    ok = bool(want) and found == [want]
    if ok:
        message = "repository key %s verified" % want
    elif not want:
        message = "no fingerprint pinned for the repository key (driver_apt_key_fingerprint)"
    elif want not in found:
        message = "the repository key has fingerprint %s, not the pinned %s" % (", ".join(found) or "none", want)
    else:
        message = "the repository key file holds more keys than the pinned one: %s" % ", ".join(found)
    return {"ok": ok, "expected": want, "found": found, "message": message}


# ---------------------------------------------------------------------------------------------
# Repository configuration
# ---------------------------------------------------------------------------------------------

NVIDIA_REPO_BASE = "https://developer.download.nvidia.com/compute/cuda/repos"

# NVIDIA CUDA repository signing keys (the key file in each repository directory and its
# fingerprint): Debian/Ubuntu ``3bf863cc.pub``, RHEL ``D42D0685.pub``. Sources: the repository
# directories, and public install scripts that pin them (docs/packages.md).
NVIDIA_REPO_KEYS = {
    "apt": {"file": "3bf863cc.pub", "fingerprint": "EB693B3035CD5710E231E123A4B469963BF863CC"},
    "dnf": {"file": "D42D0685.pub", "fingerprint": "610C7B14E068A878070DA4E99CD0A493D42D0685"},
}

APT_KEYRING_PATH = "/etc/apt/keyrings/gpufleet-nvidia-driver.asc"
APT_SOURCES_PATH = "/etc/apt/sources.list.d/gpufleet-nvidia-driver.list"
DNF_KEY_PATH = "/etc/pki/rpm-gpg/gpufleet-nvidia-driver.asc"
DNF_REPO_PATH = "/etc/yum.repos.d/gpufleet-nvidia-driver.repo"
DNF_REPO_ID = "gpufleet-nvidia-driver"


def repository_config(distribution: str, url: Optional[str] = None, fingerprint: Optional[str] = None,
                      arch: str = "x86_64", suite: str = "/", components: Optional[Iterable[str]] = None,
                      fingerprint_in_sources: bool = True) -> Dict[str, Any]:
    """The repository files the driver role writes, for NVIDIA's CUDA repository or a mirror.

    apt: a keyring file and one ``deb`` line whose ``signed-by`` names that keyring and, unless
    disabled, the pinned fingerprint (sources.list(5): signed-by takes keyring paths "and
    fingerprints of keys to select from these keyrings"), so that nothing but the pinned key can
    sign the repository; never ``trusted=yes``. dnf: a ``.repo`` file with ``gpgcheck=1`` and the
    key file.

    :param url: the repository (a mirror for air-gapped sites); default NVIDIA's
        ``https://developer.download.nvidia.com/compute/cuda/repos/<distribution>/<arch>/``.
    :param fingerprint: the pinned key fingerprint; default NVIDIA's key for the package manager.
    :returns: apt: ``{"package_manager": "apt", "url", "key_url", "fingerprint", "keyring_path",
        "sources_path", "sources_content", "suite", "components"}``; dnf: ``{"package_manager": "dnf",
        "url", "key_url", "fingerprint", "key_path", "repo_path", "repo_id", "repo_content"}``.
    """
    pm = package_manager(distribution)
    base = url or "%s/%s/%s/" % (NVIDIA_REPO_BASE, distribution, arch)
    if not base.endswith("/"):
        base += "/"
    key = NVIDIA_REPO_KEYS[pm]
    fpr = normalize_fingerprint(fingerprint or key["fingerprint"])
    key_url = base + key["file"]
    if pm == "apt":
        signed_by = APT_KEYRING_PATH + ("," + fpr if fingerprint_in_sources else "")
        comps = " ".join(components or [])
        line = ("deb [signed-by=%s] %s %s %s" % (signed_by, base, suite or "/", comps)).rstrip()
        return {
            "package_manager": "apt",
            "url": base,
            "key_url": key_url,
            "fingerprint": fpr,
            "keyring_path": APT_KEYRING_PATH,
            "sources_path": APT_SOURCES_PATH,
            "sources_content": "# Managed by gpufleet.nvidia (role driver)\n%s\n" % line,
            "suite": suite or "/",
            "components": list(components or []),
        }
    content = (
        "# Managed by gpufleet.nvidia (role driver)\n"
        "[%s]\n"
        "name=NVIDIA driver repository (gpufleet.nvidia)\n"
        "baseurl=%s\n"
        "enabled=1\n"
        "gpgcheck=1\n"
        "gpgkey=file://%s\n" % (DNF_REPO_ID, base, DNF_KEY_PATH)
    )
    return {
        "package_manager": "dnf",
        "url": base,
        "key_url": key_url,
        "fingerprint": fpr,
        "key_path": DNF_KEY_PATH,
        "repo_path": DNF_REPO_PATH,
        "repo_id": DNF_REPO_ID,
        "repo_content": content,
    }
