# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout within budgets on a fleet of 16 (playbooks/rollout.yml, plugin_utils.rollout_budget).

Sixteen nodes (8 H100, 4 A100, 4 L40S), every node first on the baseline 580.126.20. Then:

* a rollout to ``driver_branch: ltsb`` with at most 2 nodes of a class out of service at once:
  node09 (a wave H100) loses a GPU at its reboot, node05's drain waits 60 s for a "job". The
  canary node02 drains beside the golden node01 and installs only once node01 has passed. The
  journal is sampled during the run: no class ever has more than 2 nodes in a transaction or
  quarantined. The controller is killed while node05 still drains and started again: nothing is
  started twice and node05 resumes. node09 is quarantined (back on its last known-good driver,
  drained and flagged) and the rollout completes on the other 15; the H100 wave nodes after
  node05 finished while it was still draining.
* a second rollout on the H100 class to 620.70.06: two wave nodes lose a GPU at their reboot, the
  same signature (Xid 79) twice early on: "driver implicated", the rollout stops and the last two
  wave nodes are not touched.
* a third rollout whose golden node01 loses a GPU while the canary node02 and two wave nodes,
  drained ahead (a budget of 4), wait for their install admission: the stop releases them, back
  in service, untouched, with no record.
"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from test_rollout_fleet import BASELINE, INVENTORY_VARS, assert_on, rollout_fleet, wait_for

pytestmark = pytest.mark.fleet

LAYOUT = "h100,h100,a100,l40s,h100,a100,l40s,h100,h100,a100,l40s,h100,h100,a100,l40s,h100"
H100 = ["node01", "node02", "node05", "node08", "node09", "node12", "node13", "node16"]
SLOW = "node05"
LOST = "node09"

INVENTORY = INVENTORY_VARS + """\
  children:
    gpufleet_golden:
      hosts:
        node01:
        node03:
        node04:
    gpufleet_canary:
      hosts:
        node02:
    slow_drain:
      hosts:
        %(slow)s:
      vars:
        node_upgrade_drain_command: [sh, -c, "sleep 60; touch %(dir)s/drained/{{ inventory_hostname }}"]
"""


@pytest.fixture(scope="module")
def scale(tmp_path_factory):
    yield from rollout_fleet(tmp_path_factory, "rollout-scale", "24600-24699", LAYOUT,
                             inventory=INVENTORY.replace("%(slow)s", SLOW), reboot_timeout_s=180)


