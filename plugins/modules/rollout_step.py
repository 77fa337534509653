#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: rollout_step
short_description: Plan a driver rollout, choose each step's hosts and admit nodes within the budgets
version_added: "0.2.0"
description:
  - Runs on the controller (an action plugin; nothing runs on a node). Used by C(playbooks/rollout.yml) and
    C(playbooks/rollout_step.yml); every decision is C(plugin_utils.rollout_budget.decide) over the rollout
    journal in O(report_dir).
  - V(plan) refuses bad input before any host is touched (an empty fleet, O(pass_s) or O(passes) out of range, a missing golden or canary
    stage unless in O(allow_missing_stages), a budget that is zero, negative, over 100 % or not a count or
    percentage, and with O(check_variables) a variable under the collection's prefixes that nothing reads,
    naming the closest known one), then writes C(plan.json) with each node's stage, GPU class and failure
    domain.
  - V(choose) returns the next step's hosts, nodes in flight first, at most O(step_hosts). With the C(executor)
    option V(passes) a step is a pass; it begins O(pass_s) seconds after this run's last pass began, takes only
    the nodes whose next action is ready (not a node waiting for its install admission, nor one whose reboot
    Slurm runs while O(squeue) shows a job on it) and the nodes that may start now, and journals itself
    (a C(pass) event with its hosts and every node counted per state).
  - V(admit) waits until O(node) may start within its class's budget and stage (re-deciding each time the
    journal changes), then journals it as started; it returns V(false) for C(admitted) when the rollout
    stopped or is done, or when no slot can free up in this step. With the C(drain_ahead) option (the
    default) a node may start (drain) whatever its stage, within its class's capacity budget.
  - V(install) is the second admission, after the node's drain (with C(drain_ahead)). It journals the node
    drained and waits until its stage is open and its class's window has room, then journals it as
    installing. When the rollout stops first it returns C(admitted) V(false) and C(released) V(true), and the
    node goes back to service untouched. With C(executor) V(passes) neither V(admit) nor V(install) waits; a node
    whose install may not begin now is journaled C(waiting) (C(waiting) V(true)) and a later pass takes it up.
  - V(released) journals O(node) as back in service untouched (not started in this rollout).
  - V(plan) also refuses to start while another rollout with a report directory beside O(report_dir) runs on any of
    the same nodes (its run on this controller is alive, or another controller wrote it within
    O(concurrent_stale_s)), unless O(allow_concurrent). Across controllers that share no report directory, the
    nodes' own locks (C(gpufleet.nvidia.node_lock)) let exactly one rollout through per node.
  - V(unfinished) returns the nodes of O(candidates) that the journal still has in flight. At the end of a step
    these are the nodes that lost their connection or failed outside their transaction, which have no record yet.
    Nodes whose driver is staged and whose reboot Slurm runs (C(node_upgrade_drain=slurm_reboot)) are returned
    apart, as C(pending) (recorded, still in flight, holding their slot).
  - V(waiting) (with C(executor) V(passes)) leaves O(node), whose jobs still run after its drain was asked for, in
    flight and waiting in the journal, so that the pass ends without it and a later pass goes on once Slurm shows
    no job on it. It returns C(timed_out) instead once O(timeout_s) have passed since the node's start, and
    C(stop) when the rollout stopped (the install admission then returns the node to service untouched).
  - Budgets, stages and stop reasons are described in the collection's C(docs/rollout.md).
