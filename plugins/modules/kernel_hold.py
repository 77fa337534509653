#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: kernel_hold
short_description: Hold the running kernel on an apt node, or release what was held, in one task
version_added: "0.3.0"
description:
  - The apt side of the C(gpufleet.nvidia.kernel_hold) role in one module run, so that a node's upgrade
    transaction holds its kernel in one task instead of a dozen.
  - O(state=present) lists the installed packages (C(dpkg-query)) and the holds (C(apt-mark showhold)), puts the
    running kernel's packages, the kernel meta packages and O(packages_extra) on hold (C(dpkg --set-selections)),
    writes the unattended-upgrades exclusions to O(apt_conf) and records what it held in O(record), so that
    O(state=absent) releases exactly that and nothing an administrator held.
  - O(state=absent) sets the packages the record names back to C(install), removes the files the record names
    and the record.
  - Which packages are held is decided by C(kernel_hold_packages) in the collection's module_utils, the
    same function as the C(gpufleet.nvidia.driver_kernel_hold) filter.
options:
  state:
    description: V(present) holds, V(absent) releases.
    type: str
    choices: [present, absent]
    default: present
  packages_extra:
    description: More packages to hold when installed.
    type: list
    elements: str
    default: []
  unattended_upgrades:
    description: Write O(apt_conf), which keeps unattended-upgrades off the kernel and the NVIDIA driver.
    type: bool
    default: true
  blacklist_extra:
    description: More package name patterns for unattended-upgrades' C(Package-Blacklist).
    type: list
    elements: str
    default: []
  record:
    description: The record of what this module held (a local fact file, JSON).
    type: path
    default: /etc/ansible/facts.d/gpufleet_kernel_hold.fact
  apt_conf:
    description: The apt configuration file with the unattended-upgrades exclusions.
    type: path
    default: /etc/apt/apt.conf.d/51gpufleet-kernel-hold
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports what it would hold or release and writes nothing.
  diff_mode:
    support: partial
    details: Shows the change to O(apt_conf).
  platform:
    platforms: debian
notes:
  - This module supports check mode.
  - Nodes with dnf take the role's dnf tasks (the versionlock plugin), not this module.
author:
  - gpufleet.nvidia maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Hold the running kernel
  gpufleet.nvidia.kernel_hold:
  register: held

- name: Release what was held
  gpufleet.nvidia.kernel_hold:
    state: absent
"""

RETURN = r"""
running_kernel:
  description: The running kernel (C(uname -r)).
  type: str
  returned: always
running_kernel_package:
  description: The running kernel's image package, when installed.
  type: str
  returned: O(state=present)
held:
  description: The packages on hold for the kernel now (sorted).
  type: list
  elements: str
  returned: always
held_by_role:
  description: The packages this module (or the role) put on hold and will release (sorted).
  type: list
  elements: str
  returned: O(state=present)
held_before_by_others:
  description: Packages of the kernel that were already on hold by someone else, left to them.
  type: list
  elements: str
  returned: O(state=present)
released:
  description: With O(state=absent), the packages the record named.
  type: list
  elements: str
  returned: O(state=absent)
unattended_upgrades_blacklist:
  description: Whether O(apt_conf) is written.
  type: bool
  returned: O(state=present)
