#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: driver_install
short_description: Configure the NVIDIA driver repository and install and pin one exact driver in one task
version_added: "0.3.0"
description:
  - An action plugin, the C(gpufleet.nvidia.driver) role's repository and transaction in one task.
  - V(repository) computes the node's distribution and repository (C(module_utils.driver_repository)), reads the
    signing key (given, a file on the controller, or downloaded by the node, also in check mode) and refuses it
    unless it holds exactly the pinned primary key; with apt it then writes the keyring and sources entry and
    refreshes the package lists (M(gpufleet.nvidia.driver_apt_repository)). On dnf the role writes the repository
    files between the two phases.
  - V(install) reads the GPUs and the driver state (M(gpufleet.nvidia.gpu_facts)) and runs
    M(gpufleet.nvidia.driver_transaction) with O(transaction), the GPUs, the distribution and the repository; the
    loaded version and the driver state go into its C(local_facts).
options:
  phases:
    description: The phases to run, in the order above.
    type: list
    elements: str
    default: [repository, install]
    choices: [repository, install]
  repository:
    description:
      - C(manage) (true), C(url) (a mirror; default NVIDIA's CUDA repository), C(suite), C(components),
        C(key_fingerprint) (the pinned fingerprint; default NVIDIA's), C(key_content), C(key_src) (a file on the
        controller) and C(key_url) (read by the node; default the repository's).
    type: dict
    required: true
  transaction:
    description: The options of M(gpufleet.nvidia.driver_transaction) but C(gpus), C(distribution) and
      C(repository); an empty C(version), C(today) or C(catalog) is left out.
    type: dict
    default: {}
  facts:
    description:
      - Return the GPUs read before the transaction as C(ansible_facts.nvidia). A caller that read them just before
        and reads them again after its reboot (the node_upgrade role) leaves them out of the result.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    details: The modules it runs report what they would change; the signing key is still read.
  diff_mode:
    support: full
    details: The repository's files and the driver transaction's packages, holds, pin and local facts, as the
      modules it runs show them.
author:
  - gpufleet.nvidia maintainers (@gpufleet)
extends_documentation_fragment:
  - gpufleet.nvidia.node_action
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
"""

EXAMPLES = r"""
- name: Install and pin R580 from a mirror
  gpufleet.nvidia.driver_install:
    repository:
      url: https://mirror.example/cuda/debian12/x86_64/
      key_src: files/cuda-archive-keyring.asc
      key_fingerprint: EB693B3035CD5710E231E123A4B469963BF863CC
    transaction:
      branch: "580"
      version: 580.126.20
  register: installed
"""

RETURN = r"""
distribution:
  description: The node's distribution id.
  returned: always
  type: str
  sample: debian12
repo:
  description: The repository's files and URLs (C(package_manager), C(url), C(key_url), C(fingerprint), and the
    apt keyring and sources entry or the dnf key and .repo file).
  returned: always
  type: dict
key:
  description: The repository's signing key, checked against the pinned fingerprint.
  returned: when the repository is managed
  type: str
repository_changed:
  description: Whether the apt repository's files or package lists changed.
  returned: always
  type: bool
repository_query:
  description: How the transaction read the repository (C(url), C(suite), C(components), C(key), C(preview)).
  returned: always
  type: dict
plan:
  description:
    - M(gpufleet.nvidia.driver_transaction)'s result (C(resolved), C(plan), C(action), C(local_facts), ...), without
      its package lists (C(installed), C(installed_after)) and C(local_facts_previous).
  returned: with the install phase
  type: dict
loaded_version:
  description: The driver version loaded when the GPUs were read (null when none).
  returned: with the install phase
  type: str
reboot_required:
  description: Whether the version the transaction installed is not the loaded one.
  returned: with the install phase
  type: bool
driver_result:
  description:
    - The driver role's C(driver_result) (C(resolved), C(action), C(previous_version), C(steps), C(reboot_required),
      C(loaded_version), C(local_facts), C(services), C(finished_epoch) in epoch seconds), built here in one piece.
  returned: with the install phase
  type: dict
ansible_facts:
  description: C(nvidia) as M(gpufleet.nvidia.gpu_facts) read it before the transaction.
  returned: with the install phase and O(facts)
  type: dict
"""
