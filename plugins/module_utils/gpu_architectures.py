# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA GPU architectures: their names, their order in time, and what each allows.

The vocabulary is :data:`branch_data.ARCHITECTURES` (name, NVIDIA's display name and NVML's
``nvmlDeviceArchitecture_t`` value; source nvml.h). Everything here is pure.

Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Sequence, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils import branch_data

_ARCH_ORDER = [entry["name"] for entry in branch_data.ARCHITECTURES]


_ARCH_DISPLAY = dict((entry["name"], entry["display"]) for entry in branch_data.ARCHITECTURES)


_ARCH_BY_NVML = dict((entry["nvml"], entry["name"]) for entry in branch_data.ARCHITECTURES)


_ARCH_ALIASES = {
    "ada lovelace": "ada",
    "ada": "ada",
    "nvidia ampere": "ampere",
    "nvidia ampere architecture": "ampere",
    "ampere": "ampere",
}


#: The catalog's architecture names, oldest first (``("kepler", ..., "rubin")``).
ARCHITECTURE_NAMES = tuple(_ARCH_ORDER)


def normalize_architecture(value: Any) -> str:
    """Map a GPU architecture as the facts give it to the catalog's name.

    Accepts NVML's ``nvmlDeviceArchitecture_t`` integer (``9`` → ``"hopper"``, source nvml.h),
    the name nvidia-smi prints in ``<product_architecture>`` (``"Hopper"``, ``"Ada Lovelace"``,
    ``"Ampere"``) and the catalog names themselves.

    :returns: one of ``kepler``, ``maxwell``, ``pascal``, ``volta``, ``turing``, ``ampere``,
        ``ada``, ``hopper``, ``blackwell``, ``rubin``.
    :raises ValueError: for ``None``, an unknown name or an unknown NVML value.
    """
    if value is None or isinstance(value, bool):
        raise ValueError("GPU architecture is unknown")
    if isinstance(value, int):
        if value in _ARCH_BY_NVML:
            return _ARCH_BY_NVML[value]
        raise ValueError("unknown NVML architecture value %r" % (value,))
    text = re.sub(r"\s+", " ", str(value).strip().lower())
    if text.isdigit():
        return normalize_architecture(int(text))
    text = _ARCH_ALIASES.get(text, text)
    if text in _ARCH_ORDER:
        return text
    raise ValueError("unknown GPU architecture %r" % (value,))


def architecture_display(name: str) -> str:
    """The architecture's name as NVIDIA writes it: ``"ada"`` → ``"Ada Lovelace"``."""
    return _ARCH_DISPLAY.get(name, name)


def architecture_rank(name: str) -> int:
    """Position of an architecture in time (Kepler 0 ... Rubin 9); unknown names rank -1."""
    return _ARCH_ORDER.index(name) if name in _ARCH_ORDER else -1


def summarize_gpus(gpus: Sequence[Dict[str, Any]]) -> str:
    """``[{"name": "Tesla V100-SXM2-32GB", "architecture": "volta"}] * 8`` → ``"8× Tesla V100-SXM2-32GB (Volta)"``.

    GPUs without a name (declared architectures) read ``"Volta GPUs (declared)"``.
    """
    if not gpus:
        return "no GPUs found"
    counts = {}  # type: Dict[Tuple[Any, str], int]
    order = []  # type: List[Tuple[Any, str]]
    for gpu in gpus:
        key = (gpu.get("name"), gpu.get("architecture"))
        if key not in counts:
            order.append(key)
            counts[key] = 0
        counts[key] += 1
    parts = []
    for name, arch in order:
        if name:
            parts.append("%d\u00d7 %s (%s)" % (counts[(name, arch)], name, architecture_display(arch)))
        else:
            parts.append("%s GPUs (declared)" % architecture_display(arch))
    return ", ".join(parts)


def allowed_module_types(architectures: Sequence[str]) -> List[str]:
    """Kernel module flavours these GPU architectures can use, whatever the branch.

    Open modules need Turing or later; proprietary modules are not supported on Blackwell and
    later (source "open-modules-blog").

    :returns: a sub-list of ``["open", "proprietary"]`` (empty for a mix of pre-Turing and
        Blackwell GPUs, which no driver supports on one node).
    """
    first_open = architecture_rank(branch_data.OPEN_MODULES_FIRST_ARCHITECTURE)
    last_prop = architecture_rank(branch_data.PROPRIETARY_MODULES_LAST_ARCHITECTURE)
    ranks = [architecture_rank(a) for a in architectures]
    types = []
    if all(r >= first_open for r in ranks):
        types.append("open")
    if all(r <= last_prop for r in ranks):
        types.append("proprietary")
    return types
