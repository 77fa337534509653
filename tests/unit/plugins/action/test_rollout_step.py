# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout_step action's second admission (state=install) and release, run by ansible-playbook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ansible_collections.gpufleet.nvidia.plugins.action import rollout_step
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_budget, rollout_journal

NODES = [{"name": "g1", "stage": "golden", "class": "gpu_h100", "domain": None},
         {"name": "c1", "stage": "canary", "class": "gpu_h100", "domain": None},
         {"name": "w1", "stage": "waves", "class": "gpu_h100", "domain": None}]


def run_playbook(tmp_path, tasks):
    playbook = tmp_path / "pb.yml"
    playbook.write_text("- name: Step\n  hosts: localhost\n  gather_facts: false\n  tasks:\n" + tasks)
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                           "-e", "ansible_python_interpreter=%s" % sys.executable, str(playbook)],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.split("RESULT ", 1)[1].split("\n")[0].rstrip('"').replace('\\"', '"')
    return json.loads(line)


OPTIONS = "{max_unavailable: '3', drain_ahead: 'true'}"
PASSES = "{max_unavailable: '3', drain_ahead: 'true', executor: passes}"


def step_task(title, register, state, options=OPTIONS, **fields):
    """One rollout_step task of a test playbook, its result registered as ``register``."""
    return ("    - name: %s\n      gpufleet.nvidia.rollout_step:\n        state: %s\n        report_dir: rep\n"
            "        options: %s\n" % (title, state, options)
            + "".join("        %s: %s\n" % item for item in fields.items())
            + "      register: %s\n" % register)


def admission(name, node, options=OPTIONS):
    return step_task("Install admission of %s" % node, name, "install", options, node=node, run_id="r1", poll_s=0.1)


