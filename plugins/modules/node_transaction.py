#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: node_transaction
short_description: Run phases of a node's driver upgrade transaction in one task
version_added: "0.3.0"
description:
  - An action plugin, phases of the node_upgrade role's transaction in one task, so that phases that follow one
    another cost the controller one task. It runs the asked O(phases) in this order and stops at the first that
    fails.
  - V(snapshot) traces the GPUs (M(gpufleet.nvidia.gpu_trace), while the benchmark runs when one is declared,
    unless an interrupted attempt of this rollout left its snapshot) and saves the snapshot on the node
    (M(gpufleet.nvidia.node_lock)); an interrupted attempt's snapshot is kept (C(resumed)).
  - V(verify) reads the driver and GPU state (M(gpufleet.nvidia.gpu_facts)) and the boot id, reads the contract of
    the class's golden node from the rollout report on the controller, and judges the driver state, the target
    version, the GPUs, new fatal Xids and the golden contract (C(plugin_utils.rollout_verdict.verify_upgrade)).
  - V(check) traces the GPUs again (with the snapshot's trace as the baseline) and judges the node once more with
    the policy report and the benchmark.
  - V(hold_kernel) holds the running kernel (M(gpufleet.nvidia.kernel_hold), apt).
  - V(known_good) reads the driver state again and records it as last known-good
    (M(gpufleet.nvidia.driver_known_good)), which fails, changing nothing, unless the loaded driver is the
    installed one and is healthy.
  - The state of the transaction so far goes in as O(tx) and comes out as RV(tx), also when a phase failed, so
    that a later call and the role's rescue go on from it.
options:
  phases:
    description: The phases to run (in the order above, whatever the order given).
    type: list
    elements: str
    required: true
    choices: [snapshot, verify, check, hold_kernel, known_good]
  tx:
    description: RV(tx) of an earlier call (C(snapshot) and C(marks) at least, for every phase but V(snapshot)).
    type: dict
    default: {}
  marks:
    description: The transaction's time marks so far (epoch seconds by name), when O(tx) has none.
    type: dict
    default: {}
  rollout_id:
    description: The rollout's id.
    type: str
    required: true
  run_id:
    description: This run's id.
    type: str
    required: true
  stage:
    description: The node's stage (V(golden), V(canary), V(waves), ...); a golden node is not compared with itself.
    type: str
    required: true
  target:
    description: The exact driver version the transaction installs.
    type: str
    default: ""
  snapshot:
    description: For V(snapshot) - C(path) (the snapshot file on the node), C(saved) (the snapshot found there),
      C(boot_id) (read at the preflight) and C(local_facts) (the driver's local facts).
    type: dict
    default: {}
  trace:
    description: C(enabled) (bool), C(duration_s) and C(interval_s) of M(gpufleet.nvidia.gpu_trace).
    type: dict
    default: {}
  benchmark:
    description: C(command) (argv; its last output line is the result), C(baseline) (a fixed result to compare
      with, else the snapshot's), C(threshold) (0.9) and C(higher_is_better) (true).
    type: dict
    default: {}
  verify:
    description: For V(verify) - C(boot_id_file), C(ignore_xids), C(allow_gpu_count_change), C(replaced_gpus), C(golden_report_dir)
      (the rollout report on the controller; empty leaves the golden comparison out), C(node_class),
      C(golden_ignore) and C(rollback_version).
    type: dict
    default: {}
  policy:
    description: C(mode) (V(none), V(apply) or V(verify)) and, for V(check), C(report) (C(gpu_policy_report)).
    type: dict
    default: {}
  kernel_hold:
    description: For V(hold_kernel) - C(packages_extra), C(unattended_upgrades) and C(blacklist_extra) of
      M(gpufleet.nvidia.kernel_hold).
    type: dict
    default: {}
  known_good:
    description: For V(known_good) - C(path) (the driver's local facts) and C(history_limit).
    type: dict
    default: {}
attributes:
  check_mode:
    support: none
    details: It changes the node; the role runs it outside check mode only.
  diff_mode:
    support: full
    details: The snapshot saved, the kernel hold and the known-good record, as the modules it runs show them.
author:
  - gpufleet.nvidia maintainers (@gpufleet)
extends_documentation_fragment:
  - gpufleet.nvidia.node_action
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
"""

EXAMPLES = r"""
- name: Verify the node, hold its kernel and record its driver as last known-good
  gpufleet.nvidia.node_transaction:
    phases: [verify, check, hold_kernel, known_good]
    tx: "{{ {'snapshot': snapshot} }}"
    rollout_id: driver-ltsb
    run_id: ctl-4242-1
    stage: waves
    target: 620.82.01
    verify:
      golden_report_dir: gpufleet-reports/rollout/driver-ltsb
      node_class: gpu_h100
  register: verified
"""

RETURN = r"""
tx:
  description:
    - The transaction's state - C(marks), C(phases_done), and what the phases found - C(snapshot), C(verdict)
      (C(ok), C(reasons), C(flags), C(rollback), ...), C(verify_options), C(after_boot_id), C(trace_after)
      (C(csv), C(changes) or null), C(policy_mode), C(kernel_hold) and C(known_good).
    - C(snapshot) only when the snapshot phase ran in this task; a later task is given it again in O(tx).
  returned: always
  type: dict
ansible_facts:
  description: C(nvidia) as the last phase that read the node found it.
  returned: when a phase read the node
  type: dict
"""
