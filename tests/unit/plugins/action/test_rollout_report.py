# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout report: records, merge on re-run, roll-up, Markdown, and the rollout_report action."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import threading

import pytest

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_run import pid_alive, process_start_ticks
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_budget, rollout_journal
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_report as rr

PLAN = {"rollout_id": "driver-ltsb", "stages": [
    {"name": "golden", "hosts": ["h1"]},
    {"name": "canary", "hosts": ["a1"]},
    {"name": "waves", "hosts": ["l1", "v1", "h2"]},
]}


def record(node, stage, result, run="r1", before="580.126.20", after="620.82.01", target="620.82.01", **extra):
    out = {"node": node, "stage": stage, "result": result, "run_id": run, "rollout_id": "driver-ltsb",
           "reason": extra.pop("reason", ""), "before": {"loaded": before}, "after": {"loaded": after},
           "target": {"version": target, "note": extra.pop("note", None)},
           "durations": {"total_s": extra.pop("total_s", 60.0)}, "started_epoch": 100.0, "finished_epoch": 160.0}
    out.update(extra)
    return out


def test_durations_from_marks():
    marks = {"started": 100.0, "drained": 103.5, "snapshot": 105.0, "installed": 140.25, "rebooted": 150.0,
             "verified": 158.0, "undrained": 159.0, "finished": 160.0}
    assert rr.durations_from_marks(marks) == {"preflight_drain_s": 3.5, "snapshot_s": 1.5, "install_s": 35.2,
                                              "reboot_s": 9.8, "verify_s": 8.0, "finish_s": 1.0,
                                              "rollback_s": None, "total_s": 60.0}
    failed = rr.durations_from_marks({"started": 0, "failed": 50.0, "recovered": 95.5, "finished": 96})
    assert failed["rollback_s"] == 45.5 and failed["verify_s"] is None


def test_merge_keeps_the_upgrade_when_a_rerun_skips_the_node():
    old = record("h1", "golden", "upgraded", run="r1")
    new = record("h1", "golden", "skipped", run="r2", before="620.82.01", finished_at="t2")
    kept = rr.merge_record(old, new)
    assert kept["result"] == "upgraded" and kept["run_id"] == "r1"
    assert kept["confirmed_by_run"] == "r2" and kept["confirmed_at"] == "t2"
    # A new failure replaces the record and keeps the old attempt.
    failed = rr.merge_record(old, record("h1", "golden", "rolled_back", run="r2"))
    assert failed["result"] == "rolled_back"
    assert failed["previous_attempt"]["result"] == "upgraded"
    # A skip for another target is a new fact.
    other = rr.merge_record(old, record("h1", "golden", "skipped", run="r2", target="620.70.06"))
    assert other["result"] == "skipped"


def test_resolution_note_for_volta_and_none_for_the_newest():
    note = rr.resolution_note({"branch": "580", "architectures": ["volta"], "requested": {"branch": "ltsb"}})
    assert note == "ltsb resolves to R580 for Volta: R620, the newest LTSB, does not support Volta"
    assert rr.resolution_note({"branch": "620", "architectures": ["hopper"], "requested": {"branch": "ltsb"}}) is None
    assert rr.resolution_note({"branch": "580", "architectures": ["hopper"], "requested": {"branch": "580"}}) is None


def test_report_status_stopped_completed_in_progress():
    stopped = rr.build_report(PLAN, {
        "h1": record("h1", "golden", "upgraded"),
        "a1": record("a1", "canary", "rolled_back", reason="GPU count changed: 8 before, 7 after", after="580.126.20"),
    })
    assert stopped["status"] == "stopped"
    assert [dict(entry, next_step=None) for entry in stopped["stopped_by"]] == [
        {"node": "a1", "stage": "canary", "result": "rolled_back", "outcome": "rolled_back",
         "reason": "GPU count changed: 8 before, 7 after", "next_step": None}]
    assert (stopped["summary"]["upgraded"], stopped["summary"]["rolled_back"], stopped["summary"]["not_started"],
            stopped["summary"]["nodes"]) == (1, 1, 3, 5)
    assert [s["ran"] for s in stopped["stages"]] == [True, True, False]
    assert [n["result"] for n in stopped["nodes"]] == ["upgraded", "rolled_back", "not_started", "not_started",
                                                       "not_started"]
    done = rr.build_report(PLAN, dict((n, record(n, "x", "upgraded")) for n in ("h1", "a1", "l1", "v1", "h2")))
    assert done["status"] == "completed" and done["summary"]["upgraded"] == 5 and done["wall_s"] == 60.0
    assert rr.build_report(PLAN, {"h1": record("h1", "golden", "upgraded")})["status"] == "in_progress"


