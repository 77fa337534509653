#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: driver_transaction
short_description: Install one exact NVIDIA driver version and pin its whole package set, in one transaction
version_added: "0.2.0"
description:
  - Resolves the request to one exact driver version for this node and plans the package transaction,
    exactly as M(gpufleet.nvidia.driver_resolve) does (same options), then applies it and reads the
    node back.
  - "The transaction (apt): release the holds of the driver packages, write the origin pin and the pin
    file, C(apt-get install) the whole set at the target version (with the removals and, for a
    downgrade, C(--allow-downgrades)), hold the set again. dnf: release the version locks, reset and
    enable the C(nvidia-driver) module stream, swap the kernel module flavour, install or downgrade,
    lock the set."
  - When a step fails, the pin file that was there before is written back and the packages that were
    held before are held again; the module then fails with what was wanted, what was found and what
    to do, from the apt and dnf failure classifiers.
  - C(changed) comes from reading the node back (packages, holds, pin files; dnf version locks and
    stream), never from the steps run.
  - In check mode nothing is changed; the result holds the exact transaction (C(plan.steps)) and, with
    C(--diff), the packages, holds and pin file before and as they would be after.
options:
  local_facts:
    description:
      - Record the driver in the node's local facts file after the transaction (the driver role's
        C(/etc/ansible/facts.d/gpufleet_driver.fact)) - current version, previous, last known-good
        and history - as C(driver_local_facts.next_local_facts) decides; written only when it
        changes, mode 0644, its directory made (0755) when missing. The file is read before anything
        is changed; one that is not a JSON object fails the module then, naming it.
    type: dict
    suboptions:
      path:
        description: The local facts file.
        type: path
        required: true
      loaded_version:
        description: The driver version loaded at the start of the run (M(gpufleet.nvidia.gpu_facts)).
        type: str
      driver_state:
        description: The driver state at the start of the run (M(gpufleet.nvidia.gpu_facts), V(ok) when healthy).
        type: str
      mark_known_good:
        description: Record the loaded version as last known-good when it was loaded, healthy and the recorded one.
        type: bool
        default: false
      history_limit:
        description: History entries kept.
        type: int
        default: 50
  enable_services:
    description:
      - After the transaction, enable C(nvidia-persistenced) and, when Fabric Manager is part of the set,
        C(nvidia-fabricmanager) to start at boot (C(systemctl enable)), each where its unit file is
        installed (C(/usr/lib/systemd/system)).
    type: bool
    default: false
  verify_module_build:
    description:
      - After a transaction that installs, upgrades, downgrades or changes the branch, compare the
        module on disk for the running kernel (C(modinfo -F version nvidia)) with the version installed,
        before any reboot, and fail when they differ or no module was built for the running kernel.
    type: bool
    default: true
notes:
  - Fails, before anything is changed, on every refusal of M(gpufleet.nvidia.driver_resolve).
  - The repository must already be configured on the node (the driver role does it), or given with
    O(repository.preview) in check mode.
seealso:
  - module: gpufleet.nvidia.driver_resolve
  - name: NVIDIA Driver Installation Guide
    description: Package names, module streams and version locking per distribution.
    link: https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/
author:
  - gpufleet.nvidia maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.nvidia.driver_plan
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
  platform:
    platforms: debian, rhel
"""

EXAMPLES = r"""
- name: Install the LTSB driver for the node's GPUs, pinned and held
  gpufleet.nvidia.driver_transaction:
    branch: ltsb
    gpus: "{{ ansible_facts['nvidia']['gpus'] | default([]) }}"
    gpu_architectures: [Hopper]
    distribution: debian12
  register: driver_transaction

- name: Show what was done
  ansible.builtin.debug:
    msg: "{{ driver_transaction.plan.steps | selectattr('argv', 'defined') | map(attribute='argv') | list }}"
"""

RETURN = r"""
resolved:
  description: The exact driver for this node (see M(gpufleet.nvidia.driver_resolve)).
  returned: success
  type: dict
plan:
  description:
    - The package transaction (C(package_transaction.plan_transaction)); C(steps) is what was run (or,
      in check mode, what would be run), in order.
  returned: success
  type: dict
installed:
  description: NVIDIA driver packages installed before the transaction (C(name), C(version), C(held), C(status)).
  returned: success
  type: list
  elements: dict
installed_after:
  description: NVIDIA driver packages read back after the transaction; in check mode the same as RV(installed).
  returned: success
  type: list
  elements: dict
available_versions:
  description: Driver versions the repository offers (upstream versions), or null when unknown.
  returned: success
  type: list
  elements: str
fabric_manager:
  description: Whether Fabric Manager is part of the set.
  returned: success
  type: bool
