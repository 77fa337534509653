# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The next step of every node a rollout left out of service: the catalog's action on the GPU it names,
what clears the flag, and the exact commands; in the report (every format) and in the node's flag file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_next_step as ns
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_outcome as ro
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_report as rr

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_rollout_outcome import RECORDS  # noqa: E402 pylint: disable=wrong-import-position

LOST = "0000:4e:00.0"
SERIAL = "1654922000403"
UUID = "GPU-5e1c0f0e-7a3b-4c1d-9e2f-1a2b3c4d5e6f"

#: The demo's node06 after its rollback: NVML lists 7 GPUs, the kernel log names the lost one (Xid 79).
AFTER = {"gpus": [{"index": i, "pci_bus_id": "0000:%02x:00.0" % (0x18 + i), "uuid": "GPU-%d" % i} for i in range(7)],
         "headline": {"gpus": [{"gpu": "GPU %s" % LOST, "pci_bus_id": LOST, "serial": None, "uuid": None, "index": None,
                                "listed": False, "problem": "not listed by nvml; kernel log: Xid 79 (GPU has fallen off "
                                                            "the bus)", "action": "hardware_inspection", "fatal": True}]},
         "health": {"problems": []}}
BEFORE = {"gpus": AFTER["gpus"] + [{"index": 7, "pci_bus_id": LOST, "serial": SERIAL, "uuid": UUID}]}
NODE06 = {"node": "node06", "stage": "waves", "result": "flagged", "rollout_id": "demo-ltsb",
          "target": {"requested": "ltsb", "version": "620.82.01"},
          "reason": "GPU count changed: 8 before, 7 after (gone: GPU %s (serial %s, %s))" % (LOST, SERIAL, UUID),
          "flags": ["gpu_count_changed", "new_fatal_xid"], "new_fatal_xids": {"79": 1},
          "rollback": {"version": "580.126.20", "ok": False}, "after": {"loaded": "580.126.20"},
          "marks": {"started": 1.0, "rebooted": 50.0, "failed": 60.0},
          "flag": {"flagged": True, "rollback_installed": True}}


def test_gpu_problems_names_the_lost_gpu_by_the_serial_of_the_snapshot():
    gpus = ns.gpu_problems(AFTER, BEFORE)
    assert gpus == [{"pci_bus_id": LOST, "serial": SERIAL, "uuid": UUID, "index": None, "fatal": True,
                     "problem": "not listed by nvml; kernel log: Xid 79 (GPU has fallen off the bus)",
                     "action": "hardware_inspection", "gpu": "GPU %s (serial %s, %s)" % (LOST, SERIAL, UUID)}]
    # Without the kernel log's line: the GPU gone since the snapshot.
    gone = ns.gpu_problems(dict(AFTER, headline={"gpus": []}), BEFORE)
    assert [(g["pci_bus_id"], g["serial"], g["action"], g["problem"]) for g in gone] == [
        (LOST, SERIAL, "hardware_inspection", "gone since the snapshot")]
    assert ns.gpu_problems("not facts", ["nor", "these"]) == []


def test_the_lost_gpu_gets_reseat_or_rma_by_its_serial_the_flag_and_the_commands():
    step = ns.next_step(dict(NODE06, gpus=ns.gpu_problems(AFTER, BEFORE)), ["/srv/inventory/hosts.yml"])
    assert step["action"] == "hardware_inspection"
    assert step["do"] == ("reseat GPU %s (serial %s, %s) and check its power and riser, or RMA it by its serial %s if "
                          "the fault comes back (not listed by nvml; kernel log: Xid 79 (GPU has fallen off the bus)); "
                          "the node stays drained until then" % (LOST, SERIAL, UUID, SERIAL))
    assert step["clears"] == ("a verified rollback clears the flag (/etc/ansible/facts.d/gpufleet_rollout.fact) and "
                              "undrains the node: rollback.yml verifies it on its last known-good driver once the GPU "
                              "is fixed (a GPU replaced by an RMA has a new UUID and serial, which the verification "
                              "refuses unless its slot is named: ansible-playbook gpufleet.nvidia.rollback "
                              "-i /srv/inventory/hosts.yml -e rollback_hosts=node06 -e rollback_replaced_gpus=%s)" % LOST)
    assert step["command"] == "ansible-playbook gpufleet.nvidia.rollback -i /srv/inventory/hosts.yml -e rollback_hosts=node06"
    assert step["resume"] == ("ansible-playbook gpufleet.nvidia.rollout -i /srv/inventory/hosts.yml "
                              "-e rollout_id=demo-ltsb -e driver_branch=ltsb")
    text = ns.next_step_text(step)
    assert text.endswith("; then %s takes it back into the rollout" % step["resume"])


