# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Carry out a MIG plan on a node: destroy, set the mode, reset, create, read back.

The order is mig-parted's (see :func:`apply_mig_plan`); the plan is ``mig_plan.plan_mig``'s and
the devices are made by :mod:`mig_devices`. Does NVML I/O, and the I/O of the reset callback the
caller passes (``nvidia-smi -r -i``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_devices import create_mig_layout, destroy_mig_instances, set_mig_mode
from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_plan import current_layout, format_layout
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_session import nvml_error_name, read_gpus


def _mig_current(gpu: Dict[str, Any]) -> bool:
    return bool((gpu.get("mig") or {}).get("mode_current"))


def apply_mig_plan(nvml: Any, plan: Dict[str, Any], profiles: Dict[int, List[Dict[str, Any]]],
                   reset: Optional[Any] = None) -> Dict[str, Any]:
    """Carry out a MIG plan: destroy, set mode, reset, create. Does NVML I/O (and the reset callback's).

    Order per GPU, as mig-parted does it: destroy the MIG devices that must go, set the MIG mode;
    then reset the GPUs whose mode is pending (one call of ``reset`` with their indices); then on
    every GPU whose MIG mode is now enabled and whose devices differ, destroy and create the devices.

    :param nvml: the pynvml module (initialised).
    :param plan: the result of ``mig_plan.plan_mig`` (blocked GPUs are the caller's decision).
    :param profiles: ``{index: profiles}`` (:func:`mig_devices.read_mig_profiles`).
    :param reset: ``reset(indices) -> (rc, output)`` that resets GPUs (``nvidia-smi -r -i``), or
        ``None`` when no reset is allowed.
    :returns: ``{"actions": {index: [str]}, "errors": {index: message}, "error_names": {index: NVML
        name}, "reset": {gpus, rc, output} or None, "still_pending": [indices whose mode still
        waits for a reset or reboot], "gpus": [GPU records read at the end], "stopped": "NoPermission"
        or None}``. The run stops at the first NoPermission.
    """
    actions = dict((gpu_plan["index"], []) for gpu_plan in plan["gpus"])  # type: Dict[int, List[str]]
    errors = {}  # type: Dict[int, str]
    names = {}  # type: Dict[int, str]
    outcome = {"actions": actions, "errors": errors, "error_names": names, "reset": None, "still_pending": [],
               "gpus": [], "stopped": None}  # type: Dict[str, Any]

    def fail(index: int, name: str, message: str) -> bool:
        errors[index] = "%s: NVML %s" % (message, name)
        names[index] = name
        if name == "NoPermission":
            outcome["stopped"] = name
            outcome["gpus"] = read_gpus(nvml)["gpus"]
            return True
        return False

    def destroy(index: int) -> Optional[bool]:
        """Destroy the GPU's MIG devices: ``None`` when done, else whether the run stops (:func:`fail`)."""
        actions[index].append("destroy_instances")
        done = destroy_mig_instances(nvml, handles[index])
        if done["error"]:
            return fail(index, done["error"], "destroying the MIG devices failed")
        return None

    work = [gpu_plan for gpu_plan in plan["gpus"] if gpu_plan["change"]]
    handles = {}  # type: Dict[int, Any]
    for gpu_plan in work:
        index = gpu_plan["index"]
        try:
            handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:  # pylint: disable=broad-except
            name = nvml_error_name(nvml, err)
            if name is None:
                raise
            fail(index, name, "opening the GPU failed")
            continue
        before = gpu_plan["before"]
        if before["mode_current"] and before["mig_devices"] and (
                gpu_plan["layout_change"] or not gpu_plan["wanted"]["mig_enabled"]):
            stopped = destroy(index)
            if stopped:
                return outcome
            if stopped is not None:
                continue
        if gpu_plan["set_mode"] is not None:
            actions[index].append("set_mode")
            answer = set_mig_mode(nvml, handles[index], gpu_plan["set_mode"])
            if answer["error"]:
                if fail(index, answer["error"], "setting MIG mode %s failed" % (
                        "enabled" if gpu_plan["set_mode"] else "disabled")):
                    return outcome
    current = dict((gpu["index"], gpu) for gpu in read_gpus(nvml)["gpus"])
    pending = [p["index"] for p in work
               if p["index"] not in errors and _mig_current(current[p["index"]]) != p["wanted"]["mig_enabled"]]
    if pending and reset is not None:
        rc, output = reset(pending)
        for index in pending:
            actions[index].append("reset")
        outcome["reset"] = {"gpus": pending, "rc": rc, "output": output}
        current = dict((gpu["index"], gpu) for gpu in read_gpus(nvml)["gpus"])
    outcome["still_pending"] = [index for index in pending if _mig_current(current[index]) != [
        p for p in work if p["index"] == index][0]["wanted"]["mig_enabled"]]
    for gpu_plan in work:
        index = gpu_plan["index"]
        wanted = gpu_plan["wanted"]
        if index in errors or not wanted["mig_enabled"] or not _mig_current(current[index]):
            continue
        now = current_layout(current[index])
        if now == wanted["mig_devices"]:
            continue
        if now:
            stopped = destroy(index)
            if stopped:
                return outcome
            if stopped is not None:
                continue
        if wanted["mig_devices"]:
            actions[index].append("create_instances")
            made = create_mig_layout(nvml, handles[index], wanted["mig_devices"], profiles.get(index) or [])
            if made["error"]:
                if fail(index, made["error"], "creating %s failed after %d placement order(s)" % (
                        format_layout(wanted["mig_devices"]), made["tried"])):
                    return outcome
    outcome["gpus"] = read_gpus(nvml)["gpus"]
    return outcome
