#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: drift_report
short_description: Compare every node's NVIDIA facts with the declared state of its GPU class
version_added: "0.1.0"
description:
  - Runs on the controller (an action plugin; no module runs on a node). Reads each node's
    C(ansible_facts.nvidia) from the live run, a directory of C(<host>.json) files or Ansible's
    C(jsonfile) fact cache (the payload-wrapped files of ansible-core 2.19 named
    C(<prefix>s1_<host>), older plain JSON files and AWX's C(fact_cache) directory).
  - Compares them with the declared state of the node's GPU class, taken from the variables the
    C(driver) and C(gpu_policy) roles read (C(driver_branch), C(driver_version),
    C(driver_kernel_module_type), C(gpu_policy_power_limit_w), C(gpu_policy_power_limit_percent),
    C(gpu_policy_persistence_mode), C(gpu_policy_ecc_mode), C(gpu_policy_compute_mode), the MIG layout)
    and C(gpufleet_gpu_count). A branch class such as V(ltsb) is resolved per node for its GPU
    architectures with the collection's branch catalog.
  - Returns findings per node and per class with a severity (V(info), V(warning), V(critical)) and
    writes JSON, Markdown and a Prometheus textfile. Fails (ansible-playbook exits non-zero) when a
    finding reaches O(fail_on), unless O(report_only).
  - One pass over the nodes, linear in the fleet size. The checks are listed in the collection's
    C(docs/drift.md).
options:
  source:
    description:
      - V(live) reads C(hostvars[host].ansible_facts.nvidia) (run C(gpufleet.nvidia.gpu_facts) first).
      - V(dir) reads C(<path>/<host>.json) (C(playbooks/facts.yml) with C(gpufleet_facts_dir)).
      - V(jsonfile) reads the fact cache in O(path) (C(fact_caching_connection)) with O(prefix).
    type: str
    choices: [live, dir, jsonfile]
    default: live
  path:
    description: Directory of the facts for O(source=dir) and O(source=jsonfile).
    type: path
  prefix:
    description: The fact cache's C(fact_caching_prefix).
    type: str
    default: ""
  hosts:
    description: Nodes to judge; default every inventory host except C(localhost).
    type: list
    elements: str
  class_prefix:
    description: A node's GPU class is its first inventory group (sorted by name) starting with this prefix.
    type: str
    default: gpu_
  declared_from:
    description:
      - V(host) reads the declared variables of every node (host_vars overrides count). Nodes that
        share their groups with variables and their own declared variables share one reading; a node
        with a C(host_vars) entry, or whose declared variables are templates, is read on its own.
      - V(class) reads them from the first node of each class only (host_vars overrides are not seen).
    type: str
    choices: [host, class]
    default: host
  declared:
    description:
      - Declared variables per class (class name to a dict of the variables above), replacing what the
        inventory says for that class.
    type: dict
  max_age_s:
    description: Facts older than this many seconds (file time) are reported as C(facts_stale).
    type: float
  output_dir:
    description:
      - Directory on the controller for C(drift-report.json), C(drift-report.md), C(drift-report.html)
        (one self-contained page), C(drift-report.junit.xml) (a test case per node) and
        C(gpufleet_drift.prom). Nothing is written without it (except O(prometheus_path)).
    type: path
  formats:
    description:
      - Outputs to write.
      - Left out (the default), every format is written, the Prometheus textfile only where the
        Python package C(prometheus_client) is installed on the controller (the collection's
        C(requirements.txt)); without it the others are written, the result's C(warnings) and
        C(skipped_outputs) say once that the textfile was skipped and how to get it, and so do the
        JSON, Markdown and HTML reports.
      - Given and naming V(prometheus), a controller without C(prometheus_client) fails the task before
        any work, with the same remedy as that warning (the controller's Python and the
        C(<python> -m pip install -r <collection>/requirements.txt) command).
    type: list
    elements: str
    choices: [json, markdown, html, junit, prometheus]
    default: [json, markdown, html, junit, prometheus]
  prometheus_path:
    description:
      - Path of the Prometheus textfile (for node_exporter's textfile collector directory), written
        with the Python package C(prometheus_client) on the controller.
    type: path
  prometheus_gpus:
    description:
      - Which GPUs get per-GPU series (labelled as dcgm-exporter's C(DCGM_FI_*) series are).
      - V(drifted) the GPUs of every node that is not in sync; V(all) every GPU (about ten series per
        GPU, about 2.5 kB of file per GPU); V(none) no per-GPU series.
    type: str
    choices: [none, drifted, all]
    default: drifted
  rollout_report:
    description:
      - A rollout report (C(rollout-report.json), or the rollout's report directory holding it) whose
        metrics are added to the Prometheus textfile.
    type: path
  workers:
    description:
      - Processes that read and judge the nodes; V(0) is one per usable CPU. Fewer than 400 nodes are
        judged in one process.
    type: int
    default: 0
  report_only:
    description: Never fail on drift; only report.
    type: bool
    default: false
  fail_on:
    description: Lowest severity that fails the task.
    type: str
    choices: [info, warning, critical]
    default: warning
  max_markdown_findings:
    description: Findings listed in the Markdown report, most severe first; the rest are counted.
    type: int
    default: 500
  max_html_rows:
    description:
      - Rows of the HTML report's findings per node (one per node and check), most severe first; the rest
        are counted. A negative number shows all.
    type: int
    default: 5000
  return_findings:
    description: Findings returned in the task result (all are in the JSON file).
    type: int
    default: 200
notes:
  - This module supports check mode; in check mode it judges but writes no file.
seealso:
  - module: gpufleet.nvidia.gpu_facts
author:
  - gpufleet.nvidia maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.nvidia.controller_action
"""

EXAMPLES = r"""
- name: Report drift from live facts
  gpufleet.nvidia.drift_report:
    hosts: "{{ groups['gpu_nodes'] }}"
    output_dir: /var/lib/gpufleet/drift
  run_once: true
  delegate_to: localhost

- name: Report drift from the jsonfile fact cache, for a scheduled job
  gpufleet.nvidia.drift_report:
    source: jsonfile
    path: /var/cache/ansible/facts
    output_dir: /srv/reports/drift
    prometheus_path: /var/lib/node_exporter/textfile/gpufleet_drift.prom
    max_age_s: 86400
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
summary:
  description: Fleet totals.
  returned: always
  type: dict
  sample: {"nodes": 8, "in_sync": 7, "drifted": 1, "missing": 0, "findings": 1,
           "by_severity": {"info": 0, "warning": 0, "critical": 1}, "by_check": {"driver_branch": 1},
           "worst_severity": "critical"}
classes:
  description: Per class C({nodes, in_sync, drifted, missing, by_check, worst_severity, drifted_nodes}).
  returned: always
  type: dict
findings:
  description:
    - Findings C({node, class, check, severity, gpu, expected, actual, message}), at most O(return_findings).
  returned: always
  type: list
  elements: dict
drifted_nodes:
  description: Names of the nodes with a finding of severity V(warning) or above.
  returned: always
  type: list
  elements: str
paths:
  description: Files written, by format (C(json), C(markdown), C(html), C(junit), C(prometheus)).
  returned: always
  type: dict
exit_code:
  description: 0 in sync (or O(report_only)), 2 when drift reaches O(fail_on).
  returned: always
  type: int
drift:
  description: Whether a finding reaches O(fail_on), whatever O(report_only) says.
  returned: always
  type: bool
source_errors:
  description: Fact files that could not be read, by host.
  returned: always
  type: dict
skipped_outputs:
  description:
    - Outputs of the default formats that were not written, each with why and the command that gets it
      (C(prometheus) without the Python package C(prometheus_client)); also in the JSON report and said
      once in the Markdown and HTML reports and in the result's C(warnings).
  returned: always
  type: dict
  sample: {"prometheus": "the Prometheus textfile /srv/reports/gpufleet_drift.prom was not written: ..."}
elapsed_s:
  description: Seconds the report took on the controller.
  returned: always
  type: float
"""
