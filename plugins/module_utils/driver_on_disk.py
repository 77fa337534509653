# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA kernel module on disk: ``modinfo nvidia``, module listings, the running kernel.

The **on-disk** version is the module that ``modprobe`` loads for the running kernel at the
next boot (``modinfo -F version nvidia``); a listing of ``/lib/modules`` tells for which kernels
an ``nvidia.ko`` is built (field case 24). Pure: text in, dictionaries out.

Compatible with Python 3.7 (the managed nodes' floor, see README.md); standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import VERSION_TOKEN


_MODULES_PATH = re.compile(r"/lib/modules/([^/]+)/")


def parse_modinfo(text: Optional[str]) -> Dict[str, Any]:
    """Parse the output of ``modinfo nvidia`` or ``modinfo -F version nvidia``.

    ``modinfo`` reads the module that ``modprobe`` would load for the running kernel (or for
    ``-k RELEASE``), i.e. the version that loads at the next boot. Full output is ``key: value``
    lines (``filename:``, ``version:``, ``license:``, ``vermagic:``, ``firmware:`` ...); with
    ``-F version`` only the version is printed. The license tells the flavour: ``Dual MIT/GPL`` is
    the open kernel module, ``NVIDIA`` the proprietary one (both as set by NVIDIA's sources in
    ``MODULE_LICENSE``). The kernel release comes from the path
    ``/lib/modules/<release>/...`` of ``filename``, else from the first word of ``vermagic``.

    :param text: the command's output (stdout, optionally with stderr), or ``None``.
    :returns: ``{"on_disk_version": str|None, "filename": str|None, "license": str|None,
        "kernel_module_type": "open"|"proprietary"|None, "vermagic": str|None,
        "kernel_release": str|None, "firmware": [str], "not_found": bool,
        "error": str|None}``. ``not_found`` is ``True`` for
        ``modinfo: ERROR: Module nvidia not found.`` (no module for that kernel); other
        ``modinfo: ERROR`` lines are returned in ``error``.
    :raises: nothing.
    """
    result = {
        "on_disk_version": None,
        "filename": None,
        "license": None,
        "kernel_module_type": None,
        "vermagic": None,
        "kernel_release": None,
        "firmware": [],
        "not_found": False,
        "error": None,
    }
    if not text:
        return result
    fields_seen = False
    bare_versions = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("modinfo:") and "ERROR" in line:
            if re.search(r"Module \S+ not found", line):
                result["not_found"] = True
            else:
                result["error"] = line
            continue
        match = re.match(r"^([A-Za-z_]+):\s*(.*)$", line)
        if match:
            fields_seen = True
            key, value = match.group(1), match.group(2).strip()
            if key == "version" and result["on_disk_version"] is None:
                result["on_disk_version"] = value or None
            elif key == "filename" and result["filename"] is None:
                result["filename"] = value or None
            elif key == "license" and result["license"] is None:
                result["license"] = value or None
            elif key == "vermagic" and result["vermagic"] is None:
                result["vermagic"] = value or None
            elif key == "firmware" and value:
                result["firmware"].append(value)
            continue
        if VERSION_TOKEN.match(line):
            bare_versions.append(line)
    if not fields_seen and bare_versions:
        result["on_disk_version"] = bare_versions[0]
    license_text = result["license"]
    if license_text == "Dual MIT/GPL":
        result["kernel_module_type"] = "open"
    elif license_text == "NVIDIA":
        result["kernel_module_type"] = "proprietary"
    if result["filename"]:
        path = _MODULES_PATH.search(result["filename"])
        if path:
            result["kernel_release"] = path.group(1)
    if result["kernel_release"] is None and result["vermagic"]:
        result["kernel_release"] = result["vermagic"].split()[0]
    if result["on_disk_version"] is not None:
        result["not_found"] = False
    return result


_NVIDIA_KO = re.compile(r"^nvidia(?:[-_](?:current|\d+))?\.ko(?:\.(?:xz|zst|gz))?$")


def nvidia_modules_by_kernel(text: Optional[str]) -> Dict[str, List[str]]:
    """Group the ``nvidia.ko`` files of a module listing by kernel release.

    Input is a list of paths, one a line, such as the output of
    ``find /lib/modules/ -name "*nvidia*"``. Only the core driver module counts:
    ``nvidia.ko`` (also compressed ``.ko.xz``/``.ko.zst``/``.ko.gz`` and the old
    ``nvidia_current.ko`` / ``nvidia_<branch>.ko`` names); ``nvidia-uvm``, ``nvidia-drm``,
    ``nvidia-modeset``, the in-tree framebuffer driver ``nvidiafb.ko`` and directories do not.

    :returns: ``{kernel_release: [path, ...]}`` in input order; kernels without an ``nvidia.ko``
        are absent. Field case 24: only ``3.13.0-88-generic`` has one.
    :raises: nothing.
    """
    found = {}  # type: Dict[str, List[str]]
    if not text:
        return found
    for raw in text.splitlines():
        path = raw.strip()
        release = _MODULES_PATH.search(path)
        if not release:
            continue
        if _NVIDIA_KO.match(path.rsplit("/", 1)[-1]):
            found.setdefault(release.group(1), []).append(path)
    return found


def kernel_release_from_uname(text: Optional[str]) -> Optional[str]:
    """Return the kernel release from ``uname -r`` or ``uname -a`` output.

    ``uname -a`` prints ``Linux <hostname> <release> #<build> ...``; ``uname -r`` only the
    release.

    :returns: ``"3.13.0-116-generic"``, or ``None`` for empty input.
    :raises: nothing.
    """
    if not text:
        return None
    for raw in text.splitlines():
        words = raw.split()
        if not words or words[0] == "$":
            continue
        if words[0] == "Linux" and len(words) >= 3:
            return words[2]
        if len(words) == 1:
            return words[0]
    return None