def test_install_admission_and_release_at_a_stop(tmp_path):
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "plan.json").write_text(json.dumps({"rollout_id": "t", "nodes": NODES}))
    for node in ("g1", "c1", "w1"):
        rollout_journal.append(str(rep), {"event": "started", "node": node, "run_id": "r1", "time": 1.0,
                                          "draining": True})
    # The golden node, drained, is admitted at once; the canary and wave nodes wait for it.
    result = run_playbook(tmp_path, admission("golden", "g1")
                          + "    - name: Show\n      ansible.builtin.debug:\n"
                            "        msg: \"RESULT {{ golden | to_json }}\"\n")
    assert result["admitted"] is True and result["released"] is False
    assert result["why"] == "the golden stage of class gpu_h100 is open"
    state = rollout_journal.read(str(rep))
    assert state["g1"]["draining"] is False and state["g1"]["drained"] is False     # installing
    assert state["c1"]["draining"] is True
    # Asked again (a resumed transaction), it is admitted without a new decision.
    again = run_playbook(tmp_path, admission("golden", "g1")
                         + "    - name: Show\n      ansible.builtin.debug:\n"
                           "        msg: \"RESULT {{ golden | to_json }}\"\n")
    assert again["admitted"] is True and again["why"] == "its install was admitted before"
    # The golden node fails after its install: the stop releases the canary node untouched.
    rollout_journal.append(str(rep), {"event": "finished", "node": "g1", "status": "failed", "result": "rolled_back",
                                      "signature": "xid 79", "implicates_driver": True, "time": 2.0})
    result = run_playbook(tmp_path, admission("canary", "c1")
                          + "    - name: Released\n"
                            "      gpufleet.nvidia.rollout_step:\n"
                            "        state: released\n"
                            "        report_dir: rep\n"
                            "        node: c1\n"
                            "        run_id: r1\n"
                            "    - name: Show\n      ansible.builtin.debug:\n"
                            "        msg: \"RESULT {{ canary | to_json }}\"\n")
    assert result["admitted"] is False and result["released"] is True
    assert result["stop"]["code"] == "stage_failure"
    assert result["why"] == "the rollout stopped before its install: golden node g1 failed: xid 79"
    state = rollout_journal.read(str(rep))
    assert "c1" not in state and state["w1"]["status"] == "in_flight" and state["g1"]["status"] == "failed"
    lines = [json.loads(line) for line in (rep / "journal.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines if e["node"] == "c1"] == ["started", "drained", "released"]


def test_drain_estimates_from_squeue_order_the_waves_longest_first(tmp_path):
    names = {"w1": None, "w2": "gpu-w2", "w3": None, "g1": None}
    outputs = ["w1|10:00\ngpu-w2|3:00:00\n", "w3|UNLIMITED\n"]
    ends = rollout_step.drain_ends(outputs, names, 1000.0)
    assert ends == {"w1": 1600.0, "w2": 11800.0}
    rollout_step.write_estimates(str(tmp_path), ends)
    assert rollout_step.read_estimates(str(tmp_path)) == ends
    (tmp_path / rollout_step.ESTIMATES).write_text('{"ends": {"w1": "soon", "w2": 5.0, "w3": true}}')
    assert rollout_step.read_estimates(str(tmp_path)) == {"w2": 5.0}
    (tmp_path / rollout_step.ESTIMATES).write_text("[1, 2")
    assert rollout_step.read_estimates(str(tmp_path)) == {}
    nodes = [{"name": "g1", "stage": "golden", "class": "gpu_h100", "status": "pending"}] + [
        {"name": "w%d" % i, "stage": "waves", "class": "gpu_h100", "status": "pending"} for i in (1, 2, 3)]
    nodes = rollout_step.with_estimates(nodes, ends, 1600.0)
    assert [n.get("drain_estimate_s") for n in nodes] == [None, 0.0, 10200.0, None]
    order = [n["name"] for n in rollout_budget.start_order(nodes)]
    assert order == ["g1", "w2", "w1", "w3"]


def test_a_poll_interval_that_makes_the_free_strategy_spin_is_named_with_the_fix():
    from ansible_collections.gpufleet.nvidia.plugins.action.rollout_step import poll_interval_warning

    warning = poll_interval_warning(0.001, 16)
    assert warning.startswith("internal_poll_interval is 0.001 s: ")
    assert "16 hosts 1000 times a second" in warning and "internal_poll_interval = 0.02" in warning
    assert poll_interval_warning(0.02, 10000) is None and poll_interval_warning(0.05, 16) is None
    assert poll_interval_warning(None, 16) is None


def test_the_plans_check_of_main_covers_the_gate_which_the_steps_include_without_a_check():
    # playbooks/rollout_step.yml includes the gate with rolespec_validate false: sound only while
    # each gate option is main's, with the same type, elements and choices.
    main, gate = rollout_step.role_options("node_upgrade"), rollout_step.role_options("node_upgrade", "gate")
    assert len(gate) >= 5 and "node_upgrade_soak_s" in gate
    assert dict((name, main.get(name)) for name in gate) == gate


def test_the_nodes_values_are_checked_against_node_upgrades_argument_spec_at_the_plan():
    spec = rollout_step.role_options("node_upgrade")
    # What the inventory may set, as the role's spec declares it; no default or required of the role's.
    assert spec["node_upgrade_drain"] == {
        "type": "str", "choices": ["none", "slurm", "slurm_reboot", "kubernetes", "command"]}
    assert spec["node_upgrade_ignore_xids"] == {"type": "list", "elements": "int"}
    assert spec["node_upgrade_lock_stale_s"] == {"type": "int"}
    assert rollout_step.role_options("no_such_role") == {}
    problems = rollout_step.invalid_values({
        "node01": {"node_upgrade_drain": "slurmx", "node_upgrade_lock_stale_s": "soon"},
        # Extra vars arrive as strings: these are what Ansible takes for a bool, an int and ints.
        "node02": {"node_upgrade_lock_break": "true", "node_upgrade_trace_s": "5", "node_upgrade_ignore_xids": ["13", 79]},
        "node03": {"node_upgrade_ignore_xids": ["xid13"]},
    }, spec)
    assert len(problems) == 3, problems
    assert "node01: value of node_upgrade_drain must be one of: none, slurm, slurm_reboot, kubernetes, command, got: slurmx" \
        in problems
    assert any(p.startswith("node01: argument 'node_upgrade_lock_stale_s' is of type str") for p in problems)
    assert any(p.startswith("node03: ") and "node_upgrade_ignore_xids" in p for p in problems)


def choose(name, pass_s=0.2, squeue="g1|10:00"):
    return step_task("Choose the hosts of a pass", name, "choose", PASSES, run_id="r1", pass_s=pass_s,
                     squeue="['%s']" % squeue, slurm_names="{g1: null, c1: null, w1: null}")


def test_passes_leave_a_node_waiting_for_its_install_out_of_the_pass_that_cannot_install_it(tmp_path):
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "plan.json").write_text(json.dumps({"rollout_id": "t", "nodes": NODES}))
    show = "    - name: Show\n      ansible.builtin.debug:\n        msg: \"RESULT {{ out | to_json }}\"\n"
    # First pass: nothing in flight; the budget (3) starts all three (drain ahead).
    first = run_playbook(tmp_path, choose("first") + "    - name: Keep\n      ansible.builtin.set_fact:\n"
                         "        out: \"{{ first }}\"\n" + show)
    assert first["hosts"] == ["g1", "c1", "w1"] and first["pass"] == 1 and first["waited_s"] == 0.0
    assert first["in_flight"] == 0 and first["pending"] == []
    for node in ("g1", "c1", "w1"):
        rollout_journal.append(str(rep), {"event": "started", "node": node, "run_id": "r1", "time": 1.0,
                                          "draining": True})
    # The canary node's install may not begin before the golden node's: it is journaled waiting
    # at once (no wait in its worker).
    result = run_playbook(tmp_path, admission("canary", "c1", PASSES)
                          + "    - name: Keep\n      ansible.builtin.set_fact:\n        out: \"{{ canary }}\"\n" + show)
    assert result["admitted"] is False and result["waiting"] is True and result["released"] is False
    state = rollout_journal.read(str(rep))
    assert state["c1"]["waiting"] is True and state["c1"]["drained"] is True
    assert rollout_journal.unfinished(state, ["c1"]) == [] and rollout_journal.waiting(state, ["c1"]) == ["c1"]
    # The golden node installed and waits for the reboot Slurm runs once its job ends; the wave
    # node waits for its install too. While squeue shows the golden node's job, a pass takes no
    # host: every node waits, in no worker.
    for event in ("installing", "pending"):
        rollout_journal.append(str(rep), {"event": event, "node": "g1", "run_id": "r1", "time": 2.0})
    for event in ("drained", "waiting"):
        rollout_journal.append(str(rep), {"event": event, "node": "w1", "run_id": "r1", "time": 2.0})
    second = run_playbook(tmp_path, choose("second", 1.0) + "    - name: Keep\n      ansible.builtin.set_fact:\n"
                          "        out: \"{{ second }}\"\n" + show)
    assert second["hosts"] == [] and second["pass"] == 2 and second["in_flight"] == 3
    assert second["node_states"] == {"drained": 2, "reboot_requested": 1}
    # Its job over, the golden node is taken up (asked first whether it answers: pending).
    third = run_playbook(tmp_path, choose("third", 0.1, "") + "    - name: Keep\n      ansible.builtin.set_fact:\n"
                         "        out: \"{{ third }}\"\n" + show)
    assert third["hosts"] == ["g1"] and third["pending"] == ["g1"] and third["pass"] == 3
    found = rollout_journal.read_journal(str(rep))
    passes = rollout_journal.passes(found["events"], "r1")
    assert [p["hosts"] for p in passes] == [["g1", "c1", "w1"], [], ["g1"]]
    assert passes[1]["time"] - passes[0]["time"] >= 1.0
    assert rollout_journal.passes(found["events"], "other") == []


def test_busy_hosts_read_from_squeue_and_unknown_when_a_line_cannot_be_read():
    names = {"w1": None, "w2": "gpu-w2", "w3": None}
    # gpu-w[2-3] is gpu-w2 (host w2) and gpu-w3 (no host: w3's Slurm name is w3).
    assert rollout_step.busy_hosts(["w1|10:00\ngpu-w[2-3]|UNLIMITED\n"], names) == {"w1", "w2"}
    assert rollout_step.busy_hosts(["gpu-w2|1:00", "w3|NOT_SET"], names) == {"w2", "w3"}
    assert rollout_step.busy_hosts(["", ""], names) == set()
    # A line squeue's format does not give: which nodes it names is unknown.
    assert rollout_step.busy_hosts(["w1 10:00\n"], names) is None
    assert rollout_step.busy_hosts(["w[1-|10:00\n"], names) is None
    assert rollout_step.busy_hosts([], names) is None


def test_a_pass_waits_for_pass_s_after_the_runs_last_pass(tmp_path):
    slept = []

    def events():
        return rollout_journal.read_journal(str(tmp_path))["events"]

    assert rollout_step.pace(events(), "r1", 60.0, 1000.0, slept.append) == (0.0, 1)
    rollout_journal.append(str(tmp_path), {"event": "pass", "run_id": "r1", "pass": 1, "time": 990.0,
                                           "hosts": [], "states": {}})
    rollout_journal.append(str(tmp_path), {"event": "pass", "run_id": "r0", "pass": 7, "time": 999.0,
                                           "hosts": [], "states": {}})
    assert rollout_step.pace(events(), "r1", 60.0, 1000.0, slept.append) == (50.0, 2)
    assert slept == [50.0]
    assert rollout_step.pace(events(), "r1", 60.0, 1100.0, slept.append) == (0.0, 2)
    # A pass stamped in the future (a clock set back) never waits longer than pass_s.
    assert rollout_step.pace(events(), "r1", 5.0, 0.0, slept.append) == (5.0, 2)


def test_pass_settings_read_text_and_name_a_bad_value():
    assert rollout_step.pass_settings("5", "12") == (5.0, 12, [])
    assert rollout_step.pass_settings(60, 60) == (60.0, 60, [])
    seconds, count, problems = rollout_step.pass_settings("0", "61")
    assert (seconds, count) == (None, None)
    assert problems == ["rollout_pass_s must be more than 0 and at most 86400 seconds, got '0'",
                        "rollout_passes must be a whole number from 1 to 60 (the passes rollout.yml holds), got '61'"]
    assert rollout_step.pass_settings("nan", "1.5")[2][0].endswith("got 'nan'")
    assert rollout_step.pass_settings(True, True)[:2] == (None, None)


def test_a_node_whose_jobs_run_waits_in_the_journal_until_its_drain_is_out_of_time(tmp_path):
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "plan.json").write_text(json.dumps({"rollout_id": "t", "nodes": NODES}))
    now = time.time()
    rollout_journal.append(str(rep), {"event": "started", "node": "g1", "run_id": "r1", "time": now - 100.0})
    rollout_journal.append(str(rep), {"event": "started", "node": "c1", "run_id": "r1", "time": now - 4000.0})
    tasks = (step_task("Drain of g1", "g1", "waiting", PASSES, node="g1", run_id="r1", timeout_s=3600)
             + step_task("Drain of c1", "c1", "waiting", PASSES, node="c1", run_id="r1", timeout_s=3600)
             + "    - name: Show\n      ansible.builtin.debug:\n"
               "        msg: \"RESULT {{ {'g1': g1, 'c1': c1} | to_json }}\"\n")
    result = run_playbook(tmp_path, tasks)
    # g1 started 100 s ago: its drain has an hour from its start; it waits, journaled.
    assert result["g1"]["waiting"] is True and result["g1"]["timed_out"] is False
    assert abs(result["g1"]["until"] - (now + 3500.0)) < 1.0
    # c1 started 4000 s ago: out of time, not journaled waiting (its transaction fails the drain).
    assert result["c1"]["waiting"] is False and result["c1"]["timed_out"] is True
    assert result["c1"]["why"] == "its jobs did not end within 3600 s of its drain"
    state = rollout_journal.read(str(rep))
    assert state["g1"]["waiting_for"] == "drain" and state["g1"]["draining"] is True
    assert "waiting" not in state["c1"]
    # The rollout stopped: no wait, the install admission releases the node.
    rollout_journal.append(str(rep), {"event": "finished", "node": "w1", "status": "failed", "result": "rolled_back",
                                      "signature": "xid 79", "implicates_driver": True, "time": now})
    rollout_journal.append(str(rep), {"event": "finished", "node": "c1", "status": "failed", "result": "rolled_back",
                                      "signature": "xid 79", "implicates_driver": True, "time": now})
    rollout_journal.append(str(rep), {"event": "resumed", "node": "g1", "run_id": "r1", "time": now})
    stopped = run_playbook(tmp_path, step_task("Drain of g1", "g1", "waiting", PASSES, node="g1", run_id="r1",
                                               timeout_s=3600)
                           + "    - name: Show\n      ansible.builtin.debug:\n        msg: \"RESULT {{ g1 | to_json }}\"\n")
    assert stopped["waiting"] is False and stopped["timed_out"] is False
    assert stopped["stop"]["code"] == "stage_failure" and stopped["stop"]["nodes"] == ["c1"], stopped["stop"]
    assert "waiting" not in rollout_journal.read(str(rep))["g1"]