options:
  state:
    description: What to do.
    type: str
    required: true
    choices: [plan, choose, admit, install, released, unfinished, waiting]
  report_dir:
    description: The rollout's report directory on the controller (one per rollout id).
    type: path
    required: true
  rollout_id:
    description: The rollout's id, for O(state=plan).
    type: str
  stages:
    description: For O(state=plan), C({golden, canary, waves}), each a list of host names in priority order.
    type: dict
  options:
    description:
      - Budget options, C({max_unavailable, max_unavailable_domain, failure_budget, signature_limit,
        background_failure_rate, signature_alpha, window_initial, window_growth, canary_quorum, drain_ahead,
        contract_changes, contract_accept, executor}); values may be text. C(executor) is V(steps) (the default)
        or V(passes).
    type: dict
    default: {}
  class_prefix:
    description: Prefix of the inventory groups that are GPU classes.
    type: str
    default: gpu_
  domain_prefix:
    description: Prefix of the inventory groups that are failure domains (racks, partitions); empty for none.
    type: str
    default: ""
  allow_missing_stages:
    description: Stages (V(golden), V(canary)) that may have no host.
    type: list
    elements: str
    default: []
  check_variables:
    description: Refuse unknown variables under the collection's prefixes.
    type: bool
    default: true
  step_hosts:
    description: For O(state=choose), at most this many hosts in the step; V(0) takes the run's C(forks).
    type: int
    default: 0
  node:
    description: For O(state=admit), the host asking for a slot.
    type: str
  candidates:
    description: For O(state=admit) and O(state=unfinished), the step's hosts.
    type: list
    elements: str
    default: []
  run_id:
    description: For O(state=admit), O(state=install) and O(state=choose), this run's id, written into the journal.
    type: str
  pass_s:
    description: For O(state=choose) with C(executor) V(passes), the least seconds between the starts of two passes
      of a run (a number; text is read as one).
    type: raw
    default: 60
  passes:
    description: For O(state=plan), the most passes a run makes (C(rollout_passes)); from 1 to 60, the steps
      C(playbooks/rollout.yml) imports (a whole number; text is read as one).
    type: raw
    default: 60
  timeout_s:
    description: For O(state=waiting), seconds after the node's start in the journal by which its drain must be over
      (C(node_upgrade_drain_timeout_s)).
    type: float
    default: 0
  poll_s:
    description: For O(state=admit), seconds between two looks at the journal.
    type: float
    default: 2.0
  squeue:
    description:
      - For O(state=choose), the output of C(squeue --noheader --states=RUNNING,COMPLETING --format=%N|%L) on each Slurm
        controller of the rollout's nodes. Wave nodes whose jobs have the most time left start first (longest drain
        first); the estimates are kept beside the journal for O(state=admit).
    type: list
    elements: str
    default: []
  slurm_names:
    description: For O(state=choose), the Slurm node name of each inventory host (null for the host's short name).
    type: dict
    default: {}
  allow_concurrent:
    description: For O(state=plan), start even while another rollout runs on some of the same nodes.
    type: bool
    default: false
  concurrent_stale_s:
    description:
      - For O(state=plan), seconds after which another controller's rollout that wrote nothing is taken as no
        longer running (its liveness cannot be seen from here).
    type: float
    default: 21600
notes:
  - This module supports check mode; in check mode it writes nothing and admits every node (the
    transactions only say what they would do).
author:
  - gpufleet.nvidia maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.nvidia.controller_action
"""

EXAMPLES = r"""
- name: Refuse bad input before any host is touched
  gpufleet.nvidia.rollout_step:
    state: plan
    rollout_id: driver-ltsb
    report_dir: gpufleet-reports/rollout/driver-ltsb
    stages: {golden: [gpu-h100-01], canary: [gpu-h100-02], waves: [gpu-h100-03, gpu-a100-01]}
    options: {max_unavailable: "10%", failure_budget: "1%"}

- name: Wait for the install admission after the drain
  gpufleet.nvidia.rollout_step:
    state: install
    report_dir: gpufleet-reports/rollout/driver-ltsb
    options: {max_unavailable: "10%"}
    node: "{{ inventory_hostname }}"
    run_id: "{{ run_id }}"
  register: install_admission

- name: Choose the hosts of the next step
  gpufleet.nvidia.rollout_step:
    state: choose
    report_dir: gpufleet-reports/rollout/driver-ltsb
  register: rollout_step
"""

RETURN = r"""
report_dir:
  description: Absolute path of the report directory.
  returned: always
  type: str
nodes:
  description: Nodes in the plan.
  returned: when O(state=plan)
  type: int
unfinished:
  description: Of O(candidates), the nodes still in flight in the journal (no record yet).
  returned: when O(state=unfinished)
  type: list
  elements: str
pending:
  description: Of O(candidates) (O(state=unfinished)), or of the step's hosts (O(state=choose)), the nodes in flight
    that wait for the reboot their scheduler runs (recorded).
  returned: when O(state) is V(unfinished) or V(choose)
  type: list
  elements: str
classes:
  description: Per GPU class C({nodes, max_unavailable, failure_budget, ...}).
  returned: when O(state) is V(plan) or V(choose)
  type: dict
action:
  description: The decision, C(start), C(wait), C(done) or C(stop).
  returned: when O(state=choose)
  type: str
hosts:
  description: The next step's hosts.
  returned: when O(state=choose)
  type: list
  elements: str
limit:
  description: The most hosts a step takes (O(step_hosts), or the controller's forks).
  returned: when O(state=choose)
  type: int
drain_estimates:
  description: Nodes whose drain estimate this step read from O(squeue).
  returned: when O(state=choose)
  type: int
in_flight:
  description: Nodes in flight when the step was chosen.
  returned: when O(state=choose)
  type: int
node_states:
  description: Every node of the rollout counted per state (C(plugin_utils.node_states)), as the journal tells it.
  returned: when O(state=choose)
  type: dict
pass:
  description: The number of this pass in this run (C(executor) V(passes)).
  returned: when O(state=choose) with C(executor) V(passes), not in check mode
  type: int
waited_s:
  description: Seconds the pass waited for O(pass_s) to pass since this run's last pass began.
  returned: when O(state=choose) with C(executor) V(passes), not in check mode
  type: float
stop:
  description: C({code, reason, nodes}) when the rollout stopped.
  returned: when O(state) is V(choose), V(admit) or V(waiting)
  type: dict
admitted:
  description: Whether the node may start (or resume) its transaction now (V(admit)), or begin its install (V(install)).
  returned: when O(state) is V(admit) or V(install)
  type: bool
released:
  description: The rollout stopped before the node's install; the node is to go back to service untouched.
  returned: when O(state=install)
  type: bool
waiting:
  description: With C(executor) V(passes), the node's install may not begin now (V(install)), or its jobs still run
    (V(waiting)); it stays in flight, in no worker, for a later pass.
  returned: when O(state) is V(install) or V(waiting)
  type: bool
timed_out:
  description: The node's drain is out of time (O(timeout_s) since its start); its transaction fails it.
  returned: when O(state=waiting)
  type: bool
until:
  description: Epoch seconds by which the node's drain must be over.
  returned: when O(state=waiting), not in check mode
  type: float
why:
  description: The reason for C(admitted), or for C(waiting).
  returned: when O(state) is V(admit), V(install) or V(waiting), not in check mode
  type: str
"""
