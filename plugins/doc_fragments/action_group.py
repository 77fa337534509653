# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """The ``nvidia`` action group of meta/runtime.yml, for the modules that belong to it."""

    DOCUMENTATION = r"""
attributes:
  action_group:
    description: Use C(group/gpufleet.nvidia.nvidia) in C(module_defaults) to set defaults for this module.
    support: full
    membership:
      - gpufleet.nvidia.nvidia
notes:
  - This module is in the C(gpufleet.nvidia.nvidia) action group (C(meta/runtime.yml)) with
    M(gpufleet.nvidia.gpu_facts), M(gpufleet.nvidia.gpu_policy), M(gpufleet.nvidia.gpu_mig) and
    M(gpufleet.nvidia.driver_resolve), so a play can set their common options once with
    C(module_defaults) under C(group/gpufleet.nvidia.nvidia), for example C(strict), an option of
    M(gpufleet.nvidia.gpu_policy) and M(gpufleet.nvidia.gpu_mig).
"""
