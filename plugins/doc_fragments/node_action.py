# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """Attributes of the action plugins that run modules on their node (node_preflight, node_transaction,
    driver_install); each says its own check and diff modes."""

    DOCUMENTATION = r"""
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  platform:
    platforms: posix
"""
