# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node_upgrade role's drain and return to service, against recording stand-ins of kubectl and scontrol.

This is not an integration test: there is no Kubernetes API server or Slurm controller here.
The stand-ins record each command line and answer from a state file; the test runs the role's
own task files (``scheduler.yml``, ``drain.yml``, ``undrain.yml``; who drained the node is
decided as ``plugin_utils.node_preflight.scheduler`` decides it) with ``ansible-playbook``
on the controller and checks the commands, their order, and the drain record on the "node"
(a directory). What it proves: the arguments (the drain timeout of an extra var given as a
string, the rollout's reason), the order, and who returns a node to service.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

STAND_IN = r'''#!/usr/bin/env python3
import json, os, sys
state_path = os.environ["STANDIN_STATE"]
with open(os.environ["STANDIN_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\n")
state = json.load(open(state_path))
args = sys.argv[1:]
if os.path.basename(sys.argv[0]) == "kubectl":
    if args[:2] == ["get", "node"]:
        print("true" if state["cordoned"] else "", end="")
    elif args[0] == "cordon":
        state["cordoned"] = True
    elif args[0] == "uncordon":
        state["cordoned"] = False
else:
    if args[:3] == ["show", "node", "-o"]:
        seq = state["show"]
        line = seq.pop(0) if len(seq) > 1 else seq[0]
        print("NodeName=%s State=%s Partitions=all" % (args[3], line["state"]) + (" Reason=%s [root@t]" % line["reason"] if line.get("reason") else ""))
    elif args[0] == "update":
        fields = dict(a.split("=", 1) for a in args[1:])
        if fields.get("State") == "DRAIN":
            state["show"] = [{"state": "MIXED+DRAIN", "reason": fields["Reason"]}, {"state": "IDLE+DRAIN", "reason": fields["Reason"]}]
        elif fields.get("State") == "RESUME":
            state["show"] = [{"state": "IDLE"}]
json.dump(state, open(state_path, "w"))
'''

PLAYBOOK = """\
- name: Drain and return to service
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    node_upgrade_rollout_id: driver-ltsb
    __node_upgrade_owner: {run_id: run-1}
    __node_upgrade_marks: {}
  tasks:
    - name: Read the drain record
      ansible.builtin.set_fact:
        __node_upgrade_drain_record: "{{ lookup('ansible.builtin.file', record_path, errors='ignore') | default('{}', true) | from_json }}"
    - name: Scheduler state
      ansible.builtin.include_role:
        name: gpufleet.nvidia.node_upgrade
        tasks_from: scheduler
    # What gpufleet.nvidia.node_preflight decides from that output and the drain record
    # (plugin_utils/node_preflight.py scheduler()), with the same filters.
    - name: Who drained the node
      vars:
        __out: >-
          {{ __node_upgrade_sched_slurm.stdout if node_upgrade_drain in ['slurm', 'slurm_reboot']
             else __node_upgrade_sched_k8s.stdout if node_upgrade_drain == 'kubernetes' else '' }}
      ansible.builtin.set_fact:
        __node_upgrade_sched: "{{ __out | gpufleet.nvidia.rollout_drain_state(node_upgrade_drain) }}"
        __node_upgrade_drain_owned: >-
          {{ node_upgrade_drain != 'none' and not (__out | gpufleet.nvidia.rollout_drain_state(node_upgrade_drain)
             | gpufleet.nvidia.rollout_drained_by_others(__node_upgrade_drain_record)) }}
    - name: Drain
      ansible.builtin.include_role:
        name: gpufleet.nvidia.node_upgrade
        tasks_from: drain
    - name: Keep the drain record for the test
      ansible.builtin.command:
        argv: [cp, "{{ record_path }}", "{{ record_path }}.seen"]
      changed_when: false
      failed_when: false
    - name: Return to service
      ansible.builtin.include_role:
        name: gpufleet.nvidia.node_upgrade
        tasks_from: undrain
"""


@pytest.fixture
def bench(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("kubectl", "scontrol"):
        path = bindir / name
        path.write_text(STAND_IN)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "playbook.yml").write_text(PLAYBOOK)
    return tmp_path


def run(bench, backend, state, record=None, **extra):
    state_dir = bench / "state"
    state_dir.mkdir(exist_ok=True)
    record_path = state_dir / "drain.json"
    if record is not None:
        record_path.write_text(json.dumps(record))
    (bench / "state.json").write_text(json.dumps(state))
    log = bench / "commands.log"
    if log.exists():
        log.unlink()
    env = dict(os.environ, STANDIN_STATE=str(bench / "state.json"), STANDIN_LOG=str(log),
               PATH="%s:%s" % (bench / "bin", os.environ["PATH"]),
               ANSIBLE_CONFIG=os.path.join(REPO, "tests", "ansible.cfg"))
    variables = dict({"node_upgrade_drain": backend, "node_upgrade_state_dir": str(state_dir), "record_path": str(record_path),
                      "node_upgrade_kubectl": [str(bench / "bin" / "kubectl")], "node_upgrade_drain_host": "localhost",
                      "node_upgrade_slurm_node_name": "node01", "node_upgrade_kubernetes_node_name": "node01",
                      "ansible_python_interpreter": sys.executable}, **extra)
    (bench / "vars.json").write_text(json.dumps(variables))
    tool = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    proc = subprocess.run([tool, "-i", "localhost,", str(bench / "playbook.yml"), "-e", "@%s" % (bench / "vars.json"),
                           "-e", "node_upgrade_drain_timeout_s=14400", "-e", "node_upgrade_drain_poll_s=1"],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    commands = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    seen = state_dir / "drain.json.seen"
    return commands, (json.loads(seen.read_text()) if seen.exists() else None), record_path.exists()


def test_kubernetes_cordon_drain_with_the_drain_timeout_then_uncordon(bench):
    commands, record, left = run(bench, "kubernetes", {"cordoned": False})
    assert commands == [
        ["kubectl", "get", "node", "node01", "-o", "jsonpath={.spec.unschedulable}"],
        ["kubectl", "cordon", "node01"],
        ["kubectl", "drain", "node01", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=14400s"],
        ["kubectl", "uncordon", "node01"],
    ]
    assert record["backend"] == "kubernetes" and record["rollout_id"] == "driver-ltsb" and record["run_id"] == "run-1"
    assert left is False  # returned to service: the record goes


def test_kubernetes_node_cordoned_by_someone_else_stays_cordoned(bench):
    commands, record, left = run(bench, "kubernetes", {"cordoned": True})
    assert [c[1] for c in commands] == ["get", "drain"]  # no cordon of ours, no uncordon
    assert record is None and left is False


def test_kubernetes_timeout_given_in_the_drain_arguments_is_kept(bench):
    commands, _record, _left = run(bench, "kubernetes", {"cordoned": False},
                                   node_upgrade_kubectl_drain_args=["--ignore-daemonsets", "--timeout=90s"])
    assert commands[2] == ["kubectl", "drain", "node01", "--ignore-daemonsets", "--timeout=90s"]


def test_slurm_drain_waits_while_draining_then_resumes_with_the_rollouts_reason(bench):
    commands, record, left = run(bench, "slurm", {"show": [{"state": "IDLE"}]})
    assert commands[0] == ["scontrol", "show", "node", "-o", "node01"]
    assert commands[1] == ["scontrol", "update", "NodeName=node01", "State=DRAIN", "Reason=gpufleet driver-ltsb: driver rollout"]
    # MIXED+DRAIN (a job still runs) then IDLE+DRAIN: at least two reads before the resume.
    assert commands[2:4] == [["scontrol", "show", "node", "-o", "node01"]] * 2
    assert commands[-1] == ["scontrol", "update", "NodeName=node01", "State=RESUME"]
    assert record["reason"] == "gpufleet driver-ltsb: driver rollout" and left is False


def test_slurm_node_an_earlier_failed_rollout_drained_is_resumed(bench):
    earlier = {"backend": "slurm", "rollout_id": "driver-620", "run_id": "run-0", "reason": "gpufleet driver-620: driver rollout"}
    commands, record, left = run(bench, "slurm", {"show": [{"state": "IDLE+DRAIN", "reason": earlier["reason"]}]}, record=earlier)
    assert ["scontrol", "update", "NodeName=node01", "State=RESUME"] in commands
    assert not [c for c in commands if "State=DRAIN" in c]  # already drained: not drained again
    assert record["first_drained_by"] == "driver-620" and left is False


def test_slurm_node_an_operator_drained_keeps_its_drain(bench):
    commands, record, left = run(bench, "slurm", {"show": [{"state": "IDLE+DRAIN", "reason": "bad DIMM"}]})
    assert not [c for c in commands if c[1] == "update"]
    assert record is None and left is False
