#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_mig
short_description: Hold the MIG mode and MIG layout of NVIDIA GPUs to a mig-parted style declaration
version_added: "0.1.0"
description:
  - Declares MIG mode and MIG devices per set of GPUs in the format of NVIDIA's mig-parted
    (C(version) V(v1), C(mig-configs), entries with C(devices), C(device-filter), C(mig-enabled),
    C(mig-devices)) and makes the GPUs match it through NVML.
  - The layout is validated against each GPU's MIG profiles (C(nvmlDeviceGetGpuInstanceProfileInfo);
    the profile exists, the count fits, compute and memory slices add up) before any GPU is touched.
  - Refuses to touch a GPU that runs compute processes, naming each process, unless O(force) is set.
  - A MIG mode change is pending until a GPU reset. When O(allow_reset) is set the module resets the
    GPUs that need it (C(nvidia-smi -r)); when the reset is refused or not allowed, the GPUs are reported
    in RV(reboot_required) with what holds them (compute processes, the C(nvidia_drm) kernel module,
    C(nvidia-persistenced), other clients of C(/dev/nvidia*)) and what to do.
  - MIG devices do not survive a reboot or GPU reset; the C(gpufleet.nvidia.gpu_policy) role installs a
    boot unit that creates them again.
  - With O(mode=assert), only checks that the GPUs match, like C(nvidia-mig-parted assert); never changes anything.
options:
  config:
    description:
      - A whole mig-parted configuration (C(version) V(v1) and C(mig-configs)); O(label) picks the configuration.
      - Mutually exclusive with O(layout).
    type: dict
  label:
    description:
      - The name of the configuration in O(config) to apply, for example V(all-1g.10gb).
    type: str
  layout:
    description:
      - The entries of one configuration, given directly (the list under a label of C(mig-configs)).
      - Mutually exclusive with O(config).
    type: list
    elements: dict
  mode:
    description:
      - V(apply) makes the GPUs match; V(assert) only checks and fails when they do not.
    type: str
    choices: [apply, assert]
    default: apply
  force:
    description:
      - Change GPUs even when compute processes run on them. NVML still refuses a GPU that is in use.
    type: bool
    default: false
  allow_reset:
    description:
      - Reset the GPUs whose MIG mode change is pending (C(nvidia-smi -r -i)), to activate it without a reboot.
      - When V(false), or when the reset is refused, the change is reported in RV(reboot_required).
    type: bool
    default: true
  nvidia_smi:
    description:
      - The C(nvidia-smi) command used for the GPU reset.
    type: str
    default: nvidia-smi
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.nvidia.action_group
  - gpufleet.nvidia.gpu_setters
attributes:
  check_mode:
    support: full
    details: Reads the GPUs and their MIG profiles, validates the layout and reports what would change.
  diff_mode:
    support: full
    details: MIG mode (current and pending) and MIG devices per GPU, before and after (read back).
  platform:
    platforms: posix
notes:
  - This module supports check mode.
  - Each MIG device is one GPU instance holding one compute instance of the same size, as mig-parted creates them.
seealso:
  - module: gpufleet.nvidia.gpu_policy
  - name: NVIDIA mig-parted
    description: The configuration format this module reads.
    link: https://github.com/NVIDIA/mig-parted
  - name: NVIDIA MIG User Guide
    description: MIG profiles, GPU reset and the MIG mode.
    link: https://docs.nvidia.com/datacenter/tesla/mig-user-guide/
author:
  - gpufleet maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Split every H100 of the node into seven 1g.10gb devices
  gpufleet.nvidia.gpu_mig:
    layout:
      - devices: all
        mig-enabled: true
        mig-devices:
          "1g.10gb": 7
  become: true

- name: Apply one label of a mig-parted configuration kept in the inventory
  gpufleet.nvidia.gpu_mig:
    config: "{{ mig_parted_config }}"
    label: all-balanced

