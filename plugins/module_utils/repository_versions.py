# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Versions the repository offers: apt-cache madison and dnf list parsers, and the version picked.

Pure: no file, process or network access. Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import version_key
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import upstream_version
from ansible_collections.gpufleet.nvidia.plugins.module_utils.distributions import check_distribution


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
    check_distribution(distribution)
    if distribution == "debian12":
        return ["libnvidia-ml1", "nvidia-driver-cuda"]
    if distribution.startswith("ubuntu"):
        return ["libnvidia-compute"] + ["libnvidia-compute-%d" % b for b in (535, 550, 570, 575, 580)]
    return ["libnvidia-ml", "nvidia-driver-cuda"]


def pick_version(name: str, version: str, available: Optional[Dict[str, List[str]]],
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
