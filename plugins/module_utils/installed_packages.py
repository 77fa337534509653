# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Installed package records from ``dpkg -l``, ``rpm -qa`` and ``apt-mark showhold``.

Each record is ``{"name", "version", "upstream_version", "architecture", "status", "held",
"installed", "half_configured"}``; by default only NVIDIA driver packages
(:func:`driver_packages.is_driver_package`) are kept. Pure: text in, records out.

Compatible with Python 3.7 (the managed nodes' floor, see README.md); standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_packages import is_driver_package
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import upstream_version


_DPKG_ARCHES = frozenset(
    ("all", "amd64", "arm64", "armhf", "armel", "i386", "ppc64el", "s390x", "riscv64", "<none>")
)


def parse_dpkg_l(text: Optional[str], driver_only: bool = True) -> List[Dict[str, Any]]:
    """Parse ``dpkg -l`` output into package records.

    Each package line starts with two or three status letters (``dpkg-query(1)``, "--list"):
    desired action (``u``nknown, ``i``nstall, ``h``old, ``r``emove, ``p``urge), package state
    (``n`` not installed, ``c`` config-files, ``H`` half-installed, ``U`` unpacked, ``F``
    half-configured, ``W`` triggers-awaited, ``t`` triggers-pending, ``i`` installed) and an
    optional error flag (``R`` reinstallation required). Then name (``name[:arch]``), version,
    architecture (absent in output of old dpkg) and description.

    :param text: the output of ``dpkg -l`` (header lines are skipped), or ``None``.
    :param driver_only: keep only NVIDIA driver packages (:func:`driver_packages.is_driver_package`).
    :returns: a list of ``{"name": str (without ``:arch``), "version": str|None (the full
        Debian version, ``None`` for ``<none>``), "upstream_version": str|None,
        "architecture": str|None, "status": str (``"ii"``, ``"hi"``, ``"iU"``, ``"iF"``,
        ``"iHR"``, ``"rc"`` ...), "held": bool (desired action ``h``), "installed": bool
        (state is not ``n``/``c``), "half_configured": bool (state ``U``, ``F``, ``H``, ``W``,
        ``t``, or an error flag)}`` in input order.
    :raises: nothing; lines that are not package lines are skipped.
    """
    packages = []  # type: List[Dict[str, Any]]
    if not text:
        return packages
    has_arch_column = None  # type: Optional[bool]
    for raw in text.splitlines():
        if raw.startswith("||/"):
            has_arch_column = "Architecture" in raw
            continue
        match = re.match(r"^([uihrp])([ncHUFWti])([R ]?)\s+(\S+)\s+(\S+)(?:\s+(\S+))?", raw)
        if not match:
            continue
        desired, state, err = match.group(1), match.group(2), match.group(3).strip()
        name_arch, version, fourth = match.group(4), match.group(5), match.group(6)
        name, _sep, name_suffix = name_arch.partition(":")
        if driver_only and not is_driver_package(name):
            continue
        architecture = None
        if has_arch_column or (has_arch_column is None and fourth in _DPKG_ARCHES):
            architecture = fourth if fourth and fourth != "<none>" else None
        if architecture is None and name_suffix:
            architecture = name_suffix
        version_value = None if version == "<none>" else version
        packages.append(
            {
                "name": name,
                "version": version_value,
                "upstream_version": upstream_version(version_value),
                "architecture": architecture,
                "status": desired + state + err,
                "held": desired == "h",
                "installed": state not in ("n", "c"),
                "half_configured": state in ("U", "F", "H", "W", "t") or bool(err),
            }
        )
    return packages


_RPM_ARCHES = ("x86_64", "noarch", "aarch64", "i686", "i386", "ppc64le", "s390x", "src")


def _split_nevra(text: str) -> Optional[Tuple[str, str, Optional[str]]]:
    """Split ``name-[epoch:]version-release[.arch]`` into (name, [epoch:]version-release, arch)."""
    arch = None
    rest = text
    for candidate in _RPM_ARCHES:
        if rest.endswith("." + candidate):
            arch = candidate
            rest = rest[: -(len(candidate) + 1)]
            break
    parts = rest.rsplit("-", 2)
    if len(parts) != 3 or not parts[0] or not parts[1] or not parts[2]:
        return None
    name, version, release = parts
    if not re.match(r"^(?:\d+:)?\d", version):
        return None
    return name, version + "-" + release, arch


def parse_rpm_qa(text: Optional[str], driver_only: bool = True) -> List[Dict[str, Any]]:
    """Parse ``rpm -qa`` output into package records.

    The default output is one ``name-version-release.arch`` a line (``rpm(8)``, ``%{NVRA}``),
    e.g. ``nvidia-driver-cuda-libs-580.82.07-1.el9.x86_64``; a ``name-epoch:version-release.arch``
    form (as ``dnf`` prints it) and whitespace-separated ``name [epoch:]version-release [arch]``
    lines (a ``--queryformat`` listing) are accepted too. RPM has no hold or half-configured state
    (a version lock lives in the versionlock plugin's list), so ``held`` and ``half_configured``
    are ``False``.

    :param text: the output of ``rpm -qa``, or ``None``.
    :param driver_only: keep only NVIDIA driver packages (:func:`driver_packages.is_driver_package`).
    :returns: a list of ``{"name", "version" (``[epoch:]version-release``, e.g.
        ``"580.82.07-1.el9"``), "upstream_version" (``"580.82.07"``), "architecture",
        "status": "installed", "held": False, "installed": True, "half_configured": False}``.
    :raises: nothing; lines that do not parse are skipped.
    """
    packages = []  # type: List[Dict[str, Any]]
    if not text:
        return packages
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        parsed = None  # type: Optional[Tuple[str, str, Optional[str]]]
        if len(words) == 1:
            parsed = _split_nevra(words[0])
        elif len(words) in (2, 3) and re.match(r"^(?:\d+:)?\d", words[1]):
            parsed = (words[0], words[1], words[2] if len(words) == 3 else None)
        if parsed is None:
            continue
        name, version, arch = parsed
        if driver_only and not is_driver_package(name):
            continue
        packages.append(
            {
                "name": name,
                "version": version,
                "upstream_version": upstream_version(version),
                "architecture": arch,
                "status": "installed",
                "held": False,
                "installed": True,
                "half_configured": False,
            }
        )
    return packages


def parse_apt_mark_showhold(text: Optional[str]) -> List[str]:
    """Parse ``apt-mark showhold``: one held package name a line.

    :returns: the names without ``:arch`` suffix, in input order, without duplicates.
    :raises: nothing.
    """
    names = []  # type: List[str]
    if not text:
        return names
    for raw in text.splitlines():
        word = raw.strip()
        if not word or " " in word:
            continue
        name = word.split(":", 1)[0]
        if name not in names:
            names.append(name)
    return names


def mark_held(packages: List[Dict[str, Any]], held_names: Iterable[str]) -> List[Dict[str, Any]]:
    """Set ``held: True`` on the packages named in ``held_names`` (e.g. from
    :func:`parse_apt_mark_showhold`); other records are left as they are.

    :returns: the same list, updated in place, for chaining.
    :raises: nothing.
    """
    held = set(n.split(":", 1)[0] for n in held_names)
    for package in packages:
        if package.get("name") in held:
            package["held"] = True
    return packages