def test_catalog_actions_per_xid():
    gsp = {"gpu": "GPU 0000:9b:00.0 (serial 1321)", "pci_bus_id": "0000:9b:00.0", "serial": "1321",
           "action": "reset_gpu", "problem": "Xid 119 (GSP RPC timeout)"}
    step = ns.next_step(dict(NODE06, result="rolled_back", flags=["gpu_not_usable"], new_fatal_xids={}, gpus=[gsp],
                             rollback={"version": "580.126.20", "ok": True}))
    assert step["action"] == "reset_gpu"
    assert step["do"] == ("reset GPU 0000:9b:00.0 (serial 1321) (nvidia-smi -r -i 0000:9b:00.0, with no process on it) "
                          "or reboot the node (Xid 119 (GSP RPC timeout)); the node stays on 580.126.20 until then")
    # A reboot the catalog asks for, not done yet (no reboot mark, no rollback): reboot first.
    fresh = ns.next_step({"node": "n1", "result": "flagged", "flags": ["new_fatal_xid"], "new_fatal_xids": {"79": 2}})
    assert fresh["action"] == "reboot"
    assert fresh["do"].startswith("reboot the node (the catalog's action for the GPU the reason names); reseat the GPU "
                                  "or RMA it")
    assert "Xid 79 (GPU has fallen off the bus; NVIDIA: RESTART_BM)" in fresh["do"]
    # Xid 64 (row remapping failure): the catalog says inspect the hardware.
    rows = ns.next_step({"node": "n1", "result": "flagged", "flags": ["new_fatal_xid"], "new_fatal_xids": {"64": 1}})
    assert rows["action"] == "hardware_inspection" and rows["do"].startswith("reseat the GPU the reason names")


def test_node_problem_remedy_and_driver_failures():
    signature = {"kind": "module_signature_rejected", "reason": "...", "remedy": "enroll the key that signed the module"}
    step = ns.next_step({"node": "n2", "result": "rolled_back", "flags": ["node_problem"], "problems": [signature],
                         "rollback": {"version": "580.126.20", "ok": True}})
    assert (step["action"], step["do"]) == ("module_signature_rejected", "enroll the key that signed the module")
    build = ns.next_step({"node": "n3", "result": "rolled_back", "flags": ["transaction_failed"],
                          "rollback": {"version": "580.126.20", "ok": True}, "rollout_id": "r 1",
                          "target": {"requested": "620.82.01"}})
    assert build["action"] == "driver"
    assert build["do"].startswith("the node is back on 580.126.20, verified, drained and flagged")
    assert build["resume"] == "ansible-playbook gpufleet.nvidia.rollout -i <inventory> -e rollout_id='r 1' " \
                              "-e driver_version=620.82.01"


@pytest.mark.parametrize("flag, action, words", [
    ("health_unknown", "read_unrecognised", "no rule of this collection reads them"),
    ("gpu_degraded", "check_clocks", "held down by hardware"),
])
def test_verification_refused_for_what_was_not_understood_or_held_down(flag, action, words):
    step = ns.next_step({"node": "n4", "result": "rolled_back", "flags": [flag],
                         "rollback": {"version": "580.126.20", "ok": True}})
    assert step["action"] == action and words in step["do"] and "on 580.126.20" in step["do"]
    assert step["command"].startswith("ansible-playbook gpufleet.nvidia.rollback")


def test_refused_unreachable_and_in_service():
    refused = ns.next_step({"node": "n4", "result": "refused", "flags": ["fatal_xid"], "reason": "a fatal Xid is in the log",
                            "rollout_id": "r"})
    assert refused["action"] == "preflight" and refused["command"] == refused["resume"]
    assert refused["do"] == "nothing was changed; remove the cause the preflight names (a fatal Xid is in the log)"
    flagged = ns.next_step({"node": "n4", "result": "refused", "flags": ["flagged"], "rollout_id": "r"})
    assert flagged["command"] == "ansible-playbook gpufleet.nvidia.rollback -i <inventory> -e rollback_hosts=n4"
    lost = ns.next_step({"node": "n5", "result": "unreachable", "rollout_id": "r"})
    assert lost["action"] == "reconnect" and lost["command"] == "ansible-playbook gpufleet.nvidia.rollout -i <inventory> " \
                                                                "-e rollout_id=r"
    for result in ("upgraded", "skipped", "not_started", "pending"):
        assert ns.next_step({"node": "n6", "result": result}) is None
    # rollback.yml's own records: its rollback_id is not a rollout to resume.
    assert ns.commands({"node": "n7", "stage": "rollback", "rollout_id": "rollback"})["rollout"] == \
        "ansible-playbook gpufleet.nvidia.rollout -i <inventory>"


