# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Static facts the simulation needs: CUDA version per branch, which branch and module flavor
drives which GPU architecture, and the kernel-log text of the Xid codes it can emit.

Sources: NVIDIA driver release notes and "Open Linux Kernel Modules" README chapter (open
modules need Turing or later; Blackwell needs them), the R580 notes (last branch for
Maxwell/Pascal/Volta), the R620 installation guide (proprietary modules removed), the
``redistrib_620.70.06.json`` manifest (``cuda_compat`` 13.5) and the Xid catalogue of the
NVIDIA GPU deployment guide. Message bodies are written for this simulation in the shape
``NVRM: Xid (PCI:dddd:bb:dd): <code>, pid=..., name=..., <text>`` used by the real driver.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

#: CUDA driver API version reported per driver branch (nvmlSystemGetCudaDriverVersion).
CUDA_BY_BRANCH: Dict[int, Tuple[int, int]] = {
    535: (12, 2),
    550: (12, 4),
    570: (12, 8),
    575: (12, 9),
    580: (13, 0),
    590: (13, 1),
    595: (13, 2),
    610: (13, 3),
    620: (13, 5),
}

#: Architecture facts: NVML enum, name nvidia-smi prints, first and last driver branch that
#: drive it, and which module flavors can drive it.
ARCHITECTURES: Dict[str, Dict[str, object]] = {
    "Volta": {"nvml": 5, "min_branch": 384, "max_branch": 580, "open": False, "proprietary": True},
    "Turing": {"nvml": 6, "min_branch": 410, "max_branch": None, "open": True, "proprietary": True},
    "Ampere": {"nvml": 7, "min_branch": 450, "max_branch": None, "open": True, "proprietary": True},
    "Ada Lovelace": {"nvml": 8, "min_branch": 525, "max_branch": None, "open": True, "proprietary": True},
    "Hopper": {"nvml": 9, "min_branch": 520, "max_branch": None, "open": True, "proprietary": True},
    "Blackwell": {"nvml": 10, "min_branch": 570, "max_branch": None, "open": True, "proprietary": False},
}

#: Xid code -> (message text after "pid=..., name=..., ", process name or None).
XID_TEXT: Dict[int, Tuple[str, Optional[str]]] = {
    13: ("Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address", "python3"),
    31: ("Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3c_40000000. "
         "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ", "python3"),
    43: ("Ch 00000010", "python3"),
    45: ("Ch 00000010", "python3"),
    48: ("An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
         "subpartition 0.", None),
    61: ("Internal micro-controller breakpoint/warning (0x1a3c)", None),
    62: ("Internal micro-controller halt (0x2f0c)", None),
    63: ("Row Remapper: New row marked for remapping, reset gpu to activate.", None),
    64: ("Row Remapper: Failed to remap a row (row remapping failure).", None),
    74: ("NVLink: fatal error detected on link 4(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)", None),
    79: ("GPU has fallen off the bus.", None),
    92: ("High single-bit ECC error rate detected", None),
    94: ("Contained: SM (0x1). RST: No, D-RST: No", "python3"),
    95: ("Uncontained: FBHUB. RST: Yes, D-RST: No", None),
    109: ("Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x3c000", "python3"),
    119: ("Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) "
          "(0x20800a4c 0x4).", "nvidia-smi"),
    120: ("GSP task exception (0x1e)", None),
}


#: How a driver moves a GPU's contract in this simulation, in the shape real updates have (a
#: branch that reserves more memory for itself, a version with another default application
#: clock). The values are invented for the simulation: offsets from the GPU profile's values,
#: per branch and per exact version, added together.
CONTRACT_OFFSETS: Dict[str, Dict[object, Dict[str, int]]] = {
    "branch": {620: {"reserved_mib": 64}},
    "version": {"620.82.01": {"app_graphics_mhz": -45}},
}


def contract_offsets(driver_version: str) -> Dict[str, int]:
    """``{"reserved_mib": n, "app_graphics_mhz": n}``: how far ``driver_version`` moves a GPU's
    reserved memory and default application clock from its profile (:data:`CONTRACT_OFFSETS`)."""
    out = {"reserved_mib": 0, "app_graphics_mhz": 0}
    for offsets in (CONTRACT_OFFSETS["branch"].get(branch_of(driver_version)) or {},
                    CONTRACT_OFFSETS["version"].get(driver_version) or {}):
        for key, value in offsets.items():
            out[key] += int(value)
    return out


def parse_version(version: str) -> Tuple[int, ...]:
    """``"580.126.20"`` -> ``(580, 126, 20)`` (non-numeric parts dropped)."""
    out = []
    for part in version.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if digits:
            out.append(int(digits))
    return tuple(out)


def branch_of(version: str) -> int:
    """Driver branch (first component) of a driver version string."""
    return parse_version(version)[0]


def cuda_version(driver_version: str) -> Tuple[int, int]:
    """(major, minor) CUDA driver API version for a driver version, by branch (nearest lower)."""
    branch = branch_of(driver_version)
    known = sorted(CUDA_BY_BRANCH)
    best = known[0]
    for candidate in known:
        if candidate <= branch:
            best = candidate
    return CUDA_BY_BRANCH[best]


def nvml_version(driver_version: str) -> str:
    """nvmlSystemGetNVMLVersion string: ``<cuda major>.<driver version>`` (e.g. 13.580.126.20)."""
    return "%d.%s" % (cuda_version(driver_version)[0], driver_version)


def support_problem(architecture: str, driver_version: str, flavor: str) -> Optional[str]:
    """Why ``flavor`` modules of ``driver_version`` cannot drive ``architecture``, or None.

    Returns one of ``"needs_open"``, ``"open_unsupported"``, ``"legacy"`` (branch too new for
    the GPU), ``"too_new"`` (GPU newer than the branch).
    """
    facts = ARCHITECTURES.get(architecture)
    if facts is None:
        return None
    branch = branch_of(driver_version)
    if branch < int(facts["min_branch"]):  # type: ignore[arg-type]
        return "too_new"
    if facts["max_branch"] is not None and branch > int(facts["max_branch"]):  # type: ignore[arg-type]
        return "legacy"
    if flavor == "open" and not facts["open"]:
        return "open_unsupported"
    if flavor == "proprietary" and not facts["proprietary"]:
        return "needs_open"
    return None
