#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: driver_known_good
short_description: Record the driver a node runs healthy as its last known-good version
version_added: "0.3.0"
description:
  - The C(gpufleet.nvidia.driver) role's C(mark_known_good) entry point in one module run, for callers that
    verified the node after its reboot (the node upgrade transaction).
  - Fails, changing nothing, unless the driver state is V(ok) and the loaded version is the version the local
    facts record as installed (C(current)).
  - Then records that version as C(last_known_good) in the local facts file, with a C(known_good) history entry,
    as C(driver_local_facts.update_local_facts) writes it; a version already recorded is left as it is.
options:
  path:
    description: The driver's local facts file.
    type: path
    default: /etc/ansible/facts.d/gpufleet_driver.fact
  loaded_version:
    description: The loaded driver version, read just before (M(gpufleet.nvidia.gpu_facts)).
    type: str
    required: true
  driver_state:
    description: The driver state read just before (M(gpufleet.nvidia.gpu_facts)).
    type: str
    required: true
  history_limit:
    description: History entries kept.
    type: int
    default: 50
author:
  - gpufleet.nvidia maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Checks and reports what it would record, and writes nothing.
  diff_mode:
    support: none
  platform:
    platforms: debian, rhel
"""

EXAMPLES = r"""
- name: Read the driver state
  gpufleet.nvidia.gpu_facts:
    kernel_log: false

- name: Record the driver as last known-good
  gpufleet.nvidia.driver_known_good:
    loaded_version: "{{ ansible_facts['nvidia']['driver']['loaded_version'] }}"
    driver_state: "{{ ansible_facts['nvidia']['driver']['state'] }}"
"""

RETURN = r"""
local_facts:
  description: The local facts after the run (in check mode, as they would be).
  returned: success
  type: dict
"""

import json
from datetime import datetime, timezone

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_local_facts
from ansible_collections.gpufleet.nvidia.plugins.module_utils.node_files import read_json_object, write_file


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/ansible/facts.d/gpufleet_driver.fact"),
            loaded_version=dict(type="str", required=True),
            driver_state=dict(type="str", required=True),
            history_limit=dict(type="int", default=50),
        ),
        supports_check_mode=True,
    )
    params = module.params
    facts, why = read_json_object(params["path"])
    if facts is None:
        module.fail_json(msg="not marked known-good: the driver's local facts %s are %s" % (params["path"], why))
    current = facts.get("current") if isinstance(facts.get("current"), dict) else {}
    installed = current.get("version")
    loaded = params["loaded_version"]
    if params["driver_state"] != "ok" or not loaded or loaded != installed:
        module.fail_json(msg="not marked known-good: state %s, loaded %s, installed %s"
                             % (params["driver_state"], loaded or "none", installed or "none"))
    if (facts.get("last_known_good") or {}).get("version") == loaded:
        module.exit_json(changed=False, local_facts=facts)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    following = driver_local_facts.update_local_facts(
        facts, installed, str(current.get("branch") or installed.split(".")[0]), when, "known_good",
        verified_good=loaded, history_limit=params["history_limit"],
        kernel_module_type=current.get("kernel_module_type"))
    changed = write_file(module, params["path"], json.dumps(following, indent=4, sort_keys=True) + "\n", 0o644)
    module.exit_json(changed=changed, local_facts=following)


if __name__ == "__main__":
    main()
