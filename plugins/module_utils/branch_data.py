# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NVIDIA data-center driver branch catalog, as data.

This is the built-in catalog that :mod:`branch_catalog` reads. It is kept as a Python
module (not a JSON file) so that Ansible ships it to managed nodes together with the code
that reads it (AnsiballZ only packs ``.py`` files of ``module_utils``).

Every fact carries the key of its source in :data:`SOURCES`. Dates of the form ``YYYY-MM``
are what NVIDIA publishes ("End of Life: June 2028"); ``YYYY-MM-DD`` where a release note
or ``releases.json`` gives the day. A branch whose end of life is a month is supported up to
and including the last day of that month.

Refreshing: :func:`branch_catalog.refresh_from_releases` merges a copy of NVIDIA's
``releases.json`` (branch classes, versions, release dates) into this data; end of life,
architectures and kernel module flavours are not in ``releases.json`` and stay as here.

Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

from ansible_collections.gpufleet.nvidia.plugins.module_utils import nvml_names

# The date this data was last checked against its sources.
AS_OF = "2026-11-29"

SOURCES = {
    "dc-drivers-620": "https://docs.nvidia.com/datacenter/tesla/drivers/620/"
    "supported-drivers-and-cuda-toolkit-versions.html (Table 2, CUDA and Drivers: R580 LTSB EOL June 2028, "
    "R595 PB EOL March 2027, R620 LTSB EOL September 2029, CUDA 13 for all three)",
    "dc-drivers-615": "https://docs.nvidia.com/datacenter/tesla/drivers/615/"
    "supported-drivers-and-cuda-toolkit-versions.html (R535 LTSB EOL June 2026 CUDA 12; R610 NFB EOL August 2026)",
    "dc-drivers-580": "https://docs.nvidia.com/datacenter/tesla/drivers/"
    "supported-drivers-and-cuda-toolkit-versions.html (v580 edition: R570 PB EOL February 2026, CUDA 12)",
    "dc-drivers-lifecycle": "https://docs.nvidia.com/datacenter/tesla/drivers/ (Driver Lifecycle: New Feature "
    "Branch, Production Branch (fixes for up to 1 year), Long Term Support Branch (3 years); NFBs are "
    "short-lived and have no end-of-life date)",
    "arch-matrix": "https://docs.nvidia.com/datacenter/tesla/drivers/"
    "cuda-toolkit-driver-and-architecture-matrix.html (last driver: Maxwell, Pascal, Volta R580; Kepler R470; "
    "first toolkit: Blackwell CUDA 12.8, Hopper CUDA 11.8)",
    "open-modules-blog": "https://developer.nvidia.com/blog/nvidia-transitions-fully-towards-open-source-gpu-"
    "kernel-modules/ (July 2024: open kernel modules are not compatible with Maxwell, Pascal, Volta; "
    "Grace Hopper and Blackwell must use them; R560 makes them the default)",
    "dig-620-kernel-modules": "https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/620/"
    "kernel-modules.html and recent-updates.html (R620: 'Proprietary Kernel Modules Removed')",
    "redistrib-620": "https://developer.download.nvidia.com/compute/nvidia-driver/redist/"
    "redistrib_620.70.06.json (620.70.06, release_date 2026-11-04, cuda_compat 13.5)",
    "releases-json": "https://docs.nvidia.com/datacenter/tesla/drivers/releases.json "
    "(branch types and release versions, newest first)",
    "release-notes": "https://docs.nvidia.com/datacenter/tesla/tesla-release-notes-<version>/index.html "
    "(535.104.05: 2023-08-29; 535.183.06: 2024-07-09; 570.133.20: 2025-04-17)",
    "gpu-operator": "NVIDIA GPU Operator v25.3.4 component matrix (580.82.07, 580.65.06, 570.172.08, "
    "570.158.01, 570.148.08, 535.261.03, 535.247.01) and NVIDIA/gpu-driver-container versions.mk "
    "(580.178.04, 595.91.07, 610.57.04)",
    "cuda-repo": "NVIDIA CUDA repository package versions, collected in the project's package reference "
    "(580.105.08, 580.126.09, 580.126.20, 580.159.03, 590.48.01, 595.45.04, 595.58.03, 595.71.05, 610.43.02)",
    "cuda-release-notes": "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html "
    "(Table 3, CUDA Toolkit and Corresponding Driver Versions, Linux x86_64)",
    "cuda-minor-compat": "https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html "
    "(CUDA 13.x >= 580, CUDA 12.x >= 525, CUDA 11.x >= 450)",
}