"""

import json
import os
import platform
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils.kernel_hold import (
    kernel_hold_packages,
    unattended_upgrades_config,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.node_files import read_text, write_file
from ansible_collections.gpufleet.nvidia.plugins.module_utils.node_packages import ENV, apt_holds, dpkg_packages


def installed_names(module):
    """Names of the installed packages (dpkg state not ``n``/``c``)."""
    return set(p["name"] for p in dpkg_packages(module, driver_only=False) if p["installed"])


def read_record(module, path):
    """The record of an earlier run: a dict, or ``{}`` when there is none.

    A record that exists but is not a JSON object fails the module, naming the file: what it
    held cannot be told, and releasing or overwriting it would lose an earlier hold.
    """
    if not os.path.lexists(path):
        return {}
    try:
        with open(path, "r", encoding="utf-8") as handle:
            content = json.load(handle)
    except (IOError, OSError, ValueError, UnicodeDecodeError) as err:
        module.fail_json(msg="%s cannot be read as this role's record (%s): inspect it, release its packages with "
                             "apt-mark unhold if they were held here, and remove it" % (path, err))
    if not isinstance(content, dict):
        module.fail_json(msg="%s is not this role's record (a JSON object): inspect it and remove it" % path)
    return content


def set_selections(module, names, selection):
    """``dpkg --set-selections`` for ``names`` (``hold`` or ``install``); nothing in check mode."""
    if not names or module.check_mode:
        return
    data = "".join("%s %s\n" % (name, selection) for name in names)
    rc, _out, err = module.run_command(["dpkg", "--set-selections"], data=data, environ_update=ENV)
    if rc != 0:
        module.fail_json(msg="dpkg --set-selections failed: %s" % err.strip(), rc=rc)


def hold(module):
    params = module.params
    kernel = platform.release()
    installed = installed_names(module)
    held_now = apt_holds(module, required=True)
    previous = read_record(module, params["record"])
    plan = kernel_hold_packages(kernel, sorted(installed), "apt")
    targets = sorted(set(plan["hold"] + [n for n in params["packages_extra"] if n in installed]))
    by_role = sorted(set([n for n in previous.get("held_by_role") or [] if isinstance(n, str)]
                         + [n for n in targets if n not in held_now]))
    already = [n for n in targets if n in held_now and n not in (previous.get("held_by_role") or [])]
    to_hold = [n for n in targets if n not in held_now]
    changed = bool(to_hold)
    set_selections(module, to_hold, "hold")
    diff = None
    if params["unattended_upgrades"]:
        content = unattended_upgrades_config(params["blacklist_extra"])
        before = read_text(params["apt_conf"])
        if write_file(module, params["apt_conf"], content, 0o644):
            changed = True
            diff = {"before_header": params["apt_conf"], "after_header": params["apt_conf"],
                    "before": before or "", "after": content}
    record = {"schema_version": 1, "package_manager": "apt", "running_kernel": kernel, "held_by_role": by_role,
              "config_files": [params["apt_conf"]] if params["unattended_upgrades"] else []}
    changed = write_file(module, params["record"], json.dumps(record, indent=4, sort_keys=True) + "\n", 0o644,
                         directory_mode=0o755) or changed
    extra = {"diff": diff} if diff and module._diff else {}
    module.exit_json(changed=changed, running_kernel=kernel, running_kernel_package=plan["running_kernel_package"],
                     held=targets, held_by_role=by_role, held_before_by_others=already,
                     unattended_upgrades_blacklist=params["unattended_upgrades"], **extra)


def release(module):
    params = module.params
    previous = read_record(module, params["record"])
    installed = installed_names(module)
    released = [n for n in previous.get("held_by_role") or [] if isinstance(n, str)]
    changed = False
    to_release = [n for n in released if n in installed]
    if to_release:
        held_now = set(apt_holds(module, required=True))
        changed = any(n in held_now for n in to_release)
        set_selections(module, to_release, "install")
    for path in [p for p in previous.get("config_files") or [] if isinstance(p, str)] + [params["record"]]:
        if os.path.lexists(path):
            changed = True
            if not module.check_mode:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
    module.exit_json(changed=changed, running_kernel=platform.release(), released=released, held=[])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent"], default="present"),
            packages_extra=dict(type="list", elements="str", default=[]),
            unattended_upgrades=dict(type="bool", default=True),
            blacklist_extra=dict(type="list", elements="str", default=[]),
            record=dict(type="path", default="/etc/ansible/facts.d/gpufleet_kernel_hold.fact"),
            apt_conf=dict(type="path", default="/etc/apt/apt.conf.d/51gpufleet-kernel-hold"),
        ),
        supports_check_mode=True,
    )
    if module.params["state"] == "present":
        hold(module)
    else:
        release(module)


if __name__ == "__main__":
    main()