- name: Only check that MIG is off on GPUs 0-3 and that A100-40GB GPUs (0x20B010DE) have 3g.20gb x2
  gpufleet.nvidia.gpu_mig:
    mode: assert
    layout:
      - devices: [0, 1, 2, 3]
        mig-enabled: false
      - devices: [4, 5, 6, 7]
        device-filter: "0x20B010DE"
        mig-enabled: true
        mig-devices:
          "3g.20gb": 2

- name: Change the MIG mode but leave the reset to the next reboot
  gpufleet.nvidia.gpu_mig:
    layout:
      - devices: all
        mig-enabled: false
    allow_reset: false
  register: __mig
"""

RETURN = r"""
changed:
  description: Whether MIG mode (current or pending) or MIG devices read back differ from before.
  returned: always
  type: bool
gpus:
  description: One entry per GPU a configuration entry matched.
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: NVML index.
      type: int
    uuid:
      description: GPU UUID.
      type: str
    pci_bus_id:
      description: PCI bus id.
      type: str
      sample: "0000:18:00.0"
    name:
      description: Product name.
      type: str
    wanted:
      description: C({mig_enabled, mig_devices}) as declared.
      type: dict
      sample: {"mig_enabled": true, "mig_devices": {"1g.10gb": 7}}
    before:
      description: C({mode_current, mode_pending, mig_devices}) before the run.
      type: dict
    after:
      description: C({mode_current, mode_pending, mig_devices}) read back after the run (as before in check mode).
      type: dict
    status:
      description:
        - C(ok) (already as wanted), C(applied), C(would_change) (check mode), C(reboot_required) (MIG mode
          pending, the reset was refused or not allowed), or C(failed).
      type: str
    actions:
      description: What was done, in order (C(destroy_instances), C(set_mode), C(reset), C(create_instances)).
      type: list
      elements: str
    processes:
      description: Compute processes found on the GPU, C({pid, name, used_memory_mib}).
      type: list
      elements: dict
    message:
      description: What happened, in words.
      type: str
reboot_required:
  description: Whether a MIG mode change waits for a reboot on some GPU.
  returned: always
  type: bool
reset:
  description: The GPU reset run, C({gpus, rc, output}), when one was needed.
  returned: when a reset was attempted
  type: dict
diagnosis:
  description:
    - Why a reset was refused and what to do, C({causes, message, remedy, gpus}); causes among C(compute_processes),
      C(nvidia_drm), C(nvidia_persistenced), C(device_holders), C(no_permission), C(unsupported), C(unknown).
  returned: when a reset was refused
  type: dict
