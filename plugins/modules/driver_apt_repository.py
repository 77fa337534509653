#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: driver_apt_repository
short_description: Configure NVIDIA's apt repository on a node in one run - signing key, sources entry, package lists
version_added: "0.3.0"
description:
  - The apt side of the C(gpufleet.nvidia.driver) role's repository in one module run. It writes the signing key
    to O(keyring_path) (its directory made, mode 0755, when missing) and the sources entry to O(sources_path),
    each root-owned, mode 0644, and only when it differs; then runs C(apt-get update) when either changed or the
    package lists are older than O(cache_valid_time) seconds (the mtime of
    C(/var/lib/apt/periodic/update-success-stamp), else of C(/var/lib/apt/lists)).
  - The key is checked against its pinned fingerprint by the role before this module runs
    (C(gpufleet.nvidia.driver_signing_key)); the entry names the keyring (C(signed-by)), so the key signs only
    this repository.
options:
  keyring_path:
    description: Where the signing key goes (C(/etc/apt/keyrings/...)).
    type: path
    required: true
  key:
    description: The signing key (ASCII-armored, as the repository publishes it).
    type: str
    required: true
  sources_path:
    description: The sources entry's file (C(/etc/apt/sources.list.d/...)).
    type: path
    required: true
  sources_content:
    description: The sources entry's content; its URL may hold credentials, so it is never logged.
    type: str
    required: true
  update_cache:
    description: Refresh the package lists when the files changed or the lists are older than O(cache_valid_time).
    type: bool
    default: true
  cache_valid_time:
    description: Seconds for which package lists count as fresh.
    type: int
    default: 3600
notes:
  - dnf nodes take the role's dnf tasks, not this module.
author:
  - gpufleet.nvidia maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports what it would write, and neither writes nor refreshes the package lists.
  diff_mode:
    support: full
  platform:
    platforms: debian
"""

EXAMPLES = r"""
- name: Configure the repository
  gpufleet.nvidia.driver_apt_repository:
    keyring_path: /etc/apt/keyrings/gpufleet-nvidia.asc
    key: "{{ lookup('ansible.builtin.file', 'cuda-archive-keyring.asc') }}"
    sources_path: /etc/apt/sources.list.d/gpufleet-nvidia.list
    sources_content: "deb [signed-by=/etc/apt/keyrings/gpufleet-nvidia.asc] https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /\n"
"""

RETURN = r"""
key_changed:
  description: Whether the key file was (in check mode, would be) written.
  returned: success
  type: bool
sources_changed:
  description: Whether the sources entry was (in check mode, would be) written.
  returned: success
  type: bool
cache_updated:
  description: Whether C(apt-get update) ran (never in check mode). A refresh alone is not a change.
  returned: success
  type: bool
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils.node_files import read_text, write_file
from ansible_collections.gpufleet.nvidia.plugins.module_utils.node_packages import ENV

#: What tells when the package lists were last refreshed, first found first (as ansible.builtin.apt reads it).
UPDATE_STAMPS = ("/var/lib/apt/periodic/update-success-stamp", "/var/lib/apt/lists")


def lists_age_s(now=None):
    """Seconds since the package lists were refreshed, or ``None`` when nothing tells."""
    for path in UPDATE_STAMPS:
        try:
            return (time.time() if now is None else now) - os.stat(path).st_mtime
        except OSError:
            continue
    return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            keyring_path=dict(type="path", required=True),
            key=dict(type="str", required=True, no_log=False),
            sources_path=dict(type="path", required=True),
            sources_content=dict(type="str", required=True, no_log=True),
            update_cache=dict(type="bool", default=True),
            cache_valid_time=dict(type="int", default=3600),
        ),
        supports_check_mode=True,
    )
    params = module.params
    key_before = read_text(params["keyring_path"])
    key_changed = write_file(module, params["keyring_path"], params["key"], 0o644)
    sources_changed = write_file(module, params["sources_path"], params["sources_content"], 0o644)
    age = lists_age_s()
    stale = age is None or age > params["cache_valid_time"]
    # Not in check mode; a refresh alone is no change (as ansible.builtin.apt reports it).
    update = params["update_cache"] and (key_changed or sources_changed or stale) and not module.check_mode
    if update:
        rc, out, err = module.run_command(["apt-get", "update"], environ_update=ENV)
        if rc != 0:
            module.fail_json(msg="apt-get update failed (rc %s) after the NVIDIA repository was configured: %s"
                                 % (rc, (err or out).strip()), rc=rc, stdout=out, stderr=err)
    result = dict(changed=bool(key_changed or sources_changed), key_changed=key_changed,
                  sources_changed=sources_changed, cache_updated=bool(update))
    if module._diff:
        result["diff"] = [{"before_header": params["keyring_path"], "after_header": params["keyring_path"],
                           "before": key_before or "", "after": params["key"]}]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
