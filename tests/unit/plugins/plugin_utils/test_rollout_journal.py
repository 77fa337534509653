# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout journal and the choice of a step's hosts (plugin_utils.rollout_journal, action.rollout_step)."""

from __future__ import annotations

import json
import os

from ansible_collections.gpufleet.nvidia.plugins.action import rollout_step
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_budget, rollout_journal


def test_fold_resumes_in_flight_and_skips_a_cut_line(tmp_path):
    directory = str(tmp_path)
    rollout_journal.append(directory, {"event": "started", "node": "n1", "run_id": "r1", "time": 1.0})
    rollout_journal.append(directory, {"event": "started", "node": "n2", "run_id": "r1", "time": 2.0})
    rollout_journal.append(directory, {"event": "held", "node": "n2", "time": 3.0})
    rollout_journal.append(directory, {"event": "finished", "node": "n1", "status": "failed", "result": "rolled_back",
                                       "signature": "xid 79", "implicates_driver": True, "time": 4.0})
    with open(os.path.join(directory, "journal.jsonl"), "a") as handle:
        handle.write('{"event": "started", "node": "n3"')   # a writer killed mid-line
    state = rollout_journal.read(directory)
    assert state["n1"]["status"] == "failed" and state["n1"]["signature"] == "xid 79"
    assert state["n1"]["finished_at"] == 4.0
    assert state["n2"]["status"] == "in_flight"
    # The cut line named n3: whether it started is unknown, so it is in flight and flagged.
    assert state["n3"]["status"] == "in_flight"
    assert state["n3"]["ambiguous"].startswith("unreadable: journal.jsonl:5: cut short at the end of the file")
    # The next event is a line of its own: the cut line is ended first, and only it is lost.
    rollout_journal.append(directory, {"event": "finished", "node": "n2", "status": "done", "time": 5.0})
    read = rollout_journal.read_journal(directory)
    assert read["nodes"]["n2"]["status"] == "done" and read["nodes"]["n2"]["finished_at"] == 5.0
    assert [entry["line"] for entry in read["lost"]] == [5] and read["cut_tail"] is False
    assert rollout_journal.lost_summary(read["lost"]).startswith(
        "1 line of journal.jsonl cannot be read (line 5): unreadable: journal.jsonl:5: not JSON")
    assert rollout_journal.status_of("skipped") == "done" and rollout_journal.status_of("flagged") == "failed"


def test_a_drain_in_the_journal_sets_draining_in_the_fleet_state(tmp_path):
    directory = str(tmp_path)
    plan = {"nodes": [{"name": "g", "stage": "golden", "class": "gpu_h100"},
                      {"name": "c1", "stage": "canary", "class": "gpu_h100"},
                      {"name": "c2", "stage": "canary", "class": "gpu_h100"}]
            + [{"name": "w%d" % i, "stage": "waves", "class": "gpu_h100"} for i in range(20)]}
    for event in ({"event": "started", "node": "g"}, {"event": "finished", "node": "g", "status": "done"},
                  {"event": "started", "node": "c1"}, {"event": "draining", "node": "c1"},
                  {"event": "started", "node": "c2"}, {"event": "draining", "node": "c2"},
                  {"event": "drained", "node": "c2"}, {"event": "finished", "node": "c2", "status": "done"},
                  {"event": "draining", "node": "w0"}):
        rollout_journal.append(directory, event)
    state = rollout_journal.read(directory)
    assert state["c1"]["draining"] is True and "draining" not in state["c2"]
    assert "status" not in state["w0"]     # a drain event of a node no step started says nothing
    nodes = rollout_journal.fleet_state(plan, state)
    # The canary still waiting for its drain holds no stage open: the waves open.
    assert rollout_budget.stage_gates(nodes) == {"gpu_h100": "waves"}
    rollout_journal.append(directory, {"event": "drained", "node": "c1"})
    nodes = rollout_journal.fleet_state(plan, rollout_journal.read(directory))
    assert nodes[1]["draining"] is False
    assert rollout_budget.stage_gates(nodes) == {"gpu_h100": "canary"}


