# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVML's names and enums: the one definition the collection imports everywhere.

- :data:`RETURN_CODES`: ``nvmlReturn_t`` values and their names as pynvml spells its exception
  classes without the ``NVMLError_`` prefix (``18`` → ``"LibRmVersionMismatch"``);
- :data:`COMPUTE_MODES`: ``nvmlComputeMode_t`` values and the names nvidia-smi prints in
  ``<compute_mode>``;
- :data:`ARCHITECTURES`: ``nvmlDeviceArchitecture_t`` values, oldest first, with the
  collection's short name and the name nvidia-smi prints in ``<product_architecture>``.

Source: ``nvml.h`` as shipped by the CUDA toolkit and nvidia-ml-py (``pynvml.py`` holds the same
constants), and the NVML API Reference Guide (docs.nvidia.com/deploy/nvml-api/), "Device Enums"
and "Error reporting". Standard library only; runs on managed nodes.
"""

from __future__ import annotations

from typing import Dict, Optional

# nvmlReturn_t (nvml.h: NVML_ERROR_UNINITIALIZED = 1 ... NVML_ERROR_UNKNOWN = 999). 0 is NVML_SUCCESS.
RETURN_CODES = {
    1: "Uninitialized",
    2: "InvalidArgument",
    3: "NotSupported",
    4: "NoPermission",
    6: "NotFound",
    7: "InsufficientSize",
    8: "InsufficientPower",
    9: "DriverNotLoaded",
    12: "LibraryNotFound",
    13: "FunctionNotFound",
    14: "CorruptedInforom",
    15: "GpuIsLost",
    16: "ResetRequired",
    17: "OperatingSystem",
    18: "LibRmVersionMismatch",
    19: "InUse",
    20: "Memory",
    21: "NoData",
    23: "InsufficientResources",
    25: "ArgumentVersionMismatch",
    26: "Deprecated",
    27: "NotReady",
    28: "GpuNotFound",
    29: "InvalidState",
    999: "Unknown",
}  # type: Dict[int, str]

# The return codes other modules name in their logic.
ERROR_NO_PERMISSION = 4
ERROR_DRIVER_NOT_LOADED = 9
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_GPU_IS_LOST = 15
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_INSUFFICIENT_RESOURCES = 23
ERROR_UNKNOWN = 999

# nvmlComputeMode_t (nvml.h: NVML_COMPUTEMODE_DEFAULT = 0 ... NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3).
COMPUTE_MODES = {
    0: "Default",
    1: "Exclusive_Thread",
    2: "Prohibited",
    3: "Exclusive_Process",
}  # type: Dict[int, str]

# NVML_COMPUTEMODE_EXCLUSIVE_THREAD: no longer supported by NVML ("Device Enums"); a policy may not ask for it.
COMPUTEMODE_EXCLUSIVE_THREAD = 1

# nvmlDeviceArchitecture_t, oldest first (nvml.h: NVML_DEVICE_ARCH_KEPLER = 2 ...
# NVML_DEVICE_ARCH_BLACKWELL = 10, NVML_DEVICE_ARCH_RUBIN = 13).
ARCHITECTURES = (
    {"name": "kepler", "nvml": 2, "display": "Kepler"},
    {"name": "maxwell", "nvml": 3, "display": "Maxwell"},
    {"name": "pascal", "nvml": 4, "display": "Pascal"},
    {"name": "volta", "nvml": 5, "display": "Volta"},
    {"name": "turing", "nvml": 6, "display": "Turing"},
    {"name": "ampere", "nvml": 7, "display": "Ampere"},
    {"name": "ada", "nvml": 8, "display": "Ada Lovelace"},
    {"name": "hopper", "nvml": 9, "display": "Hopper"},
    {"name": "blackwell", "nvml": 10, "display": "Blackwell"},
    {"name": "rubin", "nvml": 13, "display": "Rubin"},
)


def return_code_name(code: int) -> str:
    """The name of an ``nvmlReturn_t`` value: ``18`` → ``"LibRmVersionMismatch"``.

    :param code: the integer NVML returned (``NVMLError.value`` in pynvml).
    :returns: the name in :data:`RETURN_CODES`, or ``"Error<code>"`` for a code it does not hold
        (a newer driver's), so that the caller still has a word to report.
    :raises TypeError: when ``code`` is not an integer.
    """
    if not isinstance(code, int):
        raise TypeError("an nvmlReturn_t value is an integer, got %r" % (code,))
    return RETURN_CODES.get(code, "Error%d" % code)


def compute_mode_name(value: Optional[int]) -> Optional[str]:
    """The name nvidia-smi prints for an ``nvmlComputeMode_t`` value: ``3`` → ``"Exclusive_Process"``.

    :param value: the value ``nvmlDeviceGetComputeMode`` returned, or ``None`` (not read).
    :returns: the name in :data:`COMPUTE_MODES`, ``"Unknown(<value>)"`` for a value it does not
        hold, ``None`` for ``None``.
    :raises: nothing.
    """
    if value is None:
        return None
    return COMPUTE_MODES.get(value, "Unknown(%s)" % (value,))


def architecture_display_name(value: Optional[int]) -> Optional[str]:
    """The name nvidia-smi prints for an ``nvmlDeviceArchitecture_t`` value: ``9`` → ``"Hopper"``.

    :param value: the value ``nvmlDeviceGetArchitecture`` returned, or ``None`` (not read).
    :returns: the ``display`` name of :data:`ARCHITECTURES`, ``"Unknown(<value>)"`` for a value
        it does not hold, ``None`` for ``None``.
    :raises: nothing.
    """
    if value is None:
        return None
    for entry in ARCHITECTURES:
        if entry["nvml"] == value:
            return entry["display"]
    return "Unknown(%s)" % (value,)
