# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""CUDA toolkits and the NVIDIA drivers that run them.

The tables are :data:`branch_data.CUDA_TOOLKIT_MIN_DRIVER` (NVIDIA's "CUDA Toolkit and
Corresponding Driver Versions", source "cuda-release-notes") and
:data:`branch_data.CUDA_MAJOR_MIN_BRANCH` (CUDA minor version compatibility, source
"cuda-minor-compat"). Everything here is pure.

Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils import branch_data
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import version_key


def _toolkit_key(text: str) -> Tuple[int, int, int]:
    parts = [int(p) for p in text.split(".")]
    while len(parts) < 3:
        parts.append(0)
    return parts[0], parts[1], parts[2]


def cuda_minimum_driver(toolkit: Any, mode: str = "toolkit") -> Dict[str, Any]:
    """Minimum Linux x86_64 driver for a CUDA toolkit version.

    ``mode="toolkit"``: the driver the toolkit release requires for its full feature set,
    from NVIDIA's table "CUDA Toolkit and Corresponding Driver Versions" (source
    "cuda-release-notes"): ``"13.0"`` → ``580.65.06``, ``"12.2.2"`` → ``535.104.05``. An update
    release not in the table takes the entry of the release it updates. ``mode="minor"``: CUDA
    minor version compatibility, the oldest branch that runs the toolkit with limited features
    (source "cuda-minor-compat"): 13.x → R580, 12.x → R525, 11.x → R450.

    :param toolkit: ``"13.0"``, ``"12.2.2"``, ``12.8``.
    :returns: ``{"toolkit": str, "mode": str, "minimum_driver": str (a version for "toolkit",
        a branch for "minor"), "label": str, "source": str}``.
    :raises ValueError: for a malformed toolkit version or one the table does not cover (newer
        than its newest entry, or older than CUDA 11.0).
    """
    text = str(toolkit).strip()
    if not re.match(r"^\d+\.\d+(?:\.\d+)?$", text):
        raise ValueError("not a CUDA toolkit version: %r (expected e.g. 12.8 or 13.0.1)" % (toolkit,))
    if mode == "minor":
        major = text.split(".", maxsplit=1)[0]
        if major not in branch_data.CUDA_MAJOR_MIN_BRANCH:
            raise ValueError("CUDA %s: minor version compatibility is documented for CUDA 11, 12 and 13 only" % text)
        return {"toolkit": text, "mode": "minor", "minimum_driver": branch_data.CUDA_MAJOR_MIN_BRANCH[major],
                "label": "CUDA %s.x" % major, "source": branch_data.SOURCES["cuda-minor-compat"]}
    if mode != "toolkit":
        raise ValueError("mode must be 'toolkit' or 'minor', got %r" % (mode,))
    key = _toolkit_key(text)
    table = branch_data.CUDA_TOOLKIT_MIN_DRIVER
    newest = _toolkit_key(table[0][0])
    if key[:2] > newest[:2]:
        raise ValueError("CUDA %s is newer than the table (newest: CUDA %s, as of %s); use mode='minor' for the "
                         "branch floor" % (text, table[0][0], branch_data.AS_OF))
    same_minor = [(tk, label, driver) for tk, label, driver in table if _toolkit_key(tk)[:2] == key[:2]]
    if not same_minor:
        raise ValueError("CUDA %s is not in the table of toolkit driver versions" % text)
    at_or_below = [row for row in same_minor if _toolkit_key(row[0]) <= key]
    tk, label, driver = at_or_below[0] if at_or_below else same_minor[-1]
    return {"toolkit": text, "mode": "toolkit", "minimum_driver": driver,
            "label": "CUDA %s %s" % (".".join(tk.split(".")[:2]), label),
            "source": branch_data.SOURCES["cuda-release-notes"]}


def driver_supports_cuda(driver_version: str, toolkit: Any) -> bool:
    """Tell whether a driver runs a CUDA toolkit's applications with the full feature set.

    :returns: ``version_key(driver_version) >= version_key(cuda_minimum_driver(toolkit))``.
    :raises ValueError: see :func:`cuda_minimum_driver` and :func:`version_key`.
    """
    need = cuda_minimum_driver(toolkit)["minimum_driver"]
    return version_key(driver_version) >= version_key(need)
