# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Distribution ids the driver transaction supports, their package managers, and the planning error.

Pure: no file, process or network access. Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

from typing import Any


DISTRIBUTIONS = ("debian12", "ubuntu2204", "ubuntu2404", "rhel8", "rhel9")


class PlanError(ValueError):
    """The transaction cannot be planned: a package is missing from the repository, the
    distribution is not supported, or the request contradicts itself.

    :ivar code: ``unsupported_distribution``, ``not_in_repository``, ``bad_request``.
    """

    def __init__(self, code: str, message: str):
        ValueError.__init__(self, message)
        self.code = code
        self.message = message


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
    check_distribution(distribution)
    return "dnf" if distribution.startswith("rhel") else "apt"


def check_distribution(distribution: str) -> None:
    if distribution not in DISTRIBUTIONS:
        raise PlanError("unsupported_distribution", "unsupported distribution %r; supported: %s"
                        % (distribution, ", ".join(DISTRIBUTIONS)))