def test_every_node_out_of_service_has_its_next_step_in_every_format(tmp_path):
    directory = str(tmp_path / "report")
    rr.write_plan(directory, {"rollout_id": "every-outcome", "stages": [{"name": "waves", "hosts": sorted(RECORDS)}]})
    for node, record in RECORDS.items():
        if record is not None:
            rr.store_record(directory, dict(record, node=node, stage="waves", rollout_id="every-outcome", run_id="r1"))
    done = rr.render(directory, inventory=["/srv/inv"])
    out_of_service = [n for n in done["report"]["nodes"] if n["outcome"] not in ro.IN_SERVICE + ("pending",)]
    assert len(out_of_service) == 8
    with open(done["paths"]["markdown"], encoding="utf-8") as handle:
        markdown = handle.read()
    with open(done["paths"]["junit"], encoding="utf-8") as handle:
        junit = handle.read()
    with open(done["paths"]["html"], encoding="utf-8") as handle:
        page = handle.read()
    for node in out_of_service:
        step = node["next_step"]
        assert step["command"].startswith("ansible-playbook gpufleet.nvidia.") and "-i /srv/inv" in step["command"]
        assert step["do"] and step["clears"], node["node"]
        line = "- %s (%s): %s." % (node["node"], ro.LABELS[node["outcome"]], ns.next_step_text(step))
        assert markdown.count(line) == 1, line
        failure = ET.fromstring(junit).find(".//testcase[@name='%s']/failure" % node["node"])
        if node["outcome"] != "refused":  # a refused node's case is skipped: nothing was changed
            assert failure.text.endswith("; next step: %s" % ns.next_step_text(step)), node["node"]
        assert step["command"] in page
    for node in done["report"]["nodes"]:
        if node["outcome"] in ro.IN_SERVICE:
            assert node["next_step"] is None


def test_the_flag_file_content_carries_the_next_step(tmp_path):
    """recover.yml's own task that adds the next step to the flag, run on localhost with node06's state."""
    with open(os.path.join(REPO, "roles", "node_upgrade", "tasks", "recover.yml"), encoding="utf-8") as handle:
        tasks = yaml.safe_load(handle)
    add = [task for task in tasks if task.get("name") == "Add the next step to the flag"]
    assert len(add) == 1
    variables = {"node_upgrade_flag": {"flagged": True, "rollout_id": "demo-ltsb"},
                 "node_upgrade_outcome": {"result": "flagged", "reason": NODE06["reason"]},
                 "node_upgrade_rollout_id": "demo-ltsb", "node_upgrade_stage": "waves", "driver_branch": "ltsb",
                 "__node_upgrade_verdict": {"flags": NODE06["flags"], "new_fatal_xids": {"79": 1}},
                 "__node_upgrade_rollback_target": {"version": "580.126.20"},
                 "__node_upgrade_rollback_verdict": {"ok": False}, "__node_upgrade_marks": NODE06["marks"],
                 "__node_upgrade_snapshot": {"facts": BEFORE}, "ansible_facts": {"nvidia": AFTER}}
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    node06:\n      ansible_connection: local\n")
    (tmp_path / "pb.yml").write_text(yaml.safe_dump([{
        "name": "Flag", "hosts": "node06", "gather_facts": False, "vars": variables,  # play vars: set_fact outranks them
        "tasks": add + [{"name": "Show", "ansible.builtin.debug": {"msg": "FLAG {{ node_upgrade_flag | to_json }}"}}]}]))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "hosts.yml",
                           "-e", "ansible_python_interpreter=%s" % sys.executable, "pb.yml"],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    flag = json.loads(proc.stdout.split("FLAG ", 1)[1].split("\n")[0].rstrip('"').replace('\\"', '"'))
    step = flag["next_step"]
    assert step["action"] == "hardware_inspection"
    assert step["do"].startswith("reseat GPU %s (serial %s, %s)" % (LOST, SERIAL, UUID))
    assert "RMA it by its serial %s" % SERIAL in step["do"]
    inventory = str(tmp_path / "hosts.yml")
    assert step["command"] == "ansible-playbook gpufleet.nvidia.rollback -i %s -e rollback_hosts=node06" % inventory
    assert step["resume"] == ("ansible-playbook gpufleet.nvidia.rollout -i %s -e rollout_id=demo-ltsb "
                              "-e driver_branch=ltsb" % inventory)
    assert flag["flagged"] is True and flag["rollout_id"] == "demo-ltsb"


@pytest.mark.parametrize("bad", [None, "text", 7, ["list"], {"result": 5, "flags": "x", "gpus": "y", "rollback": 1}])
def test_bad_input_is_not_a_traceback(bad):
    assert ns.next_step(bad if isinstance(bad, dict) else {"result": "flagged", "gpus": bad}) is not None
