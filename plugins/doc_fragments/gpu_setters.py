# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """Options, requirements and notes shared by the modules that change GPU settings through NVML."""

    DOCUMENTATION = r"""
options:
  strict:
    description:
      - When V(true), a setting the GPU does not support (NVML C(NotSupported)) fails the task, before
        anything is changed where it can be known in advance.
      - When V(false), such a setting is reported in the result and in a warning, and skipped.
    type: bool
    default: false
notes:
  - Changing GPU settings needs root on the host. In a container, root is not enough; the container
    needs C(CAP_SYS_ADMIN). NVML's C(NoPermission) ("Insufficient Permissions") fails the task with a
    message naming what is missing.
  - Every change is read back through NVML; C(changed) is reported only when the value read back
    moved. A setter that reports success while the value does not move fails the task.
  - Requires the NVIDIA driver to be loaded and the NVML library matching it; a "Driver/library
    version mismatch" means the node needs the reboot of a driver upgrade first.
requirements:
  - nvidia-ml-py (the C(pynvml) module) on the managed node.
"""
