# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""MIG devices through NVML: the profiles a GPU offers, its MIG mode, and creating or destroying its instances.

A MIG device as mig-parted makes it is one GPU instance with one compute instance spanning it.
:func:`read_mig_profiles` reads what a GPU offers, :func:`set_mig_mode` asks for a mode,
:func:`destroy_mig_instances` and :func:`create_mig_layout` remove and make instances (trying
other placement orders when the GPU answers InsufficientResources). Every function here does
NVML I/O (NVML API Reference, "Multi Instance GPU Management"); they take the pynvml module as
their first argument.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_names import ERROR_INSUFFICIENT_RESOURCES, return_code_name
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_session import call_setter, nvml_error_name


# GPU-instance slice count → NVML_COMPUTE_INSTANCE_PROFILE_* (nvml.h): a MIG device as mig-parted
# makes it is one compute instance spanning its whole GPU instance.
_CI_PROFILE_BY_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value or "").strip()


def _profile_name(info: Any) -> Optional[str]:
    name = _text(getattr(info, "name", ""))
    match = re.search(r"(\d+g\.\d+gb(?:\+[a-z0-9.]+)?)\s*$", name)
    if match:
        return match.group(1)
    slices = getattr(info, "sliceCount", None)
    memory = getattr(info, "memorySizeMB", None)
    if slices and memory:
        # profiles are named by compute slices and memory rounded up to whole GB (MIG User Guide)
        return "%dg.%dgb" % (slices, -(-int(memory) // 1024))
    return None


def read_mig_profiles(nvml: Any, handle: Any) -> List[Dict[str, Any]]:
    """Read the GPU-instance profiles a GPU offers. Does NVML I/O.

    Source: ``nvmlDeviceGetGpuInstanceProfileInfo`` for each ``NVML_GPU_INSTANCE_PROFILE_*``
    (``nvmlGpuInstanceProfileInfo_v2_t``: ``id``, ``sliceCount``, ``instanceCount``,
    ``memorySizeMB``, ``name`` such as ``"MIG 1g.10gb"``); profiles the GPU lacks answer
    NotSupported/InvalidArgument and are left out.

    :returns: ``[{name, id, profile, slice_count, instance_count, memory_mib}]`` (``profile`` is the
        ``NVML_GPU_INSTANCE_PROFILE_*`` value); ``[]`` for a GPU without MIG.
    """
    profiles = []  # type: List[Dict[str, Any]]
    seen = set()
    count = getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12)
    for profile in range(count):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
        except Exception as err:  # pylint: disable=broad-except
            if nvml_error_name(nvml, err) is None:
                raise
            continue
        name = _profile_name(info)
        if name is None or getattr(info, "id", None) in seen:
            continue
        seen.add(info.id)
        profiles.append({
            "name": name,
            "id": int(info.id),
            "profile": profile,
            "slice_count": int(getattr(info, "sliceCount", 0) or 0),
            "instance_count": int(getattr(info, "instanceCount", 0) or 0),
            "memory_mib": int(getattr(info, "memorySizeMB", 0) or 0),
        })
    return profiles


def set_mig_mode(nvml: Any, handle: Any, enabled: bool) -> Dict[str, Optional[str]]:
    """Ask NVML for a MIG mode. Does NVML I/O.

    Source: ``nvmlDeviceSetMigMode(device, NVML_DEVICE_MIG_ENABLE|DISABLE, &activationStatus)``: the
    mode becomes *pending* and is activated by a GPU reset (or at boot) when the GPU is in use or
    the platform requires it; ``activationStatus`` tells why it was not activated at once.

    :returns: ``{"error": NVML error name or None, "activation": error name or None}``.
    """
    mode = getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1) if enabled else getattr(nvml, "NVML_DEVICE_MIG_DISABLE", 0)
    try:
        status = nvml.nvmlDeviceSetMigMode(handle, mode)
    except Exception as err:  # pylint: disable=broad-except
        name = nvml_error_name(nvml, err)
        if name is None:
            raise
        return {"error": name, "activation": None}
    activation = None
    if isinstance(status, int) and status:
        activation = return_code_name(status)
    return {"error": None, "activation": activation}


def _probe(nvml: Any, func_name: str, parent: Any, ident: int) -> Any:
    try:
        return getattr(nvml, func_name)(parent, ident)
    except Exception as err:  # pylint: disable=broad-except
        if nvml_error_name(nvml, err) is None:
            raise
        return None


