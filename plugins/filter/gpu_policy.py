# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the gpu_policy role: a thin wrapper over ``plugin_utils.slurm_mig``; each filter's
documentation is in the ``<filter>.yml`` file beside this one."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import slurm_mig


def gpu_policy_slurm_check(show_node, node, gpus, registered=False):
    """May Slurm take the node back after a MIG layout change (counts and registration)?"""
    try:
        return slurm_mig.check_registration(str(show_node or ""), str(node), list(gpus or []), bool(registered))
    except ValueError as exc:
        raise AnsibleFilterError("gpu_policy_slurm_check: %s" % exc)


class FilterModule:
    """gpufleet.nvidia gpu_policy filters."""

    def filters(self):
        return {"gpu_policy_slurm_check": gpu_policy_slurm_check}
