# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The headline of the facts: verdict, worst problem per GPU by bus id and serial, next step (unit, no node)."""

from __future__ import annotations

from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_log
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_headline import node_headline
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_facts, new_gpu
from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_health import node_health

LOST_79 = ("[    5.100000] NVRM: GPU at PCI:0000:4e:00: GPU-00000000-0000-0000-0000-0000000000a3\n"
           "[    5.100001] NVRM: GPU Board Serial Number: 1654922000403\n"
           "[   61.000000] NVRM: Xid (PCI:0000:4e:00): 79, pid=0, GPU has fallen off the bus.\n")


def node(gpus=8, kernel_log_text="", state="ok"):
    """Facts of an H100 node on 580.126.20 read through NVML; GPU 3 (0000:4e:00.0) left out when gpus == 7."""
    doc = new_facts("nvml")
    doc["driver"].update(userspace_version="580.126.20", loaded_version="580.126.20",
                         on_disk_version="580.126.20", state=state)
    buses = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:4e:00.0",
             "0000:87:00.0", "0000:9a:00.0", "0000:ba:00.0", "0000:db:00.0"]
    if gpus == 7:
        buses.remove("0000:4e:00.0")
    for index, bus in enumerate(buses):
        gpu = new_gpu(index)
        gpu.update(pci_bus_id=bus, uuid="GPU-%d" % index, serial="16549220004%02d" % index)
        doc["gpus"].append(gpu)
    doc["gpu_count"] = len(buses)
    parsed = kernel_log.parse_kernel_log(kernel_log_text)
    doc["xid_events"] = parsed["events"]
    doc["kernel_log_gpus"] = [dict(identity, pci_bus_id=bus)
                              for bus, identity in kernel_log.gpu_identities(kernel_log_text).items()]
    doc["health"] = node_health(doc)
    return doc


def test_healthy_node():
    headline = node_headline(node())
    assert headline == {"verdict": "healthy", "summary": "healthy: 8 GPU(s) usable, driver 580.126.20.", "gpus": [],
                        "node_problems": [], "action": None, "next_step": None, "unknown": []}


def test_a_gpu_lost_before_the_boot_is_named_by_bus_id_and_serial_and_sent_to_the_hardware():
    """After the reboot NVML lists 7 GPUs; index 3 is now 0000:87:00.0, a healthy card."""
    facts = node(gpus=7, kernel_log_text=LOST_79)
    assert facts["gpus"][3]["pci_bus_id"] == "0000:87:00.0"
    headline = node_headline(facts)
    assert headline["verdict"] == "unhealthy"
    assert [(g["gpu"], g["index"], g["action"]) for g in headline["gpus"]] == [
        ("GPU 0000:4e:00.0 (serial 1654922000403, GPU-00000000-0000-0000-0000-0000000000a3)", None,
         "hardware_inspection")]
    assert headline["gpus"][0]["problem"] == "not listed by nvml; kernel log: Xid 79 (GPU has fallen off the bus)"
    assert headline["action"] == "hardware_inspection"
    assert headline["next_step"].startswith("drain the node and have GPU 0000:4e:00.0 (serial 1654922000403")
    assert "RMA" in headline["next_step"]
    assert "GPU 3" not in headline["summary"]


def test_a_rollout_flag_is_a_node_problem_with_how_to_clear_it():
    facts = node()
    facts["rollout"] = {"flagged": True, "rollout_id": "driver-ltsb", "stage": "canary",
                        "reason": "GPU count changed: 8 before, 7 after"}
    headline = node_headline(facts)
    assert headline["verdict"] == "unhealthy" and headline["action"] == "clear_rollout_flag"
    assert headline["node_problems"] == ["flagged by rollout driver-ltsb (stage canary): GPU count changed: 8 before, "
                                         "7 after"]
    assert "playbooks/rollback.yml" in headline["next_step"]


def test_unknown_driver_state_without_a_problem_is_unknown_not_healthy():
    facts = node(state=None)
    facts["gpu_count"] = None
    facts["gpus"] = []
    facts["health"] = node_health(facts)
    headline = node_headline(facts)
    assert headline["verdict"] == "unknown"
    assert headline["summary"] == "unknown: not enough evidence: gpu_count, driver.state could not be read."
    assert headline["action"] is None