def test_a_node_rolled_back_and_still_flagged_is_one_outcome_and_gets_its_next_step():
    """The demo's node06: Xid 79 after the rollback reboot, one GPU lost, left flagged."""
    node06 = record("a1", "canary", "flagged", after="580.126.20",
                    reason="GPU count changed: 8 before, 7 after (gone: GPU 0000:4e:00.0 (serial 1654922000403))",
                    flags=["gpu_count_changed", "new_fatal_xid"], new_fatal_xids={"79": 1},
                    rollback={"version": "580.126.20", "ok": False})
    report = rr.build_report(PLAN, {"h1": record("h1", "golden", "upgraded"), "a1": node06})
    summary = report["summary"]
    assert (summary["rolled_back_flagged"], summary["flagged"], summary["rolled_back"], summary["nodes"]) == (1, 0, 0, 5)
    assert [n["outcome"] for n in report["nodes"]] == ["upgraded", "rolled_back_flagged", "not_started", "not_started",
                                                       "not_started"]
    assert report["stages"][1]["counts"]["rolled_back_flagged"] == 1 and report["stages"][1]["counts"]["flagged"] == 0
    step = report["nodes"][1]["next_step"]
    # No GPU list in this record: the catalog's action for Xid 79 (reboot), escalated, as the node rebooted.
    assert step["action"] == "hardware_inspection"
    assert step["do"].startswith("reseat the GPU the reason names and check its power and riser, or RMA it")
    assert "Xid 79 (GPU has fallen off the bus; NVIDIA: RESTART_BM); still there after the node's reboot" in step["do"]
    assert step["command"] == "ansible-playbook gpufleet.nvidia.rollback -i <inventory> -e rollback_hosts=a1"
    assert step["resume"] == "ansible-playbook gpufleet.nvidia.rollout -i <inventory> -e rollout_id=driver-ltsb"
    assert report["nodes"][0]["next_step"] is None
    text = rr.render_markdown(report)
    assert ("5 nodes: 1 upgraded, 0 already on target, 0 rolled back, 1 rolled back and still flagged, 0 flagged, "
            "0 refused, 3 not started.") in text
    assert "- a1 (canary): flagged: GPU count changed" not in text  # no decision: no quarantine list
    # A verified rollback is a rolled_back result, with the driver as the place to look.
    back = rr.build_report(PLAN, {"a1": record("a1", "canary", "rolled_back", flags=["version_not_loaded"],
                                               rollback={"version": "580.126.20", "ok": True})})
    assert (back["summary"]["rolled_back"], back["summary"]["rolled_back_flagged"]) == (1, 0)
    assert back["nodes"][1]["next_step"]["do"].startswith("the node is back on 580.126.20, verified, drained and flagged")


def test_markdown_rows_and_notes():
    report = rr.build_report(PLAN, {
        "h1": record("h1", "golden", "upgraded", total_s=119.4),
        "v1": record("v1", "waves", "upgraded", after="580.178.04", target="580.178.04",
                     note="ltsb resolves to R580 for Volta: R620, the newest LTSB, does not support Volta"),
        "a1": record("a1", "canary", "flagged", reason="a|b", rollback={"version": "580.126.20", "ok": False}),
    })
    text = rr.render_markdown(report)
    assert "Status: **stopped** (stopped by a1)." in text
    assert "| h1 | golden | upgraded | 580.126.20 | 620.82.01 | 620.82.01 | 119 s | - |" in text
    # A rollback version was chosen but never installed (the node still runs the target): flagged, not rolled back.
    assert "| a1 | canary | flagged | 580.126.20 | 620.82.01 | 620.82.01 | 60 s | a\\|b → not rolled back " \
           "(last known-good: 580.126.20) |" in text
    assert "| l1 | waves | not_started | - | - | - | - | - |" in text
    assert "- v1: ltsb resolves to R580 for Volta" in text


