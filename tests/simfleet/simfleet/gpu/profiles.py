# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU node classes of the simulated fleet.

Facts and their sources (see tests/simfleet/README.md, "GPU simulation"):

- names, PCI device/subsystem ids, VBIOS, framebuffer size, clocks, power limits, PCIe
  generation: ``nvidia-smi -q -x`` captures of real HGX H100 and B200 boards with driver
  580.105.08 (NVIDIA/k8s-test-infra, tests/e2e/go/assertions/nvidiasmi/testdata/hardware/),
  the A100 field case (tests/fixtures/cases/01-...), NVIDIA product briefs; A100 / L40S /
  V100 power limits as given in the fleet issue;
- MIG profiles (name, profile id, max instances, SMs, memory, engines): NVIDIA MIG User Guide
  "Supported MIG Profiles" and ``nvidia-smi mig -lgip`` listings; B200 per-profile SM counts
  and memory sizes are derived from the 7-slice/8-slice split (no listing was found);
- architecture rules: open kernel modules from Turing on, required from Blackwell on;
  R580 is the last branch for Volta.

Each profile: ``count`` GPUs named ``name``; ``bus_ids`` in enumeration order; power in watts;
``mig_profiles`` entries are (nvml_profile, id, name, compute slices, memory slices,
max count, SMs, copy engines, decoders, encoders, jpeg, ofa, memory MiB).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

#: NVML_GPU_INSTANCE_PROFILE_* values (nvml.h / pynvml constants)
_P1, _P2, _P3, _P4, _P7, _P1_REV1, _P1_REV2 = 0x0, 0x1, 0x2, 0x3, 0x4, 0x7, 0x9

MigRow = Tuple[int, int, str, int, int, int, int, int, int, int, int, int, int]

_A100_40GB_MIG: List[MigRow] = [
    (_P1, 19, "1g.5gb", 1, 1, 7, 14, 1, 0, 0, 0, 0, 4864),
    (_P1_REV1, 20, "1g.5gb+me", 1, 1, 1, 14, 1, 1, 0, 1, 1, 4864),
    (_P1_REV2, 15, "1g.10gb", 1, 2, 4, 14, 1, 1, 0, 0, 0, 9856),
    (_P2, 14, "2g.10gb", 2, 2, 3, 28, 2, 1, 0, 0, 0, 9856),
    (_P3, 9, "3g.20gb", 3, 4, 2, 42, 3, 2, 0, 0, 0, 19968),
    (_P4, 5, "4g.20gb", 4, 4, 1, 56, 4, 2, 0, 0, 0, 19968),
    (_P7, 0, "7g.40gb", 7, 8, 1, 98, 7, 5, 0, 1, 1, 40192),
]

_H100_80GB_MIG: List[MigRow] = [
    (_P1, 19, "1g.10gb", 1, 1, 7, 16, 1, 1, 0, 1, 0, 9984),
    (_P1_REV1, 20, "1g.10gb+me", 1, 1, 1, 16, 1, 1, 0, 1, 1, 9984),
    (_P1_REV2, 15, "1g.20gb", 1, 2, 4, 26, 1, 1, 0, 1, 0, 20096),
    (_P2, 14, "2g.20gb", 2, 2, 3, 32, 2, 2, 0, 2, 0, 20096),
    (_P3, 9, "3g.40gb", 3, 4, 2, 60, 3, 3, 0, 3, 0, 40448),
    (_P4, 5, "4g.40gb", 4, 4, 1, 64, 4, 4, 0, 4, 0, 40448),
    (_P7, 0, "7g.80gb", 7, 8, 1, 132, 8, 7, 0, 7, 1, 81152),
]

