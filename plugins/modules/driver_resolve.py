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
  - gpufleet.nvidia.driver_plan
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils.node_packages import (
    PLAN_ARGUMENT_SPEC,
    count_nvswitches,
    resolve_and_plan,
)


def main():
    module = AnsibleModule(argument_spec=PLAN_ARGUMENT_SPEC, supports_check_mode=True)
    result = resolve_and_plan(module, count_nvswitches())
    for text in result["warnings"]:
        module.warn(text)
    module.exit_json(changed=False, resolved=result["resolved"], plan=result["plan"], installed=result["installed"],
                     available_versions=result["available_versions"], fabric_manager=result["fabric_manager"],
                     nvswitch_count=result["nvswitch_count"], repository_source=result["repository_source"])


if __name__ == "__main__":
    main()