def test_concurrent_records_all_land(tmp_path):
    directory = str(tmp_path / "report")
    rr.write_plan(directory, dict(PLAN, started_at="first"))
    threads = [threading.Thread(target=rr.store_record, args=(directory, record(n, "waves", "upgraded")))
               for n in ("h1", "a1", "l1", "v1", "h2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rr.render(directory)
    with open(os.path.join(directory, "rollout-report.json")) as handle:
        report = json.load(handle)
    assert report["summary"]["upgraded"] == 5 and report["status"] == "completed"
    # A re-run of the same rollout keeps the first start time and adds its run.
    first = json.load(open(os.path.join(directory, "plan.json")))
    rr.write_plan(directory, dict(PLAN, started_at="later", runs=["r2"]))
    again = json.load(open(os.path.join(directory, "plan.json")))
    assert first["started_at"] == again["started_at"] == "first"
    assert again["runs"] == ["r2"]


def test_pid_alive_and_start_ticks(tmp_path):
    proc = tmp_path / "4242"
    proc.mkdir()
    (proc / "cmdline").write_bytes(b"/usr/bin/python3\x00/usr/bin/ansible-playbook\x00site.yml\x00")
    (proc / "stat").write_text("4242 (ansible-playboo) S 1 4242 4242 0 -1 4194560 1 0 0 0 1 2 0 0 20 0 1 0 "
                               "987654 1000 10 18446744073709551615\n")
    assert pid_alive(4242, str(tmp_path)) is True
    assert pid_alive(4343, str(tmp_path)) is False
    assert process_start_ticks(4242, str(tmp_path)) == 987654
    (proc / "cmdline").write_bytes(b"/usr/sbin/sshd\x00")
    assert pid_alive(4242, str(tmp_path)) is False


def run_playbook(playbook):
    """Run ``playbook`` (a path) with ansible-playbook on localhost, in its directory: the process."""
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                           "-e", "ansible_python_interpreter=%s" % sys.executable, str(playbook)],
                          cwd=str(playbook.parent), env=env, capture_output=True, text=True, check=False)


def test_action_start_record_render_and_probe(tmp_path):
    playbook = tmp_path / "pb.yml"
    playbook.write_text(
        "- name: Report\n"
        "  hosts: localhost\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Start\n"
        "      gpufleet.nvidia.rollout_report:\n"
        "        state: start\n"
        "        rollout_id: t\n"
        "        report_dir: rep\n"
        "        plan: {stages: [{name: golden, hosts: [n1]}, {name: waves, hosts: [n2]}]}\n"
        "      register: started\n"
        "    - name: Probe this very run\n"
        "      gpufleet.nvidia.rollout_report:\n"
        "        state: probe\n"
        "        controller: \"{{ started.run.controller }}\"\n"
        "        pid: \"{{ started.run.pid }}\"\n"
        "      register: probe\n"
        "    - name: Record\n"
        "      gpufleet.nvidia.rollout_report:\n"
        "        state: record\n"
        "        report_dir: rep\n"
        "        record: {node: n1, stage: golden, result: upgraded, target: {version: '620.82.01'},\n"
        "                 marks: {started: 10.0, drained: 12.0, finished: 70.0}}\n"
        "      register: recorded\n"
        "    - name: Render\n"
        "      gpufleet.nvidia.rollout_report:\n"
        "        state: render\n"
        "        report_dir: rep\n"
        "      register: rendered\n"
        "    - name: Show\n"
        "      ansible.builtin.debug:\n"
        "        msg: \"RESULT {{ {'run': started.run, 'alive': probe.alive, 'status': rendered.status,\n"
        "                           'summary': rendered.summary, 'changed': recorded.changed} | to_json }}\"\n"
    )
    proc = run_playbook(playbook)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = proc.stdout.split("RESULT ", 1)[1].split("\n")[0].rstrip('"').replace('\\"', '"')
    result = json.loads(line)
    assert result["alive"] is True
    assert result["run"]["run_id"].startswith("%s-%d-" % (result["run"]["controller"], result["run"]["pid"]))
    assert result["status"] == "in_progress"
    assert result["summary"]["upgraded"] == 1 and result["summary"]["not_started"] == 1
    assert result["changed"] is True
    stored = json.loads((tmp_path / "rep" / "nodes" / "n1.json").read_text())
    assert stored["durations"]["preflight_drain_s"] == 2.0 and stored["durations"]["total_s"] == 60.0
    assert stored["started_at"] == "1970-01-01T00:00:10Z"