def destroy_mig_instances(nvml: Any, handle: Any, max_id: int = 32) -> Dict[str, Any]:
    """Destroy every compute instance and GPU instance of a GPU. Does NVML I/O.

    GPU instances are found by id (``nvmlDeviceGetGpuInstanceById`` for ids 0..``max_id``-1,
    NotFound skipped), their compute instances likewise (``nvmlGpuInstanceGetComputeInstanceById``
    for ids 0..7); compute instances are destroyed first (``nvmlComputeInstanceDestroy``), then the
    GPU instance (``nvmlGpuInstanceDestroy``). NVML answers InUse when a process runs on one.

    :returns: ``{"destroyed": [gpu instance ids], "error": first NVML error name or None}``.
    """
    destroyed = []
    for gi_id in range(max_id):
        gpu_instance = _probe(nvml, "nvmlDeviceGetGpuInstanceById", handle, gi_id)
        if gpu_instance is None:
            continue
        for ci_id in range(8):
            compute_instance = _probe(nvml, "nvmlGpuInstanceGetComputeInstanceById", gpu_instance, ci_id)
            if compute_instance is None:
                continue
            error = call_setter(nvml, "nvmlComputeInstanceDestroy", compute_instance)
            if error:
                return {"destroyed": destroyed, "error": error}
        error = call_setter(nvml, "nvmlGpuInstanceDestroy", gpu_instance)
        if error:
            return {"destroyed": destroyed, "error": error}
        destroyed.append(gi_id)
    return {"destroyed": destroyed, "error": None}


def _orderings(names: List[str], limit: int = 24) -> List[List[str]]:
    """Distinct orders of a multiset of profile names, the given order first, at most ``limit``."""
    result = []  # type: List[List[str]]

    def walk(prefix: List[str], rest: List[str]) -> None:
        if len(result) >= limit:
            return
        if not rest:
            result.append(list(prefix))
            return
        used = set()
        for position, name in enumerate(rest):
            if name in used:
                continue
            used.add(name)
            walk(prefix + [name], rest[:position] + rest[position + 1:])

    walk([], names)
    return result


# NVML_ERROR_INSUFFICIENT_RESOURCES: no room for this GPU instance where the GPU would place it.
_PLACEMENT_ERROR = return_code_name(ERROR_INSUFFICIENT_RESOURCES)


def create_mig_layout(nvml: Any, handle: Any, layout: Dict[str, int],
                      profiles: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Create a MIG layout on a GPU that has MIG enabled and no instances. Does NVML I/O.

    Each profile × count becomes that many GPU instances (``nvmlDeviceCreateGpuInstance``), each with
    one compute instance of its full size (``nvmlGpuInstanceGetComputeInstanceProfileInfo`` +
    ``nvmlGpuInstanceCreateComputeInstance``), as mig-parted does. Larger profiles go first; when the
    GPU answers InsufficientResources (a placement conflict) everything created is destroyed and the
    next order is tried, up to 24 orders.

    :param layout: ``{profile name: count}``.
    :param profiles: the GPU's profiles (:func:`read_mig_profiles`).
    :returns: ``{"created": [profile names], "error": NVML error name or None, "tried": int}``.
    """
    by_name = {profile["name"]: profile for profile in profiles}
    names = []
    for name in sorted(layout, key=lambda item: (-by_name[item]["slice_count"], -by_name[item]["memory_mib"], item)):
        names.extend([name] * layout[name])
    engine = getattr(nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
    last_error = None
    tried = 0
    for order in _orderings(names):
        tried += 1
        created = []
        last_error = None
        for name in order:
            profile = by_name[name]
            try:
                gpu_instance = nvml.nvmlDeviceCreateGpuInstance(handle, profile["id"])
                ci_profile = _CI_PROFILE_BY_SLICES.get(profile["slice_count"], 0)
                info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gpu_instance, ci_profile, engine)
                nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, info.id)
            except Exception as err:  # pylint: disable=broad-except
                last_error = nvml_error_name(nvml, err)
                if last_error is None:
                    raise
                break
            created.append(name)
        if last_error is None:
            return {"created": created, "error": None, "tried": tried}
        destroy_mig_instances(nvml, handle)
        if last_error != _PLACEMENT_ERROR:
            break
    return {"created": [], "error": last_error, "tried": tried}
