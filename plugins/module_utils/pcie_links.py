# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCIe link state of NVIDIA GPU endpoints from ``lspci -vvv``.

A PCIe switch port that runs below its own capability because the device below it is slower
(a Gen5 switch port in front of a Gen4 NVMe drive) is marked ``(downgraded)`` by lspci, yet
nothing is wrong with any GPU. A GPU link check therefore looks only at NVIDIA endpoints
(vendor 10de, class 03xx: "3D controller", "VGA compatible controller") and compares each one's
own ``LnkSta`` with its own ``LnkCap``.

Source of the format: ``lspci(8)`` from pciutils, the ``LnkCap:``/``LnkSta:`` lines of the
PCI Express capability; speeds per generation from the PCI Express Base Specification
(2.5, 5, 8, 16, 32, 64 GT/s for generations 1 to 6).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import normalize_pci_bus_id

# GT/s → PCIe generation.
SPEED_TO_GEN = {"2.5": 1, "5": 2, "8": 3, "16": 4, "32": 5, "64": 6}

_HEADER = re.compile(r"^(?P<bus>(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+(?P<cls>[^:]+):\s+(?P<desc>.*)$")
_LINK = re.compile(r"^\s*(?P<kind>LnkCap|LnkSta):\s*(?P<rest>.*)$")
_SPEED = re.compile(r"Speed\s+(?P<speed>[\d.]+)GT/s(?:\s*\((?P<speed_note>[^)]*)\))?")
_WIDTH = re.compile(r"Width\s+x(?P<width>\d+)(?:\s*\((?P<width_note>[^)]*)\))?")
_GPU_CLASSES = ("3d controller", "vga compatible controller", "display controller")


def _gen(speed: Optional[str]) -> Optional[int]:
    return None if speed is None else SPEED_TO_GEN.get(speed)


def parse_lspci_links(text: str) -> List[Dict[str, Any]]:
    """Parse ``lspci -vvv`` (or a filtered part of it) into one record per device.

    :param text: the output of ``lspci -vvv``; devices without a PCI Express capability are
        kept with ``None`` link values.
    :returns: ``[{"pci_bus_id": "0000:19:00.0", "device_class": "3D controller",
        "description": str, "nvidia_gpu": bool, "cap_gen": int|None, "cap_width": int|None,
        "sta_gen": int|None, "sta_width": int|None, "downgraded": bool}]``;
        ``downgraded`` is true when lspci marked the status speed or width "(downgraded)" or
        when the status is below the capability.
    :raises: nothing; lines that are not understood are skipped.
    """
    devices = []  # type: List[Dict[str, Any]]
    current = None  # type: Optional[Dict[str, Any]]
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            desc = header.group("desc")
            cls = header.group("cls").strip()
            current = {
                "pci_bus_id": normalize_pci_bus_id(header.group("bus")),
                "device_class": cls,
                "description": desc.strip(),
                "nvidia_gpu": cls.lower() in _GPU_CLASSES and "nvidia" in desc.lower(),
                "cap_gen": None, "cap_width": None, "sta_gen": None, "sta_width": None,
                "downgraded": False,
            }
            devices.append(current)
            continue
        link = _LINK.match(line)
        if link is None or current is None:
            continue
        rest = link.group("rest")
        speed = _SPEED.search(rest)
        width = _WIDTH.search(rest)
        prefix = "cap" if link.group("kind") == "LnkCap" else "sta"
        current[prefix + "_gen"] = _gen(speed.group("speed")) if speed else None
        current[prefix + "_width"] = int(width.group("width")) if width else None
        if prefix == "sta":
            notes = [m.group(n) for m, n in ((speed, "speed_note"), (width, "width_note")) if m and m.group(n)]
            current["downgraded"] = any("downgraded" in note for note in notes)
    for device in devices:
        for key in ("gen", "width"):
            cap, sta = device["cap_" + key], device["sta_" + key]
            if cap is not None and sta is not None and sta < cap:
                device["downgraded"] = True
    return devices


def gpu_link_report(devices: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Judge the links of NVIDIA GPU endpoints only.

    :param devices: records of :func:`parse_lspci_links`.
    :returns: ``{"gpus": [{pci_bus_id, gen_current, gen_max, width_current, width_max,
        healthy}], "degraded_gpus": [pci_bus_id], "other_downgraded_ports": int}``; a GPU is
        healthy when its own status equals its own capability. ``other_downgraded_ports``
        counts downgraded non-GPU devices and switch ports, which say nothing about the GPUs.
    """
    gpus = []
    for device in devices:
        if not device["nvidia_gpu"]:
            continue
        healthy = None
        if device["sta_gen"] is not None and device["cap_gen"] is not None:
            healthy = not device["downgraded"]
        gpus.append({
            "pci_bus_id": device["pci_bus_id"],
            "gen_current": device["sta_gen"],
            "gen_max": device["cap_gen"],
            "width_current": device["sta_width"],
            "width_max": device["cap_width"],
            "healthy": healthy,
        })
    return {
        "gpus": gpus,
        "degraded_gpus": [gpu["pci_bus_id"] for gpu in gpus if gpu["healthy"] is False],
        "other_downgraded_ports": sum(1 for d in devices if d["downgraded"] and not d["nvidia_gpu"]),
    }