def test_plan_nodes_and_choice_resume_first(tmp_path):
    groups = {"all": ["g", "c", "w1", "w2", "w3", "x1"], "gpu_h100": ["g", "c", "w1", "w2", "w3"],
              "gpu_a100": ["x1"], "rack_1": ["w1", "x1"]}
    nodes = rollout_step.plan_nodes({"golden": ["g"], "canary": ["c"], "waves": ["w1", "w2", "w3", "x1"]},
                                    groups, "gpu_", "rack_")
    assert [(n["name"], n["stage"], n["class"], n["domain"]) for n in nodes] == [
        ("g", "golden", "gpu_h100", None), ("c", "canary", "gpu_h100", None), ("w1", "waves", "gpu_h100", "rack_1"),
        ("w2", "waves", "gpu_h100", None), ("w3", "waves", "gpu_h100", None), ("x1", "waves", "gpu_a100", "rack_1")]
    plan = {"nodes": nodes}
    journal = {"g": {"status": "done", "changed": True}, "c": {"status": "in_flight"}}
    state = rollout_journal.fleet_state(plan, journal)
    one = rollout_budget.normalize_options({"drain_ahead": False})
    decision, hosts = rollout_step.choose_hosts(state, one, 4)
    # The canary in flight resumes; the H100 waves wait for it, and so does x1: its class has no
    # canary of its own and follows the fleet's. They join the step and wait there for their slot.
    assert hosts == ["c", "x1", "w1", "w2"]
    assert decision["action"] == "wait" and decision["stages"] == {"gpu_h100": "canary", "gpu_a100": "canary"}
    # Draining ahead (the default), x1 may drain now: its class's budget has room, and its install
    # waits for the waves.
    decision, hosts = rollout_step.choose_hosts(state, rollout_budget.normalize_options({}), 4)
    assert decision["start"] == ["x1"] and decision["install"] == [] and hosts == ["c", "x1", "w1", "w2"]
    journal["c"] = {"status": "done", "changed": True}
    decision, hosts = rollout_step.choose_hosts(rollout_journal.fleet_state(plan, journal), one, 4)
    # One H100 slot now (10 % of 5, at least 1), and the step takes the next H100 wave nodes to fill
    # the slots that free up while it runs.
    assert decision["start"] == ["w1", "x1"] and hosts == ["w1", "x1", "w2", "w3"]


def test_unknown_variables_name_the_closest():
    known = ["driver_branch", "node_upgrade_drain", "rollout_max_unavailable"]
    found = rollout_step.unknown_variables(
        ["driver_brnach", "node_upgrade_drian", "rollout_serail", "driver_branch", "ansible_host", "my_var"], known)
    assert found == [("driver_brnach", "driver_branch"), ("node_upgrade_drian", "node_upgrade_drain"),
                     ("rollout_serail", None)]


def test_known_variables_cover_the_roles_and_playbooks():
    names = rollout_step.known_variables()
    for name in ("driver_branch", "node_upgrade_drain_timeout_s", "kernel_hold_packages_extra", "rollout_max_unavailable",
                 "rollout_hosts", "drift_source", "gpu_policy_power_limit_w"):
        assert name in names, name
    assert json.dumps(sorted(names))


def test_unfinished_nodes_are_those_still_in_flight(tmp_path):
    directory = str(tmp_path)
    for node in ("a", "b", "c"):
        rollout_journal.append(directory, {"event": "started", "node": node, "run_id": "r1", "time": 1.0})
    rollout_journal.append(directory, {"event": "finished", "node": "a", "status": "done", "result": "upgraded"})
    rollout_journal.append(directory, {"event": "held", "node": "c", "time": 2.0})
    journal = rollout_journal.read(directory)
    assert rollout_journal.unfinished(journal, ["a", "b", "c", "d"]) == ["b", "c"]


def _rollout_dir(parent, rollout_id, nodes, runs, events):
    directory = os.path.join(str(parent), rollout_id)
    os.makedirs(directory)
    with open(os.path.join(directory, "plan.json"), "w") as handle:
        json.dump({"rollout_id": rollout_id, "nodes": [{"name": n} for n in nodes], "runs": runs}, handle)
    for event in events:
        rollout_journal.append(directory, event)
    return directory