def test_cut_off_node_is_recorded_out_of_service_with_how_far_it_got():
    hostvars = {"__node_upgrade_marks": {"started": 10.0, "drained": 20.0, "snapshot": 25.0},
                "__node_upgrade_target": "620.82.01",
                "__node_upgrade_read": {"ansible_facts": {"nvidia": {"driver": {"loaded_version": "580.126.20"}}}}}
    record = rr.cut_off_record("node04", "waves", "driver-ltsb", "ctl-1-1", False, hostvars, now=99.0)
    assert record["result"] == "unreachable" and record["flags"] == ["unreachable"]
    assert record["reason"].startswith("the node stopped answering after its snapshot; its transaction did not "
                                       "finish: left drained and locked, without a flag; out of service")
    assert record["drained"] is True
    assert record["target"] == {"version": "620.82.01"} and record["before"] == {"loaded": "580.126.20"}
    assert record["marks"]["finished"] == 99.0 and record["marks"]["drained"] == 20.0
    # A gate's recovery sets the preflight facts of its own transaction: they come first.
    recovered = dict(hostvars, __node_upgrade_preflight_facts={"driver": {"loaded_version": "620.82.01"}})
    assert rr.cut_off_record("node04", "waves", "driver-ltsb", "ctl-1-1", False, recovered,
                             now=99.0)["before"] == {"loaded": "620.82.01"}
    assert rollout_journal.status_of(record["result"]) == "failed"
    # Cut off during its drain, answering again: interrupted, not drained by the transaction, implicates nothing.
    early = rr.cut_off_record("node05", "waves", "driver-ltsb", "ctl-1-1", True,
                              {"__node_upgrade_marks": {"started": 1.0}}, now=2.0)
    assert early["result"] == "interrupted" and early["drained"] is False
    assert "lost its connection and answers again before its drain finished" in early["reason"]
    assert "left locked, without a flag" in early["reason"]
    signature = rollout_budget.failure_signature(early)
    assert signature == {"signature": "interrupted", "implicates_driver": False}
    assert rollout_budget.failure_signature(record)["implicates_driver"] is True


def test_resolution_note_carries_the_resolvers_warnings():
    """A version outside the catalog (the demo's 620.82.01) is said in the report, not only in a warning."""
    warning = "620.82.01 is in the repository but not in the catalog (as of 2026-11-20)"
    newest = {"branch": "620", "architectures": ["hopper"], "requested": {"branch": "ltsb"}, "warnings": [warning]}
    assert rr.resolution_note(newest) == warning
    volta = {"branch": "580", "architectures": ["volta"], "requested": {"branch": "ltsb"}, "warnings": [warning]}
    note = rr.resolution_note(volta)
    assert note.startswith("ltsb resolves to R580 for Volta") and note.endswith("; " + warning)
    assert rr.resolution_note({"branch": "620", "architectures": ["hopper"], "requested": {"branch": "620"},
                               "warnings": []}) is None


def test_a_note_shared_by_nodes_is_one_line():
    warning = "620.82.01 is in the repository but not in the catalog (as of 2026-11-20)"
    report = rr.build_report(PLAN, {
        "h1": record("h1", "golden", "upgraded", note=warning),
        "a1": record("a1", "canary", "upgraded", note=warning),
        "v1": record("v1", "waves", "upgraded", after="580.178.04", target="580.178.04",
                     note="ltsb resolves to R580 for Volta: R620, the newest LTSB, does not support Volta"),
    })
    assert report["notes"] == [warning + " (2 nodes: h1, a1)",
                               "v1: ltsb resolves to R580 for Volta: R620, the newest LTSB, does not support Volta"]
    assert "- " + warning + " (2 nodes: h1, a1)" in rr.render_markdown(report)


