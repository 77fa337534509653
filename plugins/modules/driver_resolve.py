#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: driver_resolve
short_description: Resolve an NVIDIA driver request to one exact version and plan its package transaction
version_added: "0.1.0"
description:
  - Resolves O(branch) (V(nfb), V(pb), V(ltsb) or a branch number such as V(580)) and an optional exact
    O(version) to one exact driver version for this node, from the architectures of its GPUs
    (O(gpus), or O(gpu_architectures) where the node has no driver yet to read them) and the versions
    its repository offers.
  - Refuses, with a message that names the node's GPUs and the accepted choices, end-of-life branches
    (unless O(allow_eol)), branches that dropped an architecture present (nothing after R580 for
    Maxwell, Pascal or Volta), open kernel modules before Turing, proprietary kernel modules on
    Blackwell and on R620 and later, and versions that are not in the branch or not in the repository.
  - Then plans the exact package transaction for the distribution (package names per branch
    generation, Fabric Manager at the same version, removals, holds, the apt pin file, dnf module
    stream and version locks) from the installed packages and the repository.
  - Reads only; never changes the node. With O(repository.preview) the repository is read through a
    private, temporary apt state, so that check mode on a node without the repository configured still
    shows the exact transaction.
  - The branch catalog (classes, end of life, architectures, flavours, versions) and its sources are
    documented in the collection's C(docs/driver.md); package names in C(docs/packages.md).