nvswitch_count:
  description: NVSwitch PCI devices found.
  returned: success
  type: int
repository_source:
  description: V(system), V(preview) or V(none) (see M(gpufleet.nvidia.driver_resolve)).
  returned: success
  type: str
failed_step:
  description: The step that failed (C(name), C(argv)).
  returned: failure of a step
  type: dict
classified:
  description: What the apt or dnf failure classifier made of the failed step's output.
  returned: failure of a step
  type: dict
action:
  description: What the transaction does - V(downgrade), V(branch_change), V(upgrade), V(install), V(repin) or V(none).
  returned: success
  type: str
local_facts:
  description: The local facts after the transaction (with O(local_facts)); in check mode, what would be written.
  returned: with O(local_facts)
  type: dict
local_facts_previous:
  description: The local facts read before the transaction (V({}) when there were none).
  returned: with O(local_facts)
  type: dict
services:
  description: Per service unit, V(enabled), V(enabled_now) (in check mode V(would_enable)) or V(absent) (no unit file).
  returned: with O(enable_services)
  type: dict
module_build:
  description: The module build check (C(verdict), C(expected), C(found), C(running_kernel), C(message)).
  returned: failure of the module build check
  type: dict
"""

import json
import os
from datetime import datetime, timezone

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils import apt_plan
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_local_facts
from ansible_collections.gpufleet.nvidia.plugins.module_utils.node_files import read_json_object, read_text, write_file
from ansible_collections.gpufleet.nvidia.plugins.module_utils import package_failures
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import upstream_version
from ansible_collections.gpufleet.nvidia.plugins.module_utils.node_packages import (
    ENV,
    PLAN_ARGUMENT_SPEC,
    count_nvswitches,
    gather_apt,
    gather_dnf,
    resolve_and_plan,
)

# What to do about each kind of apt failure (package_failures.classify_apt_failure).
APT_REMEDY = {
    "dependency_conflict": "make the repository offer the whole set at this version, or choose a version it offers whole",
    "lock": "run again when the other package manager is done",
    "dpkg_interrupted": "run 'dpkg --configure -a' on the node, then run again",
    "not_found": "refresh the package lists or choose a version the repository offers",
    "withdrawn": "choose a version the repository still offers",
    "network": "check that the node reaches the repository, then run again",
    "module_build_failed": "read the DKMS make.log the reason names; install the running kernel's headers, or boot a "
                           "kernel the driver supports",
    "other": "read the output below",
}


def installed_versions(records):
    """``{name: version}`` of the records that are installed (``dpkg`` config-files records left out)."""
    return dict((p["name"], p["version"]) for p in records if p.get("installed", True))


def node_state(module, manager, planned=None):
    """What the transaction may change, read from the node: ``{"installed": [records], "packages": {name: version},
    "holds": [names], "files": {path: content|None}}`` (apt: holds from ``apt-mark showhold``, the pin and origin
    pin files), or for dnf ``holds`` the version locks and ``stream`` the enabled module stream.

    :param planned: the result of ``resolve_and_plan``, which already read the packages (no second read).
    """
    if manager == "apt":
        if planned:
            installed, held, preferences = planned["installed"], planned["held"], planned["preferences"]
        else:
            installed, held, preferences = gather_apt(module)
        files = {apt_plan.PREFERENCES_PATH: preferences,
                 apt_plan.ORIGIN_PREFERENCES_PATH: read_text(apt_plan.ORIGIN_PREFERENCES_PATH)}
        return {"installed": installed, "packages": installed_versions(installed), "holds": sorted(held),
                "files": files}
    if planned:
        installed, stream, locks = planned["installed"], planned["stream"], planned["locks"]
    else:
        installed, stream, locks = gather_dnf(module)
    return {"installed": installed, "packages": installed_versions(installed), "holds": sorted(locks), "files": {},
            "stream": stream}


def predicted_state(before, plan):
    """The node as the plan would leave it (check mode), in the shape of :func:`node_state`."""
    if plan["noop"] and not plan["steps"]:
        return before
    packages = dict((n, v) for n, v in before["packages"].items() if n not in plan["remove"])
    for package in plan["packages"]:
        packages[package["name"]] = package["version"] or "%s-*" % plan["version"]
    after = {"installed": before["installed"], "packages": packages, "files": dict(before["files"])}
    if plan["package_manager"] == "apt":
        after["holds"] = sorted(set(before["holds"]) - set(plan["unhold"]) | set(plan["hold"]))
        for step in plan["steps"]:
            if "content" in step:
                after["files"][step["path"]] = step["content"]
    else:
        after["holds"] = sorted(plan["versionlock"])
        after["stream"] = plan["module"]["stream"]
    return after


def diff_text(state):
    """The lines ``--diff`` compares: one per package, the holds (or version locks), each pin file."""
    lines = ["package %s %s" % (name, state["packages"][name]) for name in sorted(state["packages"])]
    lines += ["hold %s" % name for name in state["holds"]]
    if state.get("stream"):
        lines.append("module stream nvidia-driver:%s" % state["stream"])
    for path in sorted(state["files"]):
        content = state["files"][path]
        if content is None:
            lines.append("file %s: absent" % path)
        else:
            lines.append("file %s:" % path)
            lines += ["  " + line for line in content.splitlines()]
    return "\n".join(lines) + "\n"


def comparable(state):
    """The part of a node state that decides ``changed``."""
    return (state["packages"], state["holds"], state["files"], state.get("stream"))


def restore(module, plan, before):
    """Put back the pin file and the holds from before a failed apt transaction; best effort."""
    if plan["package_manager"] != "apt":
        return
    previous = before["files"].get(apt_plan.PREFERENCES_PATH)
    if previous is not None:
        write_file(module, apt_plan.PREFERENCES_PATH, previous)
    held = [name for name in before["holds"] if name in before["packages"]]
    if held:
        module.run_command(["apt-mark", "hold"] + held, environ_update=ENV)


def fail_step(module, planned, step, rc, out, err):
    """Fail with the step, what was wanted and found, and what to do (the failure classifiers)."""
    plan = planned["plan"]
    wanted = "R%s %s (%s kernel modules)" % (plan["branch"], plan["version"], plan["kernel_module_type"])
    found = plan["current_version"] or "no driver"
    if plan["package_manager"] == "apt":
        verdict = package_failures.classify_apt_failure(rc, out, err)
        reason = verdict["message"]
        if verdict["unmet"]:
            reason += " (%s)" % "; ".join(verdict["unmet"])
        remedy = APT_REMEDY.get(verdict["kind"], APT_REMEDY["other"])
    else:
        verdict = package_failures.classify_dnf_failure((out or "") + "\n" + (err or ""))
        reason = "dnf failed (rc %s): %s" % (rc, verdict["kind"])
        remedy = verdict["remedy"] or APT_REMEDY["other"]
    module.fail_json(
        msg="The driver transaction to %s failed at '%s': %s. Wanted %s; found %s installed; the pin file and "
            "holds from before are restored. To do: %s. stderr: %s"
            % (plan["version"], step["name"], reason, wanted, found, remedy, (err or "").strip()),
        rc=rc, stdout=out, stderr=err, failed_step=step, classified=verdict, resolved=planned["resolved"],
        plan=plan)


def apply(module, planned, before):
    """Run the plan's steps in order: commands, file writes, file removals."""
    for step in planned["plan"]["steps"]:
        if "argv" in step:
            rc, out, err = module.run_command(step["argv"], environ_update=ENV)
            if rc != 0:
                restore(module, planned["plan"], before)
                fail_step(module, planned, step, rc, out, err)
        elif "content" in step:
            write_file(module, step["path"], step["content"])
        elif step.get("state") == "absent" and os.path.exists(step["path"]):
            os.remove(step["path"])


