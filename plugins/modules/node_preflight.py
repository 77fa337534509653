#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: node_preflight
short_description: Read a node and decide whether its driver upgrade may start
version_added: "0.3.0"
description:
  - An action plugin, the node_upgrade role's preflight in one task. It runs on the node, in this order,
    C(ansible.builtin.setup) (C(min), only when the distribution or kernel facts are missing),
    M(gpufleet.nvidia.gpu_facts), M(gpufleet.nvidia.node_lock) (reading O(files)) and, with O(resolve),
    M(gpufleet.nvidia.driver_resolve); on the controller it asks whether the run that holds the node's lock
    still runs (its process, or its lease).
  - Then decides, with the rules of C(plugin_utils.rollout_verdict) and C(plugin_utils.node_preflight), the
    lock (take, take over, or refuse naming its holder) and, with O(resolve), whether the node is upgraded,
    skipped (already on target) or refused, and what a run that is gone left on it.
  - A state file that cannot be parsed is never trusted; a flag or lock file that cannot be read refuses the
    node naming it (unless O(lock_break)), a snapshot, driver facts or drain record that cannot be read is
    ignored with a warning.
  - Reads only; writes nothing on the node or the controller.
options:
  files:
    description: The node's state files, as M(gpufleet.nvidia.node_lock) reads them
      (C(flag), C(lock), C(snapshot), C(driver), C(drain), C(os_reboot)).
    type: dict
    required: true
  owner:
    description: This run (C(rollout_id), C(run_id), C(controller), C(pid), C(lease), C(awx_job_id)).
    type: dict
    required: true
  rollout_id:
    description: The rollout's id.
    type: str
    required: true
  drain:
    description: The node's scheduler backend (C(node_upgrade_drain)).
    type: str
    required: true
    choices: [none, command, slurm, slurm_reboot, kubernetes]
  scheduler_output:
    description: What the backend's read command printed (C(scontrol show node -o), the cordon jsonpath);
      empty for V(none) and V(command).
    type: str
    default: ""
  scheduler_node:
    description:
      - The Slurm node name O(scheduler_output) was asked for; an answer for another node is refused. Not checked when
        not given.
    type: str
  lock_stale_s:
    description: Seconds after which a lock whose holder's liveness is unknown may be taken over (0 never).
    type: float
    default: 21600
  lock_break:
    description: Take the lock over whoever holds it, and a flag or lock that cannot be read.
    type: bool
    default: false
  resolve:
    description: The options of M(gpufleet.nvidia.driver_resolve) but C(gpus) and C(distribution), which come
      from the facts just read. Without it only the node is read and the lock decided (a rollback).
    type: dict
  ignore_xids:
    description: Xids that never refuse the node.
    type: list
    elements: int
    default: []
  allow_flagged:
    description: Upgrade a node an earlier failed rollout flagged.
    type: bool
    default: false
  allow_fatal_xids:
    description: Upgrade a node with a fatal Xid in this boot.
    type: bool
    default: false
  allow_os_reboot_required:
    description: Upgrade a node that asks for an operating-system reboot.
    type: bool
    default: false
  allow_drained:
    description: Upgrade a node someone else drained (and leave it drained).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details: It only reads.
  diff_mode:
    support: none
author:
  - gpufleet.nvidia maintainers (@gpufleet)
extends_documentation_fragment:
  - gpufleet.nvidia.node_action
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
"""

EXAMPLES = r"""
- name: Read the node and decide
  gpufleet.nvidia.node_preflight:
    files:
      flag: /etc/ansible/facts.d/gpufleet_rollout.fact
      lock: /var/lib/gpufleet/rollout/lock.json
    owner: {rollout_id: driver-ltsb, run_id: ctl-4242-1, controller: ctl, pid: 4242}
    rollout_id: driver-ltsb
    drain: none
    resolve:
      branch: ltsb
  register: read
"""

RETURN = r"""
ansible_facts:
  description: C(nvidia) (M(gpufleet.nvidia.gpu_facts)) and, when they were gathered, the C(min) facts.
  returned: always
  type: dict
state:
  description: What the node holds (C(flag), C(lock_found), C(lock_identity), C(saved_snapshot), C(driver_local),
    C(drain_record), C(os_reboot_requested), C(boot_id)). With O(resolve), a C(saved_snapshot) of another rollout
    comes without its evidence (C(facts), C(local_facts), C(trace), C(benchmark)).
  returned: always
  type: dict
sched:
  description: The node's state in its scheduler (C(backend), C(known), C(out_of_service), C(draining), C(reason)).
  returned: always
  type: dict
drain_owned:
  description: Whether a rollout of this collection drains (and returns to service) the node.
  returned: always
  type: bool
lock:
  description: The lock decision (C(ok), C(takeover), C(reasons), C(flags), C(lock) to write).
  returned: always
  type: dict
probe:
  description: Whether the lock's holder still runs (C(alive) true, false or null, C(reason)); null when this run
    or nobody holds it.
  returned: always
  type: dict
resolve:
  description:
    - What the role reads of M(gpufleet.nvidia.driver_resolve)'s result, C(resolved) and C(fabric_manager)
      (C(failed) and C(msg) when it failed).
    - Its C(plan) and C(available_versions), which the decision used, stay out of the result.
  returned: with O(resolve)
  type: dict
decision:
  description: C(preflight) (C(ok), C(skip), C(action) V(upgrade), V(skip) or V(refuse), C(reasons), C(flags),
    C(notes)), C(staged), C(target) (the version) and C(left) (what a run that is gone left on the node).
  returned: with O(resolve)
  type: dict
"""