def test_a_golden_nodes_contract_change_is_in_the_first_lines_and_decides_its_class(tmp_path):
    from ansible_collections.gpufleet.nvidia.plugins.action.rollout_report import _journal_event
    directory = str(tmp_path / "report")
    nodes = [{"name": "h1", "stage": "golden", "class": "gpu_h100"}, {"name": "a1", "stage": "canary", "class": "gpu_h100"},
             {"name": "l1", "stage": "waves", "class": "gpu_h100"}]
    rr.write_plan(directory, dict(PLAN, nodes=nodes, options={}, stages=[
        {"name": "golden", "hosts": ["h1"]}, {"name": "canary", "hosts": ["a1"]}, {"name": "waves", "hosts": ["l1"]}]))
    after = {"node": {"cuda_driver_version": "13.5"}, "gpus": [{"index": 0, "memory_reserved_mib": 544}], "units": []}
    contract = {"diff": [], "lines": ["CUDA 13.0 → 13.5", "reserved memory 480 → 544 MiB on 8 GPUs"], "after": after,
                "changes": [{"field": "cuda_driver_version", "scope": "node", "text": "CUDA 13.0 → 13.5",
                             "decision": "expected"},
                            {"field": "memory_reserved_mib", "scope": "gpu", "text": "reserved memory 480 → 544 MiB on 8 GPUs",
                             "decision": "open", "gpus": [0]}]}
    rollout_journal.append(directory, {"event": "started", "node": "h1", "run_id": "r1", "time": 1.0})
    rr.store_record(directory, record("h1", "golden", "upgraded", contract=contract),
                    lambda merged: rollout_journal.append_in_lock(directory, _journal_event(merged, True, 2.0)))
    report = rr.render(directory)["report"]
    assert report["status"] == "stopped"
    assert report["stop_reason"].startswith("contract change unexplained on golden node h1 (class gpu_h100): "
                                            "reserved memory 480 → 544 MiB on 8 GPUs")
    assert [(s["node"], s["stage"], s["result"]) for s in report["stopped_by"]] == [("h1", "golden", "upgraded")]
    assert "rollout_contract_accept" in report["stopped_by"][0]["next_step"]["command"]
    text = rr.render_markdown(report)
    head = text.split("| stage |")[0]
    assert head.endswith("Wall time 60 s.\n\nHardware contract, decided by each class's golden node:\n"
                         "- gpu_h100 (h1): 1 unexplained: CUDA 13.0 → 13.5 (the driver's own); reserved memory 480 → "
                         "544 MiB on 8 GPUs (unexplained)\n\n")
    assert rr.golden_contract(directory, "gpu_h100") == {"node": "h1", "contract": after}
    assert rr.golden_contract(directory, "gpu_a100") is None
    # The operator accepts the change (the next job's extra vars): the same journal decides on.
    rr.write_plan(directory, dict(PLAN, nodes=nodes, options={"contract_accept": "memory_reserved_mib"}))
    report = rr.render(directory)["report"]
    assert report["status"] == "in_progress" and report["stop_reason"] is None
    assert [c["decision"] for c in report["contract"]["gpu_h100"]["changes"]] == ["expected", "accepted"]


