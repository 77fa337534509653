# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""PCIe link state of NVIDIA GPU endpoints from ``lspci -vvv``.

A PCIe switch port that runs below its own capability because the device below it is slower
(a Gen5 switch port in front of a Gen4 NVMe drive) is marked ``(downgraded)`` by lspci, yet
nothing is wrong with any GPU. A GPU link check therefore looks only at NVIDIA endpoints
(vendor 10de, class 03xx: "3D controller", "VGA compatible controller") and compares each one's
own ``LnkSta`` with what its link can attain: the lower of its own ``LnkCap`` and its upstream
port's (the bridge whose ``Bus: secondary=`` is the GPU's bus), since a Gen5 GPU behind a Gen4
port runs Gen4 by design. An idle GPU lowers its link speed to save power (the link trains up
under load), so a speed below the attainable one is degraded only when the GPU is known not to
be idle; a width below the attainable one is degraded whatever the load (the width does not
change with power states).

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
_BUS_NUMBERS = re.compile(r"^\s*Bus: primary=(?P<primary>[0-9a-fA-F]+), secondary=(?P<secondary>[0-9a-fA-F]+)")


def _gen(speed: Optional[str]) -> Optional[int]:
    return None if speed is None else SPEED_TO_GEN.get(speed)


def parse_lspci_links(text: str) -> List[Dict[str, Any]]:
    """Parse ``lspci -vvv`` (or a filtered part of it) into one record per device.

    :param text: the output of ``lspci -vvv``; devices without a PCI Express capability are
        kept with ``None`` link values.
    :returns: ``[{"pci_bus_id": "0000:19:00.0", "device_class": "3D controller",
        "description": str, "nvidia_gpu": bool, "cap_gen": int|None, "cap_width": int|None,
        "sta_gen": int|None, "sta_width": int|None, "downgraded": bool, "secondary_bus": int|None
        (a bridge's ``Bus: secondary=``: the bus of the devices below it)}]``;
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
                "downgraded": False, "secondary_bus": None,
            }
            devices.append(current)
            continue
        bus_numbers = _BUS_NUMBERS.match(line)
        if bus_numbers and current is not None:
            current["secondary_bus"] = int(bus_numbers.group("secondary"), 16)
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


def _upstream(device: Dict[str, Any], devices: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The bridge whose secondary bus is the device's bus (same PCI domain), or ``None``."""
    bus_id = device["pci_bus_id"] or ""
    parts = bus_id.split(":")
    if len(parts) != 3:
        return None
    domain, bus = parts[0], int(parts[1], 16)
    for other in devices:
        if other["secondary_bus"] == bus and (other["pci_bus_id"] or "").split(":")[0] == domain:
            return other
    return None


def _lower(a: Optional[int], b: Optional[int]) -> Optional[int]:
    return a if b is None else b if a is None else min(a, b)


def gpu_link_report(devices: List[Dict[str, Any]], idle: Optional[Dict[str, Optional[bool]]] = None) -> Dict[str, Any]:
    """Judge the links of NVIDIA GPU endpoints only.

    :param devices: records of :func:`parse_lspci_links`.
    :param idle: PCI bus id → whether the GPU was idle when read (``True``: clocks event reason
        ``gpu_idle`` or 0 % utilization; ``False``: busy; ``None`` or absent: unknown).
    :returns: ``{"gpus": [{pci_bus_id, gen_current, gen_max, width_current, width_max,
        upstream (the bridge's bus id or None), gen_attainable, width_attainable, healthy (True,
        False, or None: not judged), note (why, when not judged or degraded)}], "degraded_gpus":
        [pci_bus_id], "other_downgraded_ports": int}``. A GPU is degraded when its width is below
        the attainable width, or its speed below the attainable speed while it is known not to be
        idle; a speed below the attainable one on an idle GPU, or one whose load is unknown, is not
        judged (``healthy`` ``None``). ``other_downgraded_ports`` counts downgraded non-GPU
        devices and switch ports, which say nothing about the GPUs.
    :raises: nothing.
    """
    idle = idle or {}
    gpus = []
    for device in devices:
        if not device["nvidia_gpu"]:
            continue
        upstream = _upstream(device, devices)
        gen_attainable = _lower(device["cap_gen"], upstream["cap_gen"] if upstream else None)
        width_attainable = _lower(device["cap_width"], upstream["cap_width"] if upstream else None)
        healthy = None  # type: Optional[bool]
        note = None  # type: Optional[str]
        sta_gen, sta_width = device["sta_gen"], device["sta_width"]
        if sta_gen is not None and gen_attainable is not None:
            healthy = True
            if sta_width is not None and width_attainable is not None and sta_width < width_attainable:
                healthy, note = False, "width x%d of an attainable x%d" % (sta_width, width_attainable)
            if sta_gen < gen_attainable:
                is_idle = idle.get(device["pci_bus_id"])
                if is_idle is False:
                    healthy = False
                    note = "; ".join(n for n in (note, "Gen%d of an attainable Gen%d under load" % (
                        sta_gen, gen_attainable)) if n)
                elif healthy:
                    healthy = None
                    note = "Gen%d of an attainable Gen%d while the GPU is %s: an idle link trains down to save " \
                           "power; not judged" % (sta_gen, gen_attainable, "idle" if is_idle else "of unknown load")
            elif device["cap_gen"] is not None and gen_attainable < device["cap_gen"] and healthy:
                note = "Gen%d: the upstream port %s allows no more" % (sta_gen, upstream["pci_bus_id"])
        gpus.append({
            "pci_bus_id": device["pci_bus_id"],
            "gen_current": sta_gen,
            "gen_max": device["cap_gen"],
            "width_current": sta_width,
            "width_max": device["cap_width"],
            "upstream": upstream["pci_bus_id"] if upstream else None,
            "gen_attainable": gen_attainable,
            "width_attainable": width_attainable,
            "healthy": healthy,
            "note": note,
        })
    return {
        "gpus": gpus,
        "degraded_gpus": [gpu["pci_bus_id"] for gpu in gpus if gpu["healthy"] is False],
        "other_downgraded_ports": sum(1 for d in devices if d["downgraded"] and not d["nvidia_gpu"]),
    }
