# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """Options of the modules that resolve a driver request and plan its package transaction."""

    DOCUMENTATION = r"""
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
"""