_B200_MIG: List[MigRow] = [
    (_P1, 19, "1g.23gb", 1, 1, 7, 18, 1, 1, 0, 1, 0, 22912),
    (_P1_REV1, 20, "1g.23gb+me", 1, 1, 1, 18, 1, 1, 0, 1, 1, 22912),
    (_P1_REV2, 15, "1g.45gb", 1, 2, 4, 18, 1, 1, 0, 1, 0, 45824),
    (_P2, 14, "2g.45gb", 2, 2, 3, 36, 2, 2, 0, 2, 0, 45824),
    (_P3, 9, "3g.90gb", 3, 4, 2, 54, 3, 3, 0, 3, 0, 91648),
    (_P4, 5, "4g.90gb", 4, 4, 1, 72, 4, 4, 0, 4, 0, 91648),
    (_P7, 0, "7g.180gb", 7, 8, 1, 144, 8, 7, 0, 7, 1, 182272),
]

PROFILES: Dict[str, Dict[str, Any]] = {
    "h100": {
        "group": "gpu_h100", "count": 8, "name": "NVIDIA H100 80GB HBM3", "brand": "NVIDIA",
        "architecture": "Hopper", "cuda_cc": (9, 0),
        "pci_device_id": 0x2330, "pci_subsystem_id": 0x16C1,
        "bus_ids": ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"],
        "vbios_version": "96.00.99.00.01", "board_part_number": "692-2G520-0200-000",
        "gpu_part_number": "2330-885-A1", "inforom_image": "G520.0200.00.05",
        "memory_mib": 81559, "reserved_mib": 480, "bar1_mib": 131072,
        "power_w": {"default": 700, "min": 200, "max": 700}, "idle_draw_w": 68.92,
        "clocks_mhz": {"max_graphics": 1980, "max_sm": 1980, "max_mem": 2619, "max_video": 1545,
                       "idle_graphics": 345, "idle_mem": 2619, "idle_video": 765},
        "pcie": {"gen": 5, "width": 16}, "temperature_c": {"gpu": 29, "memory": 37},
        "thresholds_c": {"shutdown": 92, "slowdown": 89, "max_gpu": 87, "max_mem": 95},
        "nvswitch": True, "nvswitch_count": 4, "open_modules_only": False,
        "remapped_rows": True, "retired_pages": False, "mig_profiles": _H100_80GB_MIG,
    },
    "a100": {
        "group": "gpu_a100", "count": 8, "name": "NVIDIA A100-SXM4-40GB", "brand": "NVIDIA",
        "architecture": "Ampere", "cuda_cc": (8, 0),
        "pci_device_id": 0x20B0, "pci_subsystem_id": 0x134F,
        "bus_ids": ["07", "0F", "47", "4E", "87", "90", "B7", "BD"],
        "vbios_version": "92.00.45.00.03", "board_part_number": "692-2G506-0200-003",
        "gpu_part_number": "20B0-884-A1", "inforom_image": "G506.0200.00.04",
        "memory_mib": 40960, "reserved_mib": 634, "bar1_mib": 65536,
        "power_w": {"default": 400, "min": 100, "max": 400}, "idle_draw_w": 54.31,
        "clocks_mhz": {"max_graphics": 1410, "max_sm": 1410, "max_mem": 1215, "max_video": 1290,
                       "idle_graphics": 210, "idle_mem": 1215, "idle_video": 585},
        "pcie": {"gen": 4, "width": 16}, "temperature_c": {"gpu": 31, "memory": 40},
        "thresholds_c": {"shutdown": 92, "slowdown": 89, "max_gpu": 85, "max_mem": 95},
        "nvswitch": True, "nvswitch_count": 6, "open_modules_only": False,
        "remapped_rows": True, "retired_pages": False, "mig_profiles": _A100_40GB_MIG,
    },
    "l40s": {
        "group": "gpu_l40s", "count": 4, "name": "NVIDIA L40S", "brand": "NVIDIA",
        "architecture": "Ada Lovelace", "cuda_cc": (8, 9),
        "pci_device_id": 0x26B9, "pci_subsystem_id": 0x1851,
        "bus_ids": ["41", "61", "A1", "C1"],
        "vbios_version": "95.02.66.00.02", "board_part_number": "900-2G133-0080-000",
        "gpu_part_number": "26B9-896-A1", "inforom_image": "G133.0242.00.03",
        "memory_mib": 46068, "reserved_mib": 573, "bar1_mib": 65536,
        "power_w": {"default": 350, "min": 100, "max": 350}, "idle_draw_w": 34.52,
        "clocks_mhz": {"max_graphics": 2520, "max_sm": 2520, "max_mem": 9001, "max_video": 1965,
                       "idle_graphics": 210, "idle_mem": 405, "idle_video": 765},
        "pcie": {"gen": 4, "width": 16}, "temperature_c": {"gpu": 30, "memory": None},
        "thresholds_c": {"shutdown": 94, "slowdown": 91, "max_gpu": 88, "max_mem": None},
        "nvswitch": False, "nvswitch_count": 0, "open_modules_only": False,
        "remapped_rows": True, "retired_pages": False, "mig_profiles": [],
    },
    "v100": {
        "group": "gpu_v100", "count": 8, "name": "Tesla V100-SXM2-32GB", "brand": "Tesla",
        "architecture": "Volta", "cuda_cc": (7, 0),
        "pci_device_id": 0x1DB5, "pci_subsystem_id": 0x1249,
        "bus_ids": ["06", "07", "0A", "0B", "85", "86", "89", "8A"],
        "vbios_version": "88.00.80.00.01", "board_part_number": "900-2G503-0430-000",
        "gpu_part_number": "1DB5-895-A1", "inforom_image": "G503.0203.00.04",
        "memory_mib": 32768, "reserved_mib": 0, "bar1_mib": 32768,
        "power_w": {"default": 300, "min": 150, "max": 300}, "idle_draw_w": 42.17,
        "clocks_mhz": {"max_graphics": 1530, "max_sm": 1530, "max_mem": 877, "max_video": 1372,
                       "idle_graphics": 135, "idle_mem": 877, "idle_video": 555},
        "pcie": {"gen": 3, "width": 16}, "temperature_c": {"gpu": 33, "memory": 31},
        "thresholds_c": {"shutdown": 90, "slowdown": 87, "max_gpu": 83, "max_mem": 85},
        "nvswitch": False, "nvswitch_count": 0, "open_modules_only": False,
        "remapped_rows": False, "retired_pages": True, "mig_profiles": [],
    },
    "b200": {
        "group": "gpu_b200", "count": 8, "name": "NVIDIA B200", "brand": "NVIDIA",
        "architecture": "Blackwell", "cuda_cc": (10, 0),
        "pci_device_id": 0x2901, "pci_subsystem_id": 0x1999,
        "bus_ids": ["1B", "43", "52", "61", "9D", "C3", "D1", "DF"],
        "vbios_version": "97.00.FA.00.09", "board_part_number": "692-2G525-0220-500",
        "gpu_part_number": "2901-886-A1", "inforom_image": "G525.0220.00.03",
        "memory_mib": 183359, "reserved_mib": 728, "bar1_mib": 262144,
        "power_w": {"default": 1000, "min": 200, "max": 1000}, "idle_draw_w": 195.79,
        "clocks_mhz": {"max_graphics": 1965, "max_sm": 1965, "max_mem": 3996, "max_video": 1965,
                       "idle_graphics": 120, "idle_mem": 3996, "idle_video": 600},
        "pcie": {"gen": 5, "width": 16}, "temperature_c": {"gpu": 39, "memory": 39},
        "thresholds_c": {"shutdown": 92, "slowdown": 89, "max_gpu": 87, "max_mem": 95},
        "nvswitch": True, "nvswitch_count": 2, "open_modules_only": True,
        "remapped_rows": True, "retired_pages": False, "mig_profiles": _B200_MIG,
    },
}


def mig_profile_dicts(rows: List[MigRow]) -> List[Dict[str, Any]]:
    """MIG profile rows as the dicts kept in the state (keys used by simgpu.device)."""
    keys = ("nvml_profile", "id", "name", "slices", "memory_slices", "max_count", "sm", "ce", "dec", "enc",
            "jpeg", "ofa", "memory_mib")
    return [dict(zip(keys, row)) for row in rows]