def test_concurrent_rollouts_on_the_same_nodes_are_found(tmp_path):
    now = os.stat(str(tmp_path)).st_mtime + 10
    live = {"ctl-10-5": True, "ctl-11-5": False}
    _rollout_dir(tmp_path, "driver-620", ["n1", "n2"], ["ctl-10-5"],
                 [{"event": "started", "node": "n2", "run_id": "ctl-10-5", "time": 1.0}])
    _rollout_dir(tmp_path, "killed", ["n1"], ["ctl-11-5"],
                 [{"event": "started", "node": "n1", "run_id": "ctl-11-5", "time": 1.0}])
    _rollout_dir(tmp_path, "elsewhere", ["n3"], ["other-1-1"],
                 [{"event": "started", "node": "n3", "run_id": "other-1-1", "time": 1.0}])
    _rollout_dir(tmp_path, "remote", ["n1"], ["other-2-2"], [])
    found = rollout_journal.concurrent_rollouts(str(tmp_path), "driver-ltsb", ["n1", "n2"], now, 3600,
                                                live.get)
    # driver-620: its run on this controller is alive; killed: its run is gone (it resumes by
    # itself); elsewhere: other nodes; remote: another controller's, written 10 s ago.
    assert [(f["rollout_id"], f["overlap"], f["run_id"]) for f in found] == [
        ("driver-620", ["n1", "n2"], "ctl-10-5"), ("remote", ["n1"], "other-2-2")]
    assert found[0]["in_flight"] == ["n2"]
    # The same rollout id resumes itself; another controller's rollout is stale after stale_s.
    assert rollout_journal.concurrent_rollouts(str(tmp_path), "driver-620", ["n1"], now + 7200, 3600,
                                               live.get) == []


def test_a_node_pending_its_slurm_reboot_stays_in_flight_and_is_not_unfinished(tmp_path):
    directory = str(tmp_path)
    for node in ("a", "b"):
        rollout_journal.append(directory, {"event": "started", "node": node, "run_id": "r1", "time": 1.0})
        rollout_journal.append(directory, {"event": "pending", "node": node, "run_id": "r1", "time": 2.0})
    journal = rollout_journal.read(directory)
    assert journal["a"]["status"] == "in_flight" and journal["a"]["pending"] is True
    assert rollout_journal.unfinished(journal, ["a", "b"]) == []
    assert rollout_journal.pending(journal, ["a", "b"]) == ["a", "b"]
    # A later step takes a up again: cut off from then on, it is unfinished; b ends verified.
    rollout_journal.append(directory, {"event": "resumed", "node": "a", "run_id": "r2", "time": 3.0})
    rollout_journal.append(directory, {"event": "finished", "node": "b", "status": "done", "result": "upgraded"})
    journal = rollout_journal.read(directory)
    assert rollout_journal.unfinished(journal, ["a", "b"]) == ["a"]
    assert rollout_journal.pending(journal, ["a", "b"]) == []
    assert journal["b"]["status"] == "done" and "pending" not in journal["b"]
    # A pending node holds its slot: the class's only slot is taken.
    plan = {"nodes": [{"name": "a", "stage": "waves", "class": "gpu_h100", "domain": None},
                      {"name": "c", "stage": "waves", "class": "gpu_h100", "domain": None}]}
    rollout_journal.append(directory, {"event": "pending", "node": "a", "run_id": "r2", "time": 4.0})
    nodes = rollout_journal.fleet_state(plan, rollout_journal.read(directory))
    decision = rollout_budget.decide(nodes, rollout_budget.normalize_options({"max_unavailable": "1"}))
    assert decision["start"] == [] and decision["in_flight"] == 1 and decision["action"] == "wait", decision


def test_a_pending_record_is_journalled_as_pending():
    from ansible_collections.gpufleet.nvidia.plugins.action.rollout_report import _journal_event

    event = _journal_event({"node": "n1", "result": "pending", "run_id": "r1"}, False, 5.0)
    assert event == {"event": "pending", "node": "n1", "run_id": "r1", "time": 5.0}


def test_drain_and_install_events_and_release():
    lines = [json.dumps(e) for e in (
        {"event": "started", "node": "a", "run_id": "r1", "time": 1.0, "draining": True},
        {"event": "started", "node": "b", "run_id": "r1", "time": 1.0, "draining": True},
        {"event": "started", "node": "c", "run_id": "r1", "time": 1.0},               # an older run: no drain word
        {"event": "drained", "node": "a", "time": 2.0},
        {"event": "drained", "node": "b", "time": 2.0},
        {"event": "installing", "node": "b", "time": 3.0},
        {"event": "released", "node": "a", "time": 4.0, "run_id": "r1"},
        {"event": "drained", "node": "d", "time": 4.0},                                # never started: ignored
    )]
    state = rollout_journal.fold_lines(lines)
    assert "a" not in state and "status" not in state.get("d", {})
    assert rollout_budget.phase(dict(state["b"], status="in_flight")) == "installing"
    assert rollout_budget.phase(state["c"]) == "installing"
    plan = {"nodes": [{"name": n, "stage": "waves", "class": "gpu_h100", "domain": None} for n in "abc"]}
    nodes = rollout_journal.fleet_state(plan, state)
    assert [(n["name"], n["status"], rollout_budget.phase(n)) for n in nodes] == [
        ("a", "pending", None), ("b", "in_flight", "installing"), ("c", "in_flight", "installing")]
    # Released, then started again by a later run: in flight and draining once more.
    again = rollout_journal.fold_lines(lines + [json.dumps({"event": "started", "node": "a", "run_id": "r2",
                                                            "time": 5.0, "draining": True})])
    assert again["a"]["status"] == "in_flight" and rollout_budget.phase(again["a"]) == "draining"


