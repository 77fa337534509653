# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The loaded NVIDIA kernel module's version: ``/proc/driver/nvidia/version`` and ``/sys/module/nvidia/version``.

The **loaded** version is the ``nvidia.ko`` in memory; it may differ from the userspace
libraries until the next boot (see :mod:`driver_state`). Pure: text in, dictionaries out.

Compatible with Python 3.7 (the managed nodes' floor, see README.md); standard library only.
"""

from __future__ import annotations

import re
from typing import Dict, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import VERSION_TOKEN


def parse_proc_driver_version(text: Optional[str]) -> Dict[str, Optional[str]]:
    """Parse the contents of ``/proc/driver/nvidia/version``.

    The file has an ``NVRM version:`` line and a ``GCC version:`` line, as printed by the loaded
    ``nvidia.ko``::

        NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release Build  (...)  Wed Aug 13 ...
        NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun  6 22:20:39 UTC 2023
        NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  550.144.03  Release Build  (...)
        NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.120  Fri Sep 13 11:01:10 UTC 2024
        GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)

    The kernel module type comes from the wording: "Open Kernel Module" is NVIDIA's open
    kernel module (open-gpu-kernel-modules); "<arch> Kernel Module" is the proprietary one. The
    Tegra/Jetson wording "NVIDIA UNIX Kernel Module for aarch64" names neither and gives ``None``.

    :param text: the file's contents, or ``None``.
    :returns: ``{"loaded_version": str|None, "kernel_module_type": "open"|"proprietary"|None,
        "architecture": str|None (``"x86_64"``, ``"aarch64"``), "gcc_version": str|None
        (``"12.3.0"``)}``; every value ``None`` when there is no ``NVRM version:`` line.
    :raises: nothing.
    """
    result = {
        "loaded_version": None,
        "kernel_module_type": None,
        "architecture": None,
        "gcc_version": None,
    }
    if not text:
        return result
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("NVRM version:") and result["loaded_version"] is None:
            body = line[len("NVRM version:"):]
            for token in body.split():
                if VERSION_TOKEN.match(token):
                    result["loaded_version"] = token
                    break
            open_match = re.search(r"\bOpen Kernel Module for (\S+)", body)
            prop_match = re.search(r"\bNVIDIA UNIX (\S+) Kernel Module\b", body)
            if open_match:
                result["kernel_module_type"] = "open"
                result["architecture"] = open_match.group(1)
            elif prop_match and prop_match.group(1) != "Open":
                result["kernel_module_type"] = "proprietary"
                result["architecture"] = prop_match.group(1)
            else:
                other = re.search(r"\bKernel Module for (\S+)", body)
                if other:
                    result["architecture"] = other.group(1)
        elif line.startswith("GCC version:") and result["gcc_version"] is None:
            gcc = re.search(r"gcc version (\d+(?:\.\d+)*)", line)
            if gcc:
                result["gcc_version"] = gcc.group(1)
    return result


def parse_sys_module_version(text: Optional[str]) -> Optional[str]:
    """Parse ``/sys/module/nvidia/version``, which holds only the loaded module's version.

    :param text: the file's contents (``"580.82.07\\n"``), or ``None``.
    :returns: the version (``"580.82.07"``), or ``None`` when the text is empty or is not a
        version.
    :raises: nothing.
    """
    if not text:
        return None
    token = text.strip().split()[0] if text.strip() else ""
    return token if VERSION_TOKEN.match(token) else None
