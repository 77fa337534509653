# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side filters for NVIDIA driver branches, versions and CUDA compatibility.

Thin wrappers over the branch catalog, driver resolution and CUDA modules of ``module_utils`` and the driver package modules of ``module_utils``; each
filter's documentation is in the ``<filter>.yml`` file beside this one.
"""

from __future__ import annotations

import datetime

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.module_utils import branch_catalog as bc
from ansible_collections.gpufleet.nvidia.plugins.module_utils import cuda_compat
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_versions
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_resolution
from ansible_collections.gpufleet.nvidia.plugins.module_utils import distributions
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_local_facts as local_facts
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_repository as repository
from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_hold
from ansible_collections.gpufleet.nvidia.plugins.module_utils import package_failures


def _catalog(catalog):
    if catalog is None:
        return bc.get_catalog()
    if not isinstance(catalog, dict) or "branches" not in catalog:
        raise AnsibleFilterError("catalog must be the result of gpufleet.nvidia.driver_branch_catalog")
    return catalog


def _today(today):
    return today or datetime.date.today().isoformat()


def driver_resolve(gpus, branch="ltsb", version=None, kernel_module_type="auto", allow_eol=False, today=None,
                   available_versions=None, declared_architectures=None, catalog=None, node=None):
    """Resolve a driver request to one exact version for the GPUs given (see driver_resolution.resolve_driver)."""
    try:
        return driver_resolution.resolve_driver(
            _catalog(catalog), branch=branch, gpus=gpus or [], today=_today(today), version=version or None,
            kernel_module_type=kernel_module_type, available_versions=available_versions,
            allow_eol=bool(allow_eol), node=node, declared_architectures=declared_architectures)
    except bc.ResolutionError as exc:
        raise AnsibleFilterError(exc.message)


def cuda_min_driver(toolkit, mode="toolkit"):
    """CUDA toolkit version → minimum driver version (mode toolkit) or branch (mode minor)."""
    try:
        return cuda_compat.cuda_minimum_driver(toolkit, mode=mode)["minimum_driver"]
    except ValueError as exc:
        raise AnsibleFilterError(str(exc))


def driver_supports_cuda(driver_version, toolkit):
    """True when the driver meets the toolkit's minimum driver version."""
    try:
        return cuda_compat.driver_supports_cuda(str(driver_version), toolkit)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc))


def driver_branch(version):
    """Driver version → branch, ``580.126.20`` → ``580``; a branch stays a branch (``R580`` → ``580``)."""
    branch = driver_versions.parse_branch(version)
    if branch is not None:
        return branch
    try:
        return driver_versions.branch_of_version(str(version))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc))


def driver_branch_info(branch, catalog=None, today=None):
    """Catalog entry of a branch with its end-of-life status on ``today``."""
    cat = _catalog(catalog)
    try:
        info = dict(bc.branch_info(cat, branch))
        info.update(bc.eol_status(cat, branch, _today(today)))
    except bc.ResolutionError as exc:
        raise AnsibleFilterError(exc.message)
    info["branch"] = driver_versions.parse_branch(branch)
    info["catalog_as_of"] = cat.get("as_of")
    return info


def driver_branch_catalog(releases=None, retrieved=None, source=None):
    """The built-in catalog, refreshed from a copy of NVIDIA's releases.json when given."""
    if releases is None or releases == "":
        return bc.get_catalog()
    try:
        return bc.refresh_from_releases(releases, retrieved=retrieved, source=source)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc))


def driver_distribution(facts):
    """``ansible_facts`` → ``debian12``, ``ubuntu2204``, ``ubuntu2404``, ``rhel8`` or ``rhel9``."""
    facts = facts or {}
    try:
        return distributions.distribution_id(facts.get("distribution"), facts.get("distribution_major_version"),
                                             facts.get("distribution_version"))
    except distributions.PlanError as exc:
        raise AnsibleFilterError(exc.message)


def driver_apt_failure(result):
    """Classify a failed apt-get result (``rc``, ``stdout``, ``stderr``): field case 18."""
    result = result or {}
    return package_failures.classify_apt_failure(result.get("rc"), result.get("stdout", ""), result.get("stderr", ""))


def driver_signing_key(colons, fingerprint):
    """Check ``gpg --show-keys --with-colons`` output against the pinned fingerprint."""
    return repository.check_signing_key(colons, fingerprint)


def driver_local_facts(previous, version, branch, when, action, verified_good=None, kernel_module_type=None,
                       history_limit=50):
    """Next content of the driver's local facts: current, previous, last known-good, history."""
    return local_facts.update_local_facts(previous or {}, str(version), str(branch), str(when), str(action),
                                          verified_good=verified_good or None, history_limit=int(history_limit),
                                          kernel_module_type=kernel_module_type)


def driver_next_local_facts(previous, target, branch, kernel_module_type, action, loaded, state, mark_known_good,
                            when, history_limit=50):
    """What the driver role records after its transaction (see driver_local_facts.next_local_facts)."""
    return local_facts.next_local_facts(previous or {}, str(target), str(branch), kernel_module_type, str(action),
                                        loaded or None, state or None, bool(mark_known_good), str(when),
                                        int(history_limit))


def driver_unattended_upgrades_config(extra=None):
    """apt.conf snippet: Unattended-Upgrade::Package-Blacklist for the kernel and NVIDIA packages."""
    return kernel_hold.unattended_upgrades_config(extra or [])


def driver_repository(distribution, url=None, fingerprint=None, suite="/", components=None,
                      fingerprint_in_sources=True):
    """Repository files for a distribution: apt sources line and keyring, or the dnf .repo file."""
    try:
        return repository.repository_config(distribution, url=url or None, fingerprint=fingerprint or None,
                                            suite=suite or "/", components=components or [],
                                            fingerprint_in_sources=bool(fingerprint_in_sources))
    except distributions.PlanError as exc:
        raise AnsibleFilterError(exc.message)


def driver_verify_module(target_version, modinfo_output, running_kernel=None):
    """Compare the module on disk for the running kernel with the driver installed (cases 23, 24)."""
    text = (modinfo_output or "").strip()
    found = text.splitlines()[0].strip() if text and driver_versions.is_version(text.splitlines()[0].strip()) else None
    return package_failures.verify_module_build(str(target_version), found, running_kernel)


def driver_kernel_hold(installed, running_kernel, package_manager="apt"):
    """Kernel packages to hold for the running kernel (image, headers, meta packages)."""
    return kernel_hold.kernel_hold_packages(str(running_kernel), installed or [], package_manager)


class FilterModule(object):
    """NVIDIA driver branch filters."""

    def filters(self):
        return {
            "driver_resolve": driver_resolve,
            "cuda_min_driver": cuda_min_driver,
            "driver_supports_cuda": driver_supports_cuda,
            "driver_branch": driver_branch,
            "driver_branch_info": driver_branch_info,
            "driver_branch_catalog": driver_branch_catalog,
            "driver_distribution": driver_distribution,
            "driver_apt_failure": driver_apt_failure,
            "driver_signing_key": driver_signing_key,
            "driver_local_facts": driver_local_facts,
            "driver_next_local_facts": driver_next_local_facts,
            "driver_unattended_upgrades_config": driver_unattended_upgrades_config,
            "driver_repository": driver_repository,
            "driver_verify_module": driver_verify_module,
            "driver_kernel_hold": driver_kernel_hold,
        }