def test_traces_are_written_beside_the_report_with_what_moved(tmp_path):
    from ansible_collections.gpufleet.nvidia.plugins.module_utils import gpu_trace
    directory = str(tmp_path / "report")

    def trace(sm_mhz):
        rows = []
        for step in range(3):
            row = gpu_trace.new_row(time_s=step * 0.5, gpu=0, pci_bus_id="0000:18:00.0", uuid="GPU-a")
            row.update(pstate="P0", sm_clock_mhz=sm_mhz, mem_clock_mhz=2619, power_w=690.0, temperature_c=60,
                       utilization_gpu_pct=100, clocks_event_reasons=["sw_power_cap"])
            rows.append(row)
        return rows

    before, after = trace(1410), trace(1140)
    # What the module returns with baseline= the summary before (gpu_trace.compare on the node).
    changes = gpu_trace.compare(gpu_trace.summarize(before), gpu_trace.summarize(after))
    assert changes[-1] == "SM clock at power cap: 1410 → 1140 MHz on GPU 0000:18:00.0"
    evidence = rr.store_traces(directory, "h1", {"before": {"csv": gpu_trace.to_csv(before)},
                                                 "after": {"csv": gpu_trace.to_csv(after), "changes": changes}})
    assert evidence["before_csv"] == os.path.join(directory, "traces", "h1.before.csv")
    assert evidence["samples"] == {"before": 3, "after": 3} and evidence["changes"] == changes
    with open(evidence["after_csv"]) as handle:
        assert handle.readline().strip() == ",".join(gpu_trace.COLUMNS)
    assert rr.evidence_lines({"h1": evidence}) == ["h1, traces before and after: " + "; ".join(changes)]
    # Only one side (a node that had no driver before): kept, not compared; nothing at all: no evidence.
    one = rr.store_traces(directory, "h2", {"before": None, "after": {"csv": gpu_trace.to_csv(after), "changes": ["x"]}})
    assert one["before_csv"] is None and one["changes"] is None
    assert rr.evidence_lines({"h2": one}) == ["h2, traces after: only the trace after"]
    assert rr.store_traces(directory, "h3", {"before": {"csv": 3}, "after": None}) is None
    assert rr.store_traces(directory, "h4", {"before": {"csv": "a\n"}, "after": {"csv": "a\n", "changes": [1]}})[
        "changes"] is None
    # Any inventory name names a file inside traces/ (an IPv6 address, a path, a long name).
    for node, name in (("2001:db8::1", "2001%3Adb8%3A%3A1"), ("../etc", "%2E.%2Fetc"), ("nœud", "n%C5%93ud")):
        assert rr.file_name(node) == name
        assert rr.store_traces(directory, node, {"before": {"csv": "x\n"}})["before_csv"] == os.path.join(
            directory, "traces", name + ".before.csv")
    assert len(rr.file_name("n" * 253)) <= 200 and rr.file_name("n" * 253) != rr.file_name("n" * 252)
    assert rr.store_traces(directory, "s", {"after": {"csv": "a\udcff\n"}})["after_csv"].endswith("s.after.csv")
    with pytest.raises(ValueError, match="cannot name a trace file"):
        rr.store_traces(directory, "", {"before": {"csv": ""}})
    # Evidence from a corrupt record: left out or said as it is, never a crash.
    assert rr.evidence_lines({"g": {}, "h": None, "i": {"before_csv": "a", "after_csv": "b", "changes": None},
                              "j": {"before_csv": "a", "after_csv": "b", "changes": "moved"}}) == [
        "i, traces before and after: not compared", "j, traces before and after: not compared"]
    assert rr.contract_lines({"gpu_x": {"node": "g", "changes": "abc"}, "gpu_y": [1], "gpu_z": {
        "node": "z", "changes": [None, {"field": "kernel", "decision": "unexplained"}]}}) == [
        "gpu_x (g): no change", "gpu_z (z): 1 unexplained: kernel (unexplained)"]


def test_a_record_with_a_fail_msg_is_written_then_fails_its_host(tmp_path):
    playbook = tmp_path / "pb.yml"
    playbook.write_text(
        "- name: Report\n"
        "  hosts: localhost\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Record a node rolled back, failing its host\n"
        "      gpufleet.nvidia.rollout_report:\n"
        "        state: record\n"
        "        report_dir: rep\n"
        "        record: {node: n2, stage: waves, result: rolled_back, reason: 'Xid 79 after reboot',\n"
        "                 marks: {started: 20.0}}\n"
        "        fail_msg: 'n2: rolled_back: Xid 79 after reboot'\n"
        "    - name: Not reached\n"
        "      ansible.builtin.debug:\n"
        "        msg: REACHED\n"
    )
    proc = run_playbook(playbook)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "n2: rolled_back: Xid 79 after reboot" in proc.stdout and "REACHED" not in proc.stdout
    stored = json.loads((tmp_path / "rep" / "nodes" / "n2.json").read_text())
    assert stored["result"] == "rolled_back" and stored["reason"] == "Xid 79 after reboot"
    journal = (tmp_path / "rep" / "journal.jsonl").read_text() if (tmp_path / "rep" / "journal.jsonl").exists() else ""
    assert '"node": "n2"' in journal and '"status": "failed"' in journal