def test_a_node_left_waiting_by_a_pass_stays_in_flight_until_its_install_or_a_resume():
    events = list(enumerate([
        {"event": "started", "node": "n1", "run_id": "r1", "time": 1.0, "draining": True},
        {"event": "drained", "node": "n1", "time": 2.0},
        {"event": "waiting", "node": "n1", "run_id": "r1", "time": 3.0},
        {"event": "pass", "run_id": "r1", "pass": 4, "time": 4.0, "hosts": [], "states": {"drained": 1}},
        {"event": "waiting", "node": "n2", "time": 4.5},            # never started: no state from it
    ], 1))
    state = rollout_journal.fold(events)
    assert state["n1"] == {"status": "in_flight", "started_at": 1.0, "run_id": "r1", "draining": False,
                           "drained": True, "waiting": True, "waiting_for": "install"}
    assert "status" not in state["n2"]
    assert rollout_journal.unfinished(state, ["n1"]) == [] and rollout_journal.waiting(state, ["n1", "n2"]) == ["n1"]
    assert rollout_journal.passes(events) == [{"pass": 4, "run_id": "r1", "time": 4.0, "hosts": [],
                                               "states": {"drained": 1}}]
    resumed = rollout_journal.fold(events + [(6, {"event": "resumed", "node": "n1", "time": 5.0})])
    assert "waiting" not in resumed["n1"] and rollout_journal.unfinished(resumed, ["n1"]) == ["n1"]
    installing = rollout_journal.fold(events + [(6, {"event": "installing", "node": "n1", "time": 5.0})])
    assert "waiting" not in installing["n1"] and installing["n1"]["drained"] is False
    assert "waiting_for" not in resumed["n1"] and "waiting_for" not in installing["n1"]
    # A pass event whose fields are not of their types is left out, never guessed.
    bad = [(1, {"event": "pass", "time": "soon", "hosts": [], "states": {}}),
           (2, {"event": "pass", "time": 1.0, "hosts": "n1", "states": {}}),
           (3, {"event": "pass", "time": True, "hosts": [], "states": {}})]
    assert rollout_journal.passes(bad) == []


def test_a_node_left_waiting_for_its_drain_is_draining_until_a_resume():
    events = list(enumerate([
        {"event": "started", "node": "n1", "run_id": "r1", "time": 1.0},
        {"event": "waiting", "for": "drain", "until": 3601.0, "node": "n1", "run_id": "r1", "time": 2.0},
        {"event": "started", "node": "n2", "run_id": "r1", "time": 1.0},
        {"event": "waiting", "for": "drain", "until": "later", "node": "n2", "run_id": "r1", "time": 2.0},
    ], 1))
    state = rollout_journal.fold(events)
    assert state["n1"] == {"status": "in_flight", "started_at": 1.0, "run_id": "r1", "draining": True,
                           "drained": False, "waiting": True, "waiting_for": "drain", "waiting_until": 3601.0}
    # An until that is not a number is not taken for one: the drain has no end the pass can see.
    assert "waiting_until" not in state["n2"] and state["n2"]["waiting_for"] == "drain"
    assert rollout_journal.unfinished(state, ["n1", "n2"]) == [] and rollout_journal.waiting(state, ["n1"]) == ["n1"]
    plan = {"nodes": [{"name": "n1", "stage": "waves", "class": "gpu_a", "domain": None}]}
    row = rollout_journal.fleet_state(plan, state)[0]
    assert (row["waiting_for"], row["waiting_until"], row["draining"]) == ("drain", 3601.0, True)
    resumed = rollout_journal.fold(events + [(5, {"event": "resumed", "node": "n1", "time": 5.0})])
    assert not set(resumed["n1"]) & {"waiting", "waiting_for", "waiting_until"}
    assert resumed["n1"]["draining"] is True and rollout_journal.unfinished(resumed, ["n1"]) == ["n1"]