# GPU architectures, oldest first: nvml_names.ARCHITECTURES ({name, nvml, display}).
ARCHITECTURES = nvml_names.ARCHITECTURES

# Open kernel modules: Turing and later only; proprietary modules: not on Blackwell and later
# (source "open-modules-blog"). From R620 the proprietary flavour no longer exists
# ("dig-620-kernel-modules").
OPEN_MODULES_FIRST_ARCHITECTURE = "turing"
PROPRIETARY_MODULES_LAST_ARCHITECTURE = "hopper"

_UP_TO_BLACKWELL_WITH_LEGACY = ["maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"]
_TURING_TO_BLACKWELL = ["turing", "ampere", "ada", "hopper", "blackwell"]

BRANCHES = {
    "535": {
        "class": "ltsb",
        "released": "2023-06",
        "eol": "2026-06",
        "max_cuda_major": 12,
        "architectures": ["maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper"],
        "kernel_module_types": ["proprietary", "open"],
        "versions": [
            "535.54.03", "535.86.10", "535.104.05", "535.104.12", "535.129.03", "535.154.05",
            "535.161.07", "535.161.08", "535.183.01", "535.183.06", "535.216.01", "535.216.03",
            "535.230.02", "535.247.01", "535.261.03", "535.274.02",
        ],
        "sources": ["dc-drivers-615", "arch-matrix", "release-notes", "gpu-operator", "releases-json"],
    },
    "570": {
        "class": "pb",
        "released": "2025-01",
        "eol": "2026-02",
        "max_cuda_major": 12,
        "architectures": list(_UP_TO_BLACKWELL_WITH_LEGACY),
        "kernel_module_types": ["proprietary", "open"],
        "versions": [
            "570.86.10", "570.86.15", "570.124.06", "570.133.20", "570.148.08", "570.158.01",
            "570.172.08", "570.195.03", "570.211.01",
        ],
        "sources": ["dc-drivers-580", "arch-matrix", "release-notes", "gpu-operator", "releases-json"],
    },
    "580": {
        "class": "ltsb",
        "released": "2025-08",
        "eol": "2028-06",
        "max_cuda_major": 13,
        "architectures": list(_UP_TO_BLACKWELL_WITH_LEGACY),
        "kernel_module_types": ["proprietary", "open"],
        "versions": [
            "580.65.06", "580.82.07", "580.95.05", "580.105.08", "580.126.09", "580.126.20",
            "580.159.03", "580.178.04",
        ],
        "last_for": ["maxwell", "pascal", "volta"],
        "sources": ["dc-drivers-620", "arch-matrix", "gpu-operator", "cuda-repo", "releases-json"],
    },
    "590": {
        "class": "nfb",
        "released": "2025-12",
        "eol": None,
        "max_cuda_major": 13,
        "architectures": list(_TURING_TO_BLACKWELL),
        "kernel_module_types": ["proprietary", "open"],
        "versions": ["590.44.01", "590.48.01"],
        "sources": ["dc-drivers-lifecycle", "arch-matrix", "cuda-repo", "cuda-release-notes"],
    },
    "595": {
        "class": "pb",
        "released": "2026-03",
        "eol": "2027-03",
        "max_cuda_major": 13,
        "architectures": list(_TURING_TO_BLACKWELL),
        "kernel_module_types": ["proprietary", "open"],
        "versions": ["595.45.04", "595.58.03", "595.71.05", "595.91.07"],
        "sources": ["dc-drivers-620", "arch-matrix", "cuda-repo", "gpu-operator", "releases-json"],
    },
    "610": {
        "class": "nfb",
        "released": "2026-06",
        "eol": "2026-08",
        "max_cuda_major": 13,
        "architectures": list(_TURING_TO_BLACKWELL),
        "kernel_module_types": ["proprietary", "open"],
        "versions": ["610.43.02", "610.57.04"],
        "sources": ["dc-drivers-615", "arch-matrix", "cuda-repo", "gpu-operator"],
    },
    "615": {
        "class": "nfb",
        "released": "2026-09",
        "eol": None,
        "max_cuda_major": 13,
        "architectures": list(_TURING_TO_BLACKWELL),
        "kernel_module_types": ["proprietary", "open"],
        "versions": [],
        "sources": ["dc-drivers-lifecycle", "arch-matrix"],
    },
    "620": {
        "class": "ltsb",
        "released": "2026-11-04",
        "eol": "2029-09",
        "max_cuda_major": 13,
        "architectures": list(_TURING_TO_BLACKWELL),
        "kernel_module_types": ["open"],
        "versions": ["620.70.06"],
        "sources": ["dc-drivers-620", "arch-matrix", "dig-620-kernel-modules", "redistrib-620"],
    },
}