def test_render_without_prometheus_client_writes_every_other_format_and_says_so_once(tmp_path, monkeypatch):
    """A controller with ansible-core and the collection alone: the rollout's files, less the textfile."""
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import prometheus_client raises ImportError
    directory = str(tmp_path / "report")
    rr.write_plan(directory, PLAN)
    rr.store_record(directory, record("h1", "golden", "upgraded"))
    done = rr.render(directory)
    assert sorted(done["paths"]) == ["html", "json", "junit", "markdown"]
    assert sorted(os.listdir(directory)) == [".lock", "nodes", "plan.json", "rollout-report.html", "rollout-report.json",
                                             "rollout-report.junit.xml", "rollout-report.md"]
    note = done["report"]["skipped_outputs"]["prometheus"]
    assert note.startswith("the Prometheus textfile %s/gpufleet_rollout.prom was not written: the controller's Python "
                           "(%s) has no prometheus_client; to get it, install the collection's controller requirements "
                           "(%s -m pip install -r " % (directory, sys.executable, sys.executable))
    assert note.endswith("/gpufleet/nvidia/requirements.txt) and run the report again; every other format was written")
    with open(os.path.join(directory, "rollout-report.json")) as handle:
        assert json.load(handle)["skipped_outputs"] == {"prometheus": note}
    for name in ("rollout-report.md", "rollout-report.html"):
        with open(os.path.join(directory, name)) as handle:
            assert html.unescape(handle.read()).count(note) == 1, name
    # With prometheus_client, nothing is skipped and the textfile is written.
    monkeypatch.delitem(sys.modules, "prometheus_client")
    again = rr.render(directory)
    assert again["report"]["skipped_outputs"] == {} and os.path.isfile(again["paths"]["prometheus"])


def test_action_render_warns_once_without_prometheus_client_and_not_at_steps(tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "prometheus_client.py").write_text("raise ImportError('No module named prometheus_client')\n")
    playbook = tmp_path / "pb.yml"
    playbook.write_text(
        "- name: Report\n"
        "  hosts: localhost\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Record\n"
        "      gpufleet.nvidia.rollout_report:\n"
        "        state: record\n"
        "        report_dir: rep\n"
        "        record: {node: n1, stage: golden, result: upgraded, target: {version: '620.82.01'}}\n"
        "    - name: Render a step\n"
        "      gpufleet.nvidia.rollout_report:\n"
        "        state: render\n"
        "        report_dir: rep\n"
        "        warn_skipped: false\n"
        "    - name: Render the last time\n"
        "      gpufleet.nvidia.rollout_report:\n"
        "        state: render\n"
        "        report_dir: rep\n"
        "      register: rendered\n"
        "    - name: Show\n"
        "      ansible.builtin.debug:\n"
        "        msg: \"RESULT {{ {'skipped': rendered.skipped_outputs, 'paths': rendered.paths} | to_json }}\"\n"
    )
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               PYTHONPATH=str(hide))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                           "-e", "ansible_python_interpreter=%s" % sys.executable, str(playbook)],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert out.count("[WARNING]: rollout_report: the Prometheus textfile %s was not written" % (
        tmp_path / "rep" / "gpufleet_rollout.prom")) == 1, out
    result = json.loads(proc.stdout.split("RESULT ", 1)[1].split("\n")[0].rstrip('"').replace('\\"', '"'))
    assert sorted(result["paths"]) == ["html", "json", "junit", "markdown"]
    assert list(result["skipped"]) == ["prometheus"]
