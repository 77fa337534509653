#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: rollout_report
short_description: Keep the driver rollout's plan, per-node records and report on the controller
version_added: "0.1.0"
description:
  - Runs on the controller (an action plugin; nothing runs on a node). Used by C(playbooks/rollout.yml) and
    the C(node_upgrade) role.
  - V(start) returns this run's identity (C(run_id), controller host name and the C(ansible-playbook)
    process id, the owner written into each node's rollout lock) and, with O(plan), writes C(plan.json)
    into O(report_dir).
  - V(probe) tells whether the C(ansible-playbook) process O(pid) on O(controller) still runs (a lock left by
    a killed run may be taken over).
  - V(record) stores one node's record (C(nodes/<host>.json), atomically) and appends its line to the
    rollout journal (C(journal.jsonl)) under the same file lock; its cost does not grow with the report.
    A re-run of the same rollout keeps the earlier C(upgraded) record of a node it now finds on target.
  - V(finish) appends only the journal line that ends a node's transaction (after the soak gate of a
    golden or canary node, see O(hold)).
  - V(render) regenerates C(rollout-report.json), C(rollout-report.md), C(rollout-report.html) (one
    self-contained page), C(rollout-report.junit.xml) and, where the Python package C(prometheus_client) is
    installed, C(gpufleet_rollout.prom) (once per rollout step) and returns the report with its Markdown;
    without C(prometheus_client) (the collection's C(requirements.txt)) the textfile is skipped and the
    report's C(skipped_outputs) says so, with the command that installs it;
    with a plan written by C(rollout_step), the status and the stop reason come from the rollout's budget
    decision over the journal. It marks the end of a step in the journal, which numbers each node's step.
  - The record's fields are described in the collection's C(docs/rollout.md).
options:
  state:
    description: What to do.
    type: str
    required: true
    choices: [start, probe, record, finish, render, golden]
  report_dir:
    description: The rollout's report directory on the controller (one per rollout id).
    type: path
  rollout_id:
    description: The rollout's id, written into the plan.
    type: str
  plan:
    description: C({stages, request}) for O(state=start); C(stages) is a list of C({name, hosts, serial}).
    type: dict
  record:
    description: One node's record for O(state=record) and O(state=finish); C(node) is required.
    type: dict
  hold:
    description:
      - With O(state=record), keep the node in flight in the journal (a golden or canary node that passed,
        before its soak and the check after it); O(state=finish) ends it.
    type: bool
    default: false
  fail_msg:
    description:
      - With O(state=record), fail the task with this message once the record is written (a node that did
        not reach its goal fails its host in the same task that records it). Empty or absent, the task does
        not fail.
    type: str
  warn_skipped:
    description:
      - With O(state=render), warn (the result's C(warnings)) when an output was skipped (the Prometheus
        textfile without C(prometheus_client)). The rollout's steps render with V(false), its last
        render with V(true), so a run warns once.
    type: bool
    default: true
  traces:
    description:
      - With O(state=record), the node's GPU traces before and after the update, C({before, after}), each C({csv})
        as C(gpufleet.nvidia.gpu_trace) returned it (the trace after with its C(changes) against the one before), or
        null. They are written to C(traces/<node>.before.csv) and C(traces/<node>.after.csv) in the report
        directory; the record's C(evidence) holds the paths, the sample counts and the changes.
    type: dict
  node_class:
    description:
      - With O(state=golden), the GPU class (C(gpu_h100)) whose golden node's contract after its update is returned
        in C(golden), the contract the rest of the class must match.
    type: str
  controller:
    description: Controller host name of the lock holder to probe.
    type: str
  pid:
    description: Process id of the lock holder to probe.
    type: int
  run_id:
    description:
      - The lock holder's run id, for O(state=probe) when the holder ran on another controller (the next AWX job's
        container is another host); its lease is C(<report_dir>/runs/<run_id>.lease) under this rollout's own
        O(report_dir), never a path the node's lock names. Renewed within 300 s, the holder runs; older, it is gone;
        absent, unreadable, of another run or modified in the future, unknown.
    type: str
notes:
  - This module supports check mode; in check mode it writes nothing.
author:
  - gpufleet.nvidia maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.nvidia.controller_action
"""

EXAMPLES = r"""
- name: Start the rollout
  gpufleet.nvidia.rollout_report:
    state: start
    rollout_id: driver-ltsb
    report_dir: gpufleet-reports/rollout/driver-ltsb
    plan:
      stages:
        - {name: golden, hosts: [gpu-h100-01]}
        - {name: waves, hosts: [gpu-h100-02, gpu-a100-01]}
  register: rollout_start

- name: Print the report
  gpufleet.nvidia.rollout_report:
    state: render
    report_dir: gpufleet-reports/rollout/driver-ltsb
  register: rollout_report
"""

RETURN = r"""
run:
  description: This run's identity, for O(state=start).
  returned: when O(state=start)
  type: dict
  sample: {"run_id": "ctl-4242-1234567", "controller": "ctl", "pid": 4242, "ticks": 1234567, "awx_job_id": "4711",
           "started_at": "2026-11-29T10:00:00Z", "lease": "/runner/reports/rollout/driver-ltsb/runs/ctl-4242-1234567.lease"}
golden:
  description:
    - With O(state=golden), C({node, contract}) of the class's first golden node that passed and kept its contract,
      or null when there is none yet.
  returned: when O(state=golden)
  type: dict
alive:
  description:
    - Whether the probed run still runs; V(null) when it cannot be told from here (no controller, no pid or one that
      is not a process id, another controller and no lease of that run here, a lease from the future).
  returned: when O(state=probe)
  type: bool
reason:
  description: How O(state=probe) told (the process on this controller, or the lease and its age).
  returned: when O(state=probe)
  type: str
report_dir:
  description: Absolute path of the report directory.
  returned: unless O(state=probe)
  type: str
paths:
  description: Files written (C(record); C(json), C(markdown), C(html), C(junit) and C(prometheus) when rendered).
  returned: when O(state) is V(record) or V(render), not in check mode
  type: dict
skipped_outputs:
  description: Outputs of the render that were not written, each with why and how to get it (C(prometheus)
    without the Python package C(prometheus_client)); empty when every one was written.
  returned: when rendered, not in check mode
  type: dict
status:
  description: C(completed), C(stopped) or C(in_progress).
  returned: when O(state=render), not in check mode
  type: str
summary:
  description:
    - Nodes per outcome, each node in exactly one, so they add up to C(nodes) - C(upgraded), C(skipped)
      (already on target), C(rolled_back) (on its last known-good driver, verified), C(rolled_back_flagged)
      (rolled back and still flagged - the rollback was installed, the node still fails its verification),
      C(flagged), C(refused), C(failed), C(unreachable), C(interrupted), C(pending), C(unknown),
      C(not_started) - and C(nodes).
  returned: when O(state=render), not in check mode
  type: dict
summary_text:
  description: The summary as the report's sentence.
  returned: when O(state=render), not in check mode
  type: str
  sample: "8 nodes: 7 upgraded, 0 already on target, 0 rolled back, 1 rolled back and still flagged, 0 flagged, 0 refused, 0 not started"
stopped_by:
  description: The nodes the stop names, C({node, stage, result, outcome, reason, next_step}).
  returned: when O(state=render), not in check mode
  type: list
  elements: dict
report:
  description: The whole report.
  returned: when O(state=render), not in check mode
  type: dict
markdown:
  description: The report as Markdown.
  returned: when O(state=render), not in check mode
  type: str
"""