def check_read_back(module, planned, after):
    """Fail when the node read back does not carry the planned set at the target version."""
    plan = planned["plan"]
    wrong = []
    for package in plan["packages"]:
        if package["role"] == "pin":
            continue
        have = after["packages"].get(package["name"])
        if upstream_version(have) != plan["version"]:
            wrong.append("%s=%s" % (package["name"], have or "absent"))
    wrong += ["%s still installed" % name for name in plan["remove"] if name in after["packages"]]
    if wrong:
        module.fail_json(msg="The driver transaction to %s ran, but the node read back does not carry the set: %s. "
                             "To do: read the package manager's log on the node and run again."
                             % (plan["version"], ", ".join(wrong)),
                         resolved=planned["resolved"], plan=plan, installed_after=after["installed"])


def check_module_build(module, planned):
    """Fail when the module on disk for the running kernel is not the version installed (field cases 23, 24)."""
    plan = planned["plan"]
    rc, out, err = module.run_command(["modinfo", "-F", "version", "nvidia"], environ_update=ENV)
    first = (out or "").strip().splitlines()[0].strip() if rc == 0 and (out or "").strip() else None
    verdict = package_failures.verify_module_build(plan["version"], first, os.uname()[2])
    if verdict["verdict"] != "ok":
        module.fail_json(msg="The driver %s is installed, but %s." % (plan["version"], verdict["message"]),
                         module_build=verdict, resolved=planned["resolved"], plan=plan, stderr=err)
    return verdict