skipped:
  description: GPUs an entry asked MIG of that have no MIG, C({index, reason}).
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_policy_plan import describe_gpu
from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_plan import (
    MigConfigError,
    assert_messages,
    blocked_message,
    current_layout,
    diagnose_reset_failure,
    parse_mig_config,
    plan_mig,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import error_name, load_pynvml
from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_apply import apply_mig_plan
from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_devices import read_mig_profiles
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_permission import (
    permission_message,
    read_permission_context,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_session import read_gpus, run_with_nvml
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_messages import classify_smi_output


def _mig_state(gpu):
    mig = gpu.get("mig") or {}
    current = mig.get("mode_current")
    pending = mig.get("mode_pending")
    if pending is None:
        pending = current
    return {
        "mode_current": None if current is None else bool(current),
        "mode_pending": None if pending is None else bool(pending),
        "mig_devices": current_layout(gpu),
    }


def _diff_side(states):
    return dict(("gpu%s" % index, state) for index, state in sorted(states.items()))


def _comm(pid):
    try:
        with open("/proc/%s/comm" % pid) as handle:
            return handle.readline().strip()
    except (IOError, OSError):
        return None


def _reset_holders():
    """What may hold the GPUs: nvidia_drm loaded, nvidia-persistenced pids, other /dev/nvidia* holders."""
    drm = os.path.isdir("/sys/module/nvidia_drm")
    persistenced = []
    holders = []
    own = os.getpid()
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        if pid == own:
            continue
        name = _comm(pid)
        if name == "nvidia-persistenced":
            persistenced.append(pid)
            continue
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if target.startswith("/dev/nvidia") and not target.startswith("/dev/nvidia-caps"):
                holders.append({"pid": pid, "name": name})
                break
    return drm, persistenced, holders


def _fail_permission(module, what, **extra):
    context = read_permission_context()
    module.fail_json(msg=permission_message(what, context["euid"], context["container"], context["cap_sys_admin"]),
                     **extra)


def _handle(module, nvml, index):
    try:
        return nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as err:  # pylint: disable=broad-except
        module.fail_json(msg="NVML could not open GPU %s: %s" % (index, error_name(nvml, err)))


def _entries(module):
    params = module.params
    try:
        if params["config"] is not None:
            return parse_mig_config(params["config"], params["label"])
        return parse_mig_config(params["layout"])
    except MigConfigError as err:
        module.fail_json(msg="MIG configuration refused: %s" % "; ".join(err.errors), errors=err.errors)


def run(module, nvml):
    """Plan, apply, reset when needed, read back; returns the result dict."""
    params = module.params
    entries = _entries(module)
    read = read_gpus(nvml)
    if read["error"]:
        module.fail_json(msg="NVML could not count the GPUs: %s" % read["error"])
    profiles = {}
    for gpu in read["gpus"]:
        if gpu.get("readable") is not False and (gpu.get("mig") or {}).get("mode_current") is not None:
            profiles[gpu["index"]] = read_mig_profiles(nvml, _handle(module, nvml, gpu["index"]))
    try:
        plan = plan_mig(entries, read["gpus"], profiles, strict=params["strict"])
    except MigConfigError as err:
        module.fail_json(msg="MIG layout refused before any GPU was changed: %s" % "; ".join(err.errors),
                         errors=err.errors)
    for item in plan["skipped"]:
        module.warn(item["reason"] + "; skipped")
    by_index = dict((gpu["index"], gpu) for gpu in read["gpus"])
    before = dict((gpu_plan["index"], gpu_plan["before"]) for gpu_plan in plan["gpus"])

    def entry(gpu_plan, after, status, actions, message=""):
        return {
            "index": gpu_plan["index"], "uuid": gpu_plan["uuid"], "pci_bus_id": gpu_plan["pci_bus_id"],
            "name": gpu_plan["name"], "wanted": gpu_plan["wanted"], "before": gpu_plan["before"], "after": after,
            "status": status, "actions": actions, "processes": gpu_plan["processes"], "message": message,
        }

    if params["mode"] == "assert":
        messages = assert_messages(plan)
        gpus = [entry(p, p["before"], "failed" if p["change"] else "ok", []) for p in plan["gpus"]]
        if messages:
            module.fail_json(msg="MIG layout does not match: %s" % "; ".join(messages), gpus=gpus,
                             mismatches=messages, skipped=plan["skipped"])
        return {"changed": False, "gpus": gpus, "reboot_required": False, "skipped": plan["skipped"]}

    if plan["blocked"] and not params["force"]:
        module.fail_json(msg=blocked_message(plan), skipped=plan["skipped"],
                         blocked=[{"index": p["index"], "pci_bus_id": p["pci_bus_id"], "processes": p["processes"]}
                                  for p in plan["blocked"]])

    if module.check_mode or not plan["changes"]:
        projected = {}
        gpus = []
        for gpu_plan in plan["gpus"]:
            wanted = gpu_plan["wanted"]
            after = dict(gpu_plan["before"])
            if gpu_plan["change"]:
                after = {"mode_current": wanted["mig_enabled"], "mode_pending": wanted["mig_enabled"],
                         "mig_devices": dict(wanted["mig_devices"]) if wanted["mig_enabled"] else {}}
            projected[gpu_plan["index"]] = after
            gpus.append(entry(gpu_plan, gpu_plan["before"], "would_change" if gpu_plan["change"] else "ok", []))
        result = {"changed": plan["changes"] > 0, "gpus": gpus, "reboot_required": False, "skipped": plan["skipped"]}
        if module._diff:
            result["diff"] = {"before": _diff_side(before), "after": _diff_side(projected)}
        return result

    def reset(indices):
        smi = module.get_bin_path(params["nvidia_smi"], opt_dirs=["/usr/bin", "/usr/sbin", "/usr/local/bin"])
        if smi is None:
            return 127, "%s not found" % params["nvidia_smi"]
        rc, out, err = module.run_command([smi, "-r", "-i", ",".join(str(i) for i in indices)], check_rc=False)
        return rc, (out + "\n" + err).strip()

    outcome = apply_mig_plan(nvml, plan, profiles, reset if params["allow_reset"] else None)
    if outcome["stopped"] == "NoPermission":
        index = [i for i, name in outcome["error_names"].items() if name == "NoPermission"][0]
        _fail_permission(module, "the MIG configuration of %s" % describe_gpu(by_index[index]),
                         errors=outcome["errors"])
    actions = outcome["actions"]
    errors = outcome["errors"]
    result = {"skipped": plan["skipped"]}
    if outcome["reset"] is not None:
        result["reset"] = outcome["reset"]
    final = dict((gpu["index"], gpu) for gpu in outcome["gpus"])
    if outcome["still_pending"] and outcome["reset"] is not None:
        drm, persistenced, holders = _reset_holders()
        result["diagnosis"] = diagnose_reset_failure(
            [final[index] for index in outcome["still_pending"]], classify_smi_output(outcome["reset"]["output"]),
            nvidia_drm_loaded=drm, persistenced_pids=persistenced, holders=holders)
        module.warn(result["diagnosis"]["message"])

    gpus = []
    after_states = {}
    reboot_required = False
    failures = []
    for gpu_plan in plan["gpus"]:
        index = gpu_plan["index"]
        after = _mig_state(final[index])
        after_states[index] = after
        wanted = gpu_plan["wanted"]
        if not gpu_plan["change"]:
            gpus.append(entry(gpu_plan, after, "ok", []))
            continue
        matches_now = (after["mode_current"] == wanted["mig_enabled"] and after["mode_pending"] == wanted["mig_enabled"]
                       and (not wanted["mig_enabled"] or after["mig_devices"] == wanted["mig_devices"]))
        if index in errors:
            status, message = "failed", errors[index]
            failures.append("%s: %s" % (describe_gpu(gpu_plan), message))
        elif matches_now:
            status, message = "applied", ""
        elif after["mode_pending"] == wanted["mig_enabled"] and after["mode_current"] != wanted["mig_enabled"]:
            status = "reboot_required"
            reboot_required = True
            message = ("MIG mode %s is pending until a GPU reset or reboot%s; the MIG devices are created after it"
                       % ("enabled" if wanted["mig_enabled"] else "disabled",
                          "" if params["allow_reset"] else " (allow_reset is false)"))
        else:
            status = "failed"
            message = "read back %s, wanted %s" % (after, wanted)
            failures.append("%s: %s" % (describe_gpu(gpu_plan), message))
        gpus.append(entry(gpu_plan, after, status, actions[index], message))
    changed = any(after_states[index] != before[index] for index in before)
    result.update({"changed": changed, "gpus": gpus, "reboot_required": reboot_required})
    if module._diff:
        result["diff"] = {"before": _diff_side(before), "after": _diff_side(after_states)}
    if failures:
        result["msg"] = "MIG layout not reached: %s" % "; ".join(failures)
        module.fail_json(**result)
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            config=dict(type="dict"),
            label=dict(type="str"),
            layout=dict(type="list", elements="dict"),
            mode=dict(type="str", choices=["apply", "assert"], default="apply"),
            force=dict(type="bool", default=False),
            allow_reset=dict(type="bool", default=True),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            strict=dict(type="bool", default=False),
        ),
        mutually_exclusive=[("config", "layout")],
        required_one_of=[("config", "layout")],
        required_by={"label": "config"},
        required_together=[("config", "label")],
        supports_check_mode=True,
    )
    module.exit_json(**run_with_nvml(module, load_pynvml(), run))


if __name__ == "__main__":
    main()