def journal(rollouts, rollout_id):
    path = os.path.join(rollouts.report_dir(rollout_id), "journal.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.endswith("\n")]


def out_of_service(events, classes):
    """Per class: nodes in flight or quarantined, from the journal's events."""
    state = {}
    for event in events:
        if event["event"] == "started":
            state[event["node"]] = "in_flight"
        elif event["event"] == "finished":
            state[event["node"]] = event["status"]
    counts = {}
    for node, status in state.items():
        if status in ("in_flight", "failed"):
            counts[classes[node]] = counts.get(classes[node], 0) + 1
    return counts


def test_budget_quarantine_kill_and_slow_drain(scale):
    rollouts = scale
    classes = rollouts.fleet.classes
    rollouts.fleet.fault(LOST, "gpu_lost", gpu="2")
    samples = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append(out_of_service(journal(rollouts, "scale"), classes))
            time.sleep(0.5)

    sampler = threading.Thread(target=sample)
    sampler.start()
    extra = ("-e", "rollout_max_unavailable=2", "-f", "16")
    try:
        proc, log = rollouts.rollout("scale", "all", *extra, start=True)
        # Kill the controller once the waves run and the slow node still drains.
        wait_for(lambda: any(e["event"] == "started" and e["node"] == SLOW for e in journal(rollouts, "scale")), 1500,
                 "%s to start" % SLOW)
        time.sleep(5)
        assert not rollouts.drained(SLOW)       # its drain waits 60 s
        rollouts.kill(proc)
        first = dict((e["node"], e) for e in journal(rollouts, "scale") if e["event"] == "finished")
        assert SLOW not in first, open(log).read()[-3000:]
        code, out = rollouts.rollout("scale", "all", *extra)
    finally:
        stop.set()
        sampler.join()
    assert code in (0, 2), out[-4000:]   # 2 when the quarantined node failed in this run
    events = journal(rollouts, "scale")
    started = {}
    for event in events:
        if event["event"] == "started":
            started[event["node"]] = started.get(event["node"], 0) + 1
    # Every node started exactly once, across both controllers.
    assert sorted(started) == sorted(rollouts.fleet.nodes) and set(started.values()) == {1}, started
    # The budget held throughout: never more than 2 nodes of a class in a transaction or quarantined.
    assert samples and max(max(s.values() or [0]) for s in samples) <= 2, samples
    assert any(max(s.values() or [0]) == 2 for s in samples)
    report = rollouts.report("scale")
    assert report["status"] == "completed", report["stop_reason"]
    assert [q["node"] for q in report["quarantined"]] == [LOST]
    assert report["summary"]["upgraded"] == 15
    record = rollouts.record("scale", LOST)
    assert record["result"] in ("rolled_back", "flagged") and rollouts.drained(LOST)
    assert rollouts.flag(LOST)["rollout_id"] == "scale"
    assert rollouts.loaded(LOST) == BASELINE
    for node in rollouts.fleet.nodes:
        if node != LOST:
            assert_on(rollouts, node, "620.82.01")
            assert not rollouts.drained(node), node
    # Two admissions (drain_ahead): the canary node02 was drained while the golden node01 was in
    # its transaction, and its install was admitted only once node01 had passed.
    first_time = {}
    for event in events:
        if "node" in event:
            first_time.setdefault((event["event"], event["node"]), event["time"])
    assert first_time[("started", "node02")] < first_time[("finished", "node01")] \
        < first_time[("installing", "node02")], first_time
    assert ("drained", "node02") in first_time
    # The slow drain held only its own slot: H100 wave nodes after it started while it was still in
    # its transaction (drained ahead, its 60 s drain also overlapped the canary's wait).
    finished = dict((e["node"], e["time"]) for e in events if e["event"] == "finished")
    begun = dict((e["node"], e["time"]) for e in events if e["event"] == "started")
    later = [n for n in H100[H100.index(SLOW) + 1:] if n != LOST]
    assert [n for n in later if begun[n] < finished[SLOW]], (begun, finished, later)
    assert first_time[("started", SLOW)] < first_time[("finished", "node02")], first_time
    markdown = open(os.path.join(rollouts.report_dir("scale"), "rollout-report.md")).read()
    assert "Quarantined (drained and flagged, out of service until cleared):" in markdown
    assert "- %s (waves): " % LOST in markdown


def test_two_failures_with_one_signature_stop_the_rollout(scale):
    rollouts = scale
    rollouts.fleet.fault(LOST, "clear")
    first_two, last_two = ["node08", "node12"], ["node13", "node16"]
    for node in first_two:
        rollouts.fleet.fault(node, "gpu_lost", gpu="1")
    untouched = dict((node, rollouts.state(node)) for node in last_two)
    hosts = ":".join(["node01", "node02"] + first_two + last_two)
    code, out = rollouts.rollout("bad", hosts, "-e", "driver_version=620.70.06", "-e", "rollout_max_unavailable=2",
                                 "-e", "rollout_window_initial=2", "-f", "8")
    assert code == 2, out[-4000:]
    report = rollouts.report("bad")
    assert report["status"] == "stopped"
    assert report["stop_reason"].startswith("driver implicated: 2 nodes failed with xid 79 after the install "
                                            "of 620.70.06"), report["stop_reason"]
    assert sorted(s["node"] for s in report["stopped_by"]) == first_two
    for node in last_two:
        assert rollouts.record("bad", node) is None
        assert rollouts.state(node) == untouched[node]
    assert "Status: **stopped**: driver implicated" in open(
        os.path.join(rollouts.report_dir("bad"), "rollout-report.md")).read()


def test_a_stop_releases_the_nodes_drained_ahead_untouched(scale):
    """Golden node01 loses a GPU at its reboot while the canary node02 and the wave nodes node13 and
    node16 (a budget of 4: all four at once) wait, drained, for their install admission."""
    rollouts = scale
    rollouts.fleet.fault("node01", "gpu_lost", gpu="0")
    waiting = ["node02", "node13", "node16"]
    before = dict((node, rollouts.state(node)) for node in waiting)
    code, out = rollouts.rollout("release", "node01:node02:node13:node16", "-e", "driver_version=580.126.20",
                                 "-e", "rollout_max_unavailable=4", "-f", "8")
    assert code == 2, out[-4000:]
    report = rollouts.report("release")
    assert report["status"] == "stopped" and report["stop_reason"].startswith("golden node node01 failed"), \
        report["stop_reason"]
    assert report["summary"]["not_started"] == 3, report["summary"]
    events = journal(rollouts, "release")
    for node in waiting:
        kinds = [e["event"] for e in events if e.get("node") == node]
        # Drained ahead while the golden node was in its transaction, released at the stop.
        assert kinds == ["started", "drained", "released"], (node, kinds)
        assert rollouts.record("release", node) is None
        assert rollouts.state(node) == before[node], node
        assert not rollouts.drained(node)
    assert rollouts.record("release", "node01")["result"] in ("rolled_back", "flagged")