# CUDA toolkit release → minimum Linux x86_64 driver version, newest first (source
# "cuda-release-notes"). Entries: (toolkit version, release label, minimum driver version).
CUDA_TOOLKIT_MIN_DRIVER = (
    ("13.3", "GA", "610.43.02"),
    ("13.2.1", "Update 1", "595.58.03"),
    ("13.2", "GA", "595.45.04"),
    ("13.1.1", "Update 1", "590.48.01"),
    ("13.1", "GA", "590.44.01"),
    ("13.0.2", "Update 2", "580.95.05"),
    ("13.0.1", "Update 1", "580.82.07"),
    ("13.0", "GA", "580.65.06"),
    ("12.9.1", "Update 1", "575.57.08"),
    ("12.9", "GA", "575.51.03"),
    ("12.8.1", "Update 1", "570.124.06"),
    ("12.8", "GA", "570.26"),
    ("12.6.3", "Update 3", "560.35.05"),
    ("12.6.2", "Update 2", "560.35.03"),
    ("12.6.1", "Update 1", "560.35.03"),
    ("12.6", "GA", "560.28.03"),
    ("12.5.1", "Update 1", "555.42.06"),
    ("12.5", "GA", "555.42.02"),
    ("12.4.1", "Update 1", "550.54.15"),
    ("12.4", "GA", "550.54.14"),
    ("12.3.1", "Update 1", "545.23.08"),
    ("12.3", "GA", "545.23.06"),
    ("12.2.2", "Update 2", "535.104.05"),
    ("12.2.1", "Update 1", "535.86.09"),
    ("12.2", "GA", "535.54.03"),
    ("12.1.1", "Update 1", "530.30.02"),
    ("12.1", "GA", "530.30.02"),
    ("12.0.1", "Update 1", "525.85.12"),
    ("12.0", "GA", "525.60.13"),
    ("11.8", "GA", "520.61.05"),
    ("11.7.1", "Update 1", "515.48.07"),
    ("11.7", "GA", "515.43.04"),
    ("11.6.2", "Update 2", "510.47.03"),
    ("11.6.1", "Update 1", "510.47.03"),
    ("11.6", "GA", "510.39.01"),
    ("11.5.2", "Update 2", "495.29.05"),
    ("11.5.1", "Update 1", "495.29.05"),
    ("11.5", "GA", "495.29.05"),
    ("11.4.4", "Update 4", "470.82.01"),
    ("11.4.3", "Update 3", "470.82.01"),
    ("11.4.2", "Update 2", "470.57.02"),
    ("11.4.1", "Update 1", "470.57.02"),
    ("11.4", "GA", "470.42.01"),
    ("11.3.1", "Update 1", "465.19.01"),
    ("11.3", "GA", "465.19.01"),
    ("11.2.2", "Update 2", "460.32.03"),
    ("11.2.1", "Update 1", "460.32.03"),
    ("11.2", "GA", "460.27.03"),
    ("11.1.1", "Update 1", "455.32"),
    ("11.1", "GA", "455.23"),
    ("11.0.3", "Update 1", "450.51.06"),
    ("11.0.2", "GA", "450.51.05"),
)

# CUDA minor version compatibility: the oldest driver branch that runs any toolkit of a CUDA
# major release, with limited features (source "cuda-minor-compat").
CUDA_MAJOR_MIN_BRANCH = {"13": "580", "12": "525", "11": "450"}