#: Where the driver packages install their systemd units.
UNIT_DIR = "/usr/lib/systemd/system"


def read_local_facts(module, path):
    """The local facts file as a dict (``{}`` when absent); fails the module, naming it, when it is not a JSON object."""
    content, why = read_json_object(path)
    if content is None:
        module.fail_json(msg="the driver's local facts %s are %s: move the file away and run again; nothing was "
                             "changed" % (path, why))
    return content


def record_local_facts(module, options, previous, planned, action):
    """Write the next local facts (``driver_local_facts.next_local_facts``) when they change; return them."""
    resolved = planned["resolved"]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    following = driver_local_facts.next_local_facts(
        previous, resolved["version"], str(resolved["branch"]), resolved.get("kernel_module_type"), action,
        options.get("loaded_version") or None, options.get("driver_state") or None,
        bool(options.get("mark_known_good")), when, int(options.get("history_limit") or 50))
    if following != previous and not module.check_mode:
        write_file(module, options["path"], json.dumps(following, indent=4, sort_keys=True) + "\n")
    return following


def enable_services(module, fabric_manager):
    """Enable the driver's services at boot where their units are installed: ``{unit: state}`` (RV(services))."""
    units = ["nvidia-persistenced"] + (["nvidia-fabricmanager"] if fabric_manager else [])
    states = {}
    for unit in units:
        if not os.path.exists(os.path.join(UNIT_DIR, unit + ".service")):
            states[unit] = "absent"
            continue
        rc, _out, _err = module.run_command(["systemctl", "is-enabled", unit])
        if rc == 0:
            states[unit] = "enabled"
        elif module.check_mode:
            states[unit] = "would_enable"
        else:
            rc, out, err = module.run_command(["systemctl", "enable", unit])
            if rc != 0:
                module.fail_json(msg="systemctl enable %s failed (rc %s): %s" % (unit, rc, (err or out).strip()),
                                 services=states)
            states[unit] = "enabled_now"
    return states


def main():
    spec = dict(PLAN_ARGUMENT_SPEC, verify_module_build=dict(type="bool", default=True),
                enable_services=dict(type="bool", default=False),
                local_facts=dict(type="dict", options=dict(
                    path=dict(type="path", required=True),
                    loaded_version=dict(type="str"),
                    driver_state=dict(type="str"),
                    mark_known_good=dict(type="bool", default=False),
                    history_limit=dict(type="int", default=50))))
    module = AnsibleModule(argument_spec=spec, supports_check_mode=True)
    facts_options = module.params["local_facts"]
    previous_facts = read_local_facts(module, facts_options["path"]) if facts_options else None
    planned = resolve_and_plan(module, count_nvswitches())
    plan = planned["plan"]
    manager = plan["package_manager"]
    before = node_state(module, manager, planned)
    if module.check_mode:
        after = predicted_state(before, plan)
    elif plan["steps"]:
        apply(module, planned, before)
        after = node_state(module, manager)
        check_read_back(module, planned, after)
        changes = plan["changes"]
        if module.params["verify_module_build"] and (changes["install"] or changes["upgrade"] or changes["downgrade"]
                                                     or changes["branch_change"]):
            check_module_build(module, planned)
    else:
        after = before
    for text in planned["warnings"]:
        module.warn(text)
    action = driver_local_facts.transaction_action(plan["changes"])
    result = dict(changed=comparable(before) != comparable(after), resolved=planned["resolved"], plan=plan,
                  installed=before["installed"], installed_after=after["installed"],
                  available_versions=planned["available_versions"], fabric_manager=planned["fabric_manager"],
                  nvswitch_count=planned["nvswitch_count"], repository_source=planned["repository_source"],
                  action=action)
    if facts_options:
        result["local_facts_previous"] = previous_facts
        result["local_facts"] = record_local_facts(module, facts_options, previous_facts, planned, action)
        # The file is one of what --diff compares.
        path = facts_options["path"]
        before["files"][path] = json.dumps(previous_facts, indent=4, sort_keys=True) + "\n" if previous_facts else None
        after = dict(after, files=dict(after["files"]))
        after["files"][path] = json.dumps(result["local_facts"], indent=4, sort_keys=True) + "\n" \
            if result["local_facts"] else None
        result["changed"] = result["changed"] or result["local_facts"] != previous_facts
    if module.params["enable_services"]:
        result["services"] = enable_services(module, planned["fabric_manager"])
        result["changed"] = result["changed"] or any(state in ("enabled_now", "would_enable")
                                                     for state in result["services"].values())
    if module._diff:
        result["diff"] = {"before": diff_text(before), "after": diff_text(after),
                          "before_header": "driver packages before", "after_header": "driver packages after"}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
