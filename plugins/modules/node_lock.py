#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: node_lock
short_description: Read, take and release a node's rollout lock atomically
version_added: "0.2.0"
description:
  - Reads the node's rollout lock (and other rollout state files) without trusting their content, takes the lock
    by compare-and-swap, and releases it only when this run holds it.
  - O(state=read) returns the parsed file, or why it cannot be read (not JSON, not an object, a directory, a link,
    too large), and its identity for O(state=acquire).
  - O(state=acquire) writes O(lock) only when the file is still the one the caller read (O(expect)), under an
    exclusive C(flock) on the state directory, through a temporary file and C(rename). When another controller
    took the lock in between, RV(acquired) is V(false) and nothing is written.
  - O(state=release) removes the lock when it holds O(run_id) (or O(force)); another run's lock is left in place.
    With O(close) it first writes that state file (the snapshot that closes the node's transaction), and with
    O(remove) removes state files (the node's rollout flag, once its transaction succeeded), so that all are one
    module run.
  - O(state=write) writes O(content) as JSON to O(path) (a state file such as the snapshot), root-owned, mode
    0600, through a temporary file and C(rename), when it differs.
  - The decision whether a run may take a held lock (dead or stale holder, O(force)) is the controller's
    (the C(gpufleet.nvidia.rollout_lock) filter); this module makes the taking atomic.
options:
  path:
    description:
      - The lock file (or, with O(state=read), any rollout state file).
      - Required with O(state=acquire) and O(state=release); with O(state=read), O(path) or O(files).
    type: path
  files:
    description:
      - With O(state=read), several state files at once, by name (for example C(lock), C(flag), C(snapshot)),
        returned in RV(files) under the same names, with the node's RV(boot_id).
    type: dict
  state:
    description:
      - V(read), V(acquire), V(release) or V(write).
    type: str
    choices: [read, acquire, release, write]
    default: read
  content:
    description:
      - With O(state=write), the JSON object to write to O(path).
    type: dict
  close:
    description:
      - With O(state=release), a state file to write first, as O(state=write) writes it.
    type: dict
    suboptions:
      path:
        description: The state file.
        type: path
        required: true
      content:
        description:
          - The JSON object to write. With O(close.update), what is written when the file is missing or cannot be
            used (not a JSON object).
        type: dict
      update:
        description:
          - Keys to set in the JSON object the file holds. The file is read on the node, these keys set, and it is
            written back (the caller need not send the whole object it closes).
          - A file that is missing or cannot be used gets O(close.content) with these keys, or these keys alone.
        type: dict
  remove:
    description:
      - With O(state=release), state files to remove first (one that is absent is left so); RV(removed) lists
        those that were there.
    type: list
    elements: path
    default: []
  lock:
    description:
      - The lock to write with O(state=acquire) (C(rollout_id), C(run_id), C(controller), C(pid), C(acquired_at)).
    type: dict
  expect:
    description:
      - RV(identity) of the lock file when the decision to take it was made (O(state=read)); empty when it was absent.
    type: str
    default: ""
  run_id:
    description:
      - With O(state=release), the run whose lock is removed.
    type: str
  force:
    description:
      - With O(state=release), remove the lock whatever it holds.
    type: bool
    default: false
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: O(state=read) runs; O(state=acquire), O(state=release) and O(state=write) report what they would do and
      write nothing.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - This module supports check mode.
author:
  - gpufleet.nvidia maintainers (@gpufleet)
"""

EXAMPLES = r"""
- name: Read the node's rollout state files and its boot id in one task
  gpufleet.nvidia.node_lock:
    files:
      lock: /var/lib/gpufleet/rollout/lock.json
      snapshot: /var/lib/gpufleet/rollout/snapshot.json
      flag: /etc/ansible/facts.d/gpufleet_rollout.fact
  register: state_files

- name: Read the lock
  gpufleet.nvidia.node_lock:
    path: /var/lib/gpufleet/rollout/lock.json
  register: found

- name: Take it if nobody changed it meanwhile
  gpufleet.nvidia.node_lock:
    path: /var/lib/gpufleet/rollout/lock.json
    state: acquire
    lock: {rollout_id: driver-ltsb, run_id: "{{ run_id }}", controller: ctl1, pid: 4242, acquired_at: 1764547200}
    expect: "{{ found.identity | default('', true) }}"
  register: taken
"""

RETURN = r"""
exists:
  description: Whether the file exists (O(state=read)).
  type: bool
  returned: state is read
content:
  description: The parsed JSON object, or null when absent or unreadable.
  type: dict
  returned: state is read
unreadable:
  description: Why a file that exists cannot be used, or null.
  type: str
  returned: state is read
  sample: /var/lib/gpufleet/rollout/lock.json is not JSON (Expecting value, line 1 column 1 (char 0))
identity:
  description: What the file is, for O(expect) (C(sha256:<hex>) of its bytes), or null when absent.
  type: str
  returned: state is read
files:
  description:
    - With O(files), each file by its name, C({exists, content, unreadable, identity}) as for O(path). A file that
      cannot be opened (permission denied) is unreadable with the reason.
  type: dict
  returned: state is read and files is given
boot_id:
  description: The node's boot id (C(/proc/sys/kernel/random/boot_id)), read with O(files); null when unreadable.
  type: str
  returned: state is read and files is given
acquired:
  description: Whether the lock is now this run's.
  type: bool
  returned: state is acquire
released:
  description: Whether the lock is gone (or was never there).
  type: bool
  returned: state is release
found:
  description: The lock found (or written).
  type: dict
  returned: state is acquire or release
written:
  description: Whether the file of O(state=write), or O(close), was (in check mode, would be) written.
  type: bool
  returned: state is write, or release with close
removed:
  description: The files of O(remove) that were there and are gone.
  type: list
  elements: str
  returned: state is release, but in check mode
reason:
  description: Why the lock was not taken or not released, or null.
  type: str
  returned: state is acquire or release
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.nvidia.plugins.module_utils import node_lock, state_file


def write_state(module, path, content):
    """Write a state file (JSON, the form ``to_nice_json`` gives, mode 0600) when it differs; whether it did.

    Through ``state_file.write_atomic`` (a new temporary file, ``fsync``, ``rename``) in a directory
    ``state_file.private_dir`` allows (made 0700 when missing; one others can write is refused).

    :raises OSError: the directory is refused or cannot be written.
    """
    data = (json.dumps(content, indent=4, sort_keys=True) + "\n").encode("utf-8")
    try:
        found = state_file.read_file(path)
    except state_file.Unreadable:
        found = None
    if found is not None and found[0] == data and (found[1].st_mode & 0o7777) == 0o600:
        return False
    if module.check_mode:
        return True
    state_file.private_dir(os.path.dirname(path) or ".")
    state_file.write_atomic(path, data, 0o600)
    return True


def closed_content(close):
    """The JSON object O(close) writes: O(close.content), or the file's object with O(close.update)'s keys set.

    :param close: ``{"path": str, "content": dict | None, "update": dict | None}``.
    :returns: a dict. A file that is missing or unreadable (node_lock.read_state) counts as
        ``content`` (or an empty object).
    :raises OSError: the file exists and cannot be opened.
    """
    if close.get("update") is None:
        return close["content"]
    found = node_lock.read_state(close["path"])["content"]
    base = found if isinstance(found, dict) else (close.get("content") or {})
    return dict(base, **close["update"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path"),
            files=dict(type="dict"),
            state=dict(type="str", choices=["read", "acquire", "release", "write"], default="read"),
            content=dict(type="dict"),
            close=dict(type="dict", options=dict(path=dict(type="path", required=True), content=dict(type="dict"),
                                                 update=dict(type="dict")),
                       required_one_of=[("content", "update")]),
            remove=dict(type="list", elements="path", default=[]),
            lock=dict(type="dict"),
            expect=dict(type="str", default=""),
            run_id=dict(type="str"),
            force=dict(type="bool", default=False),
        ),
        required_if=[("state", "acquire", ["lock", "path"]), ("state", "release", ["run_id", "path"]),
                     ("state", "write", ["content", "path"])],
        required_one_of=[("path", "files")],
        mutually_exclusive=[("path", "files")],
        supports_check_mode=True,
    )
    path, state = module.params["path"], module.params["state"]
    try:
        if state == "read" and module.params["files"] is not None:
            files = dict((str(name), str(value)) for name, value in module.params["files"].items())
            module.exit_json(changed=False, files=node_lock.read_states(files), boot_id=node_lock.read_boot_id())
        if state == "read":
            module.exit_json(changed=False, **node_lock.read_state(path))
        if state == "write":
            written = write_state(module, path, module.params["content"])
            module.exit_json(changed=written, written=written)
        close = module.params["close"]
        if module.check_mode:
            module.exit_json(changed=False, acquired=state == "acquire", released=state == "release", found=None,
                             reason="check mode: nothing written")
        written = None
        removed = []
        if state == "release" and close:
            try:
                written = write_state(module, close["path"], closed_content(close))
            except OSError as exc:
                module.fail_json(msg="%s: %s (the lock is still held)" % (close["path"], exc))
        for gone in module.params["remove"] if state == "release" else []:
            try:
                os.unlink(gone)
                removed.append(gone)
            except FileNotFoundError:
                continue
            except OSError as exc:
                module.fail_json(msg="%s: %s (the lock is still held)" % (gone, exc))
        if state == "acquire":
            result = node_lock.acquire(path, module.params["lock"], module.params["expect"] or None)
        else:
            result = node_lock.release(path, module.params["run_id"], module.params["force"])
    except OSError as exc:
        module.fail_json(msg="%s: %s" % (path, exc))
    if written is not None:
        result = dict(result, written=written, changed=bool(result.get("changed") or written))
    if state == "release":
        result = dict(result, removed=removed, changed=bool(result.get("changed") or removed))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