options:
  branch:
    description: V(nfb), V(pb), V(ltsb), or a branch number such as V(580).
    type: str
    default: ltsb
  version:
    description: An exact driver version such as V(580.126.20); it must belong to O(branch).
    type: str
  kernel_module_type:
    description:
      - Kernel module flavour. V(auto) takes open modules where every GPU is Turing or later, else
        proprietary.
    type: str
    choices: [auto, open, proprietary]
    default: auto
  allow_eol:
    description: Admit end-of-life branches.
    type: bool
    default: false
  gpus:
    description: C(ansible_facts.nvidia.gpus); only C(name) and C(architecture) are read.
    type: list
    elements: raw
    default: []
  gpu_architectures:
    description:
      - Architectures of this node's GPUs (C(Hopper), C(Volta), ...), used when O(gpus) has none (no driver
        yet). When both are given they must agree.
    type: list
    elements: str
    default: []
  fabric_manager:
    description:
      - Install NVIDIA Fabric Manager and NSCQ at the driver version. V(auto) installs them when the node
        has NVSwitch devices (PCI vendor 0x10de, class 0x0680).
    type: str
    choices: [auto, enabled, disabled]
    default: auto
  persistenced:
    description: Include C(nvidia-persistenced) where it is a package of its own.
    type: bool
    default: true
  distribution:
    description: V(debian12), V(ubuntu2204), V(ubuntu2404), V(rhel8) or V(rhel9).
    type: str
    required: true
    choices: [debian12, ubuntu2204, ubuntu2404, rhel8, rhel9]
  today:
    description: The date (V(YYYY-MM-DD)) end of life is judged on; default today on the node.
    type: str
  catalog:
    description:
      - A branch catalog from the C(gpufleet.nvidia.driver_branch_catalog) filter (for example refreshed
        from a mirrored C(releases.json)); default the built-in catalog.
    type: dict
  repository:
    description: Where the driver packages come from (apt).
    type: dict
    suboptions:
      url:
        description: Repository URL (NVIDIA's CUDA repository or a mirror).
        type: str
      suite:
        description: Suite; V(/) for NVIDIA's flat repository.
        type: str
        default: /
      components:
        description: Components, empty for a flat repository.
        type: list
        elements: str
        default: []
      key:
        description: The repository's public key (ASCII-armored), already verified against its fingerprint.
        type: str
      preview:
        description: Read the repository through a private temporary apt state instead of the system's.
        type: bool
        default: false
  origin_pin:
    description: apt C(Pin:) value that selects the NVIDIA repository for the origin pin (priority 600).
    type: str
    default: release l=NVIDIA CUDA
notes:
  - This module supports check mode; it only reads.
seealso:
  - name: NVIDIA Data Center Drivers, supported drivers and CUDA toolkit versions
    description: Branch classes, end of life and CUDA support of each branch.
    link: https://docs.nvidia.com/datacenter/tesla/drivers/supported-drivers-and-cuda-toolkit-versions.html
  - name: NVIDIA Driver Installation Guide
    description: Package names, module streams and version locking per distribution.
    link: https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/
author:
  - gpufleet.nvidia maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.nvidia.action_group
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: debian, rhel
"""

EXAMPLES = r"""
- name: Resolve the LTSB driver and plan its transaction
  gpufleet.nvidia.driver_resolve:
    branch: ltsb
    gpus: "{{ ansible_facts['nvidia']['gpus'] | default([]) }}"
    gpu_architectures: [Hopper]
    distribution: debian12
    repository:
      url: https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/
  register: driver_plan

- name: Show the transaction
  ansible.builtin.debug:
    msg: "{{ driver_plan.plan.steps }}"
"""

RETURN = r"""
resolved:
  description: The exact driver for this node.
  returned: success
  type: dict
  sample:
    branch: "620"
    branch_class: ltsb
    version: "620.70.06"
    kernel_module_type: open
    eol: false
    eol_date: "2029-09"
    max_cuda_major: 13
    architectures: [hopper]
    gpus: "8× NVIDIA H100 80GB HBM3 (Hopper)"
    version_source: repository
    warnings: []
    catalog_as_of: "2026-11-29"
plan:
  description:
    - The package transaction (see C(package_transaction.plan_transaction)). C(steps) is the ordered list of
      commands (C(argv)) and files (C(path), C(content) or C(state=absent)) the driver role runs;
      C(noop) is true when the node already has the set installed and pinned.
  returned: success
  type: dict
installed:
  description: Installed NVIDIA driver packages (C(name), C(version), C(held), C(status)).
  returned: success
  type: list
  elements: dict
available_versions:
  description: Driver versions the repository offers (upstream versions), or null when unknown.
  returned: success
  type: list
  elements: str
fabric_manager:
  description: Whether Fabric Manager is part of the set.
  returned: success
  type: bool
nvswitch_count:
  description: NVSwitch PCI devices found.
  returned: success
  type: int
repository_source:
  description: V(system) (the node's apt/dnf configuration), V(preview) (a private temporary state) or V(none).
  returned: success
  type: str
"""

import datetime
import glob
import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils import branch_catalog as bc
from ansible_collections.gpufleet.nvidia.plugins.module_utils import apt_plan
from ansible_collections.gpufleet.nvidia.plugins.module_utils import distributions
from ansible_collections.gpufleet.nvidia.plugins.module_utils import package_sets
from ansible_collections.gpufleet.nvidia.plugins.module_utils import package_transaction
from ansible_collections.gpufleet.nvidia.plugins.module_utils import repository_versions
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_state import (
    parse_apt_mark_showhold,
    parse_dpkg_l,
    parse_rpm_qa,
)

ENV = {"LANG": "C", "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}


def count_nvswitches(root="/sys/bus/pci/devices"):
    """NVSwitch devices: PCI vendor 0x10de with class 0x0680xx (bridge, other)."""
    count = 0
    for device in glob.glob(os.path.join(root, "*")):
        try:
            with open(os.path.join(device, "vendor")) as handle:
                vendor = handle.read().strip().lower()
            with open(os.path.join(device, "class")) as handle:
                klass = handle.read().strip().lower()
        except (IOError, OSError):
            continue
        if vendor == "0x10de" and klass.startswith("0x0680"):
            count += 1
    return count


class AptSource(object):
    """apt-cache against the system configuration, or against a private temporary state."""

    def __init__(self, module, repository):
        self.module = module
        self.options = []
        self.tmp = None
        self.source = "system"
        if repository and repository.get("preview"):
            self._preview(repository)

    def _preview(self, repository):
        if not repository.get("url"):
            self.module.fail_json(msg="repository.preview needs repository.url")
        if not repository.get("key"):
            self.module.fail_json(msg="repository.preview needs repository.key: the repository is never trusted "
                                      "without its signing key")
        self.tmp = tempfile.mkdtemp(prefix="gpufleet-apt-")
        for sub in ("lists/partial", "cache/archives/partial", "parts"):
            os.makedirs(os.path.join(self.tmp, sub))
        key_path = os.path.join(self.tmp, "repository.asc")
        with open(key_path, "w") as handle:
            handle.write(repository["key"])
        line = "deb [signed-by=%s] %s %s %s" % (key_path, repository["url"], repository.get("suite") or "/",
                                                " ".join(repository.get("components") or []))
        with open(os.path.join(self.tmp, "sources.list"), "w") as handle:
            handle.write(line.strip() + "\n")
        self.options = [
            "-o", "Dir::Etc::SourceList=%s" % os.path.join(self.tmp, "sources.list"),
            "-o", "Dir::Etc::SourceParts=%s" % os.path.join(self.tmp, "parts"),
            "-o", "Dir::State::Lists=%s" % os.path.join(self.tmp, "lists"),
            "-o", "Dir::Cache=%s" % os.path.join(self.tmp, "cache"),
            "-o", "Dir::Cache::pkgcache=",
            "-o", "Dir::Cache::srcpkgcache=",
            "-o", "APT::Sandbox::User=root",
        ]
        rc, out, err = self.module.run_command(["apt-get"] + self.options + ["-q", "update"], environ_update=ENV)
        if rc != 0:
            self.close()
            self.module.fail_json(msg="could not read the repository %s: %s" % (repository["url"], err or out),
                                  rc=rc)
        self.source = "preview"

    def madison(self, names):
        if not names:
            return {}
        rc, out, err = self.module.run_command(["apt-cache"] + self.options + ["madison"] + sorted(set(names)),
                                               environ_update=ENV)
        if rc != 0 and not out:
            return {}
        return repository_versions.parse_apt_cache_madison(out)

    def close(self):
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def gather_apt(module):
    rc, out, err = module.run_command(
        ["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${binary:Package} ${Version} ${Architecture}\n"],
        environ_update=ENV)
    if rc != 0:
        module.fail_json(msg="dpkg-query failed: %s" % err, rc=rc)
    installed = parse_dpkg_l(out, driver_only=True)
    rc, out, err = module.run_command(["apt-mark", "showhold"], environ_update=ENV)
    held = parse_apt_mark_showhold(out) if rc == 0 else []
    held_set = set(held)
    for package in installed:
        package["held"] = package["held"] or package["name"] in held_set
    preferences = None
    if os.path.exists(apt_plan.PREFERENCES_PATH):
        with open(apt_plan.PREFERENCES_PATH) as handle:
            preferences = handle.read()
    return installed, held, preferences


def gather_dnf(module):
    rc, out, err = module.run_command(["rpm", "-qa"], environ_update=ENV)
    if rc != 0:
        module.fail_json(msg="rpm -qa failed: %s" % err, rc=rc)
    installed = parse_rpm_qa(out, driver_only=True)
    stream = None
    rc, out, err = module.run_command(["dnf", "-q", "module", "list", "--enabled", "nvidia-driver"],
                                      environ_update=ENV)
    if rc == 0:
        for line in out.splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "nvidia-driver":
                stream = words[1]
                break
    locks = []
    rc, out, err = module.run_command(["dnf", "-q", "versionlock", "list"], environ_update=ENV)
    if rc == 0:
        for line in out.splitlines():
            entry = line.strip()
            if entry and ("nvidia" in entry or "cuda-drivers" in entry):
                locks.append(entry)
    return installed, stream, locks


def dnf_available(module, names):
    if not names:
        return {}
    rc, out, err = module.run_command(["dnf", "-q", "list", "--showduplicates", "--available"] + sorted(set(names)),
                                      environ_update=ENV)
    return repository_versions.parse_dnf_list(out) if rc == 0 else {}


def wanted_names(distribution, branch, module_type, fabric_manager, persistenced, installed):
    """Every name the plan may ask the repository about: the set and the old set renamed."""
    names = [p["name"] for p in package_sets.package_set(distribution, branch, module_type, fabric_manager, persistenced)]
    version = package_sets.installed_driver_version(installed)
    current = version.split(".")[0] if version else None
    for package in installed:
        names.append(package_sets.rename_for_branch(package["name"], distribution, current, branch))
    return sorted(set(names))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            branch=dict(type="str", default="ltsb"),
            version=dict(type="str"),
            kernel_module_type=dict(type="str", default="auto", choices=["auto", "open", "proprietary"]),
            allow_eol=dict(type="bool", default=False),
            gpus=dict(type="list", elements="raw", default=[]),
            gpu_architectures=dict(type="list", elements="str", default=[]),
            fabric_manager=dict(type="str", default="auto", choices=["auto", "enabled", "disabled"]),
            persistenced=dict(type="bool", default=True),
            distribution=dict(type="str", required=True, choices=list(distributions.DISTRIBUTIONS)),
            today=dict(type="str"),
            catalog=dict(type="dict"),
            repository=dict(type="dict", options=dict(
                url=dict(type="str"),
                suite=dict(type="str", default="/"),
                components=dict(type="list", elements="str", default=[]),
                key=dict(type="str", no_log=False),
                preview=dict(type="bool", default=False),
            )),
            origin_pin=dict(type="str", default=apt_plan.DEFAULT_ORIGIN_PIN),
        ),
        supports_check_mode=True,
    )
    p = module.params
    distribution = p["distribution"]
    manager = distributions.package_manager(distribution)
    catalog = p["catalog"] or bc.get_catalog()
    today = p["today"] or datetime.date.today().isoformat()
    nvswitches = count_nvswitches()
    if p["fabric_manager"] == "auto":
        fabric_manager = nvswitches > 0
    else:
        fabric_manager = p["fabric_manager"] == "enabled"

    apt = None
    stream = None
    locks = []
    preferences = None
    held = []
    try:
        if manager == "apt":
            installed, held, preferences = gather_apt(module)
            apt = AptSource(module, p["repository"])
            probe = repository_versions.version_probe_packages(distribution)
            found = apt.madison(probe)
        else:
            installed, stream, locks = gather_dnf(module)
            found = dnf_available(module, repository_versions.version_probe_packages(distribution))
        available_versions = repository_versions.driver_versions_available(found, repository_versions.version_probe_packages(distribution))
        repository_source = apt.source if apt else "system"
        warnings = []
        if not available_versions and p["repository"] is None:
            available_versions = None
            repository_source = "none"
            warnings.append("no repository information: versions come from the catalog (as of %s) and are not "
                            "checked against a repository" % catalog.get("as_of"))
        try:
            resolved = bc.resolve_driver(
                catalog, branch=p["branch"], gpus=p["gpus"], today=today, version=p["version"],
                kernel_module_type=p["kernel_module_type"], available_versions=available_versions,
                allow_eol=p["allow_eol"], node=None, declared_architectures=p["gpu_architectures"])
        except bc.ResolutionError as exc:
            module.fail_json(msg=exc.message, code=exc.code, allowed=exc.allowed,
                             available_versions=available_versions)
        names = wanted_names(distribution, resolved["branch"], resolved["kernel_module_type"], fabric_manager,
                             p["persistenced"], installed)
        if repository_source == "none":
            available = None
        elif manager == "apt":
            available = apt.madison(names)
        else:
            available = dnf_available(module, names)
        try:
            plan = package_transaction.plan_transaction(
                distribution, resolved["branch"], resolved["version"], resolved["kernel_module_type"],
                fabric_manager=fabric_manager, persistenced=p["persistenced"], installed=installed,
                available=available, held=held if manager == "apt" else None, current_stream=stream,
                locked=locks, origin_pin=p["origin_pin"], current_preferences=preferences)
        except distributions.PlanError as exc:
            module.fail_json(msg=exc.message, code=exc.code, resolved=resolved)
    finally:
        if apt:
            apt.close()
    for text in resolved["warnings"] + warnings:
        module.warn(text)
    module.exit_json(changed=False, resolved=resolved, plan=plan, installed=installed,
                     available_versions=available_versions, fabric_manager=fabric_manager,
                     nvswitch_count=nvswitches, repository_source=repository_source)


if __name__ == "__main__":
    main()
