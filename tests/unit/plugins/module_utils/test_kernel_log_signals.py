# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel-log signals beyond the Xid: SXids, GPUs that failed to initialise, probe refusals,
follow-on Xids, escaped multi-line messages, and the lines no rule reads (fail loud).

Field cases 06, 30, 37 and 38 (tests/fixtures/cases, with their sources in each case.md)."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_log, kernel_log_coverage, node_signals
from ansible_collections.gpufleet.nvidia.plugins.module_utils import nvswitch_log
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import assemble_facts
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_facts, new_gpu
from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_health import node_health
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_headline import node_headline
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_verdict import healthy, verify_upgrade

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "cases")
CASE37 = "37-xid79-with-nvswitch-sxid20034-fatal"
CASE38 = "38-gsp-boot-wpr2-already-up-rminitadapter-failed"


def _case(folder, name):
    with open(os.path.join(CASES, folder, name), "rb") as handle:
        return handle.read()


def _bundle(**files):
    return assemble_facts({name.replace("_", "-").replace("-txt", ".txt"): data for name, data in files.items()},
                          capture=True)


# --- NVSwitch SXids (field case 37) ------------------------------------------------------------


def test_case37_four_fatal_sxid_records_on_three_switches():
    events = nvswitch_log.parse_sxids(_case(CASE37, "input-dmesg.log").decode())
    by_switch = {event["pci_bus_id"]: event for event in events}
    assert sorted(by_switch) == ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0"]
    assert [by_switch[bus]["fatal_records"] for bus in sorted(by_switch)] == [2, 1, 1]
    assert by_switch["0000:05:00.0"]["links"] == [62, 63]
    assert by_switch["0000:05:00.0"]["records"] == 4  # two Fatal, one Severity, one Data record
    assert by_switch["0000:07:00.0"]["links"] == [37]
    assert all(event["sxid"] == 20034 and event["fatal"] is True and event["known"] for event in events)
    assert all(event["action"] == "reboot" for event in events)
    problem = nvswitch_log.fabric_problem(events)
    assert problem["fatal_records"] == 4 and problem["sxids"] == [20034]


def test_case37_bundle_is_a_fabric_fault_and_one_xid79_incident():
    facts = _bundle(dmesg_txt=_case(CASE37, "input-dmesg.log"))
    xid79 = [event for event in facts["xid_events"] if event["xid"] == 79]
    assert len(xid79) == 1 and xid79[0]["count"] == 1 and xid79[0]["pci_bus_id"] == "0000:91:00.0"
    assert facts["kernel_log_gpus"] == [{"pci_bus_id": "0000:91:00.0",
                                         "uuid": "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
                                         "serial": "1653723052734"}]
    health = facts["health"]
    assert health["state"] == "unhealthy" and health["healthy"] is False
    assert [p["kind"] for p in health["problems"]] == ["nvswitch_fatal"]
    assert "4 fatal SXid record(s) (SXid 20034)" in health["problems"][0]["reason"]
    assert [gpu["pci_bus_id"] for gpu in health["gpus"]] == ["0000:91:00.0"]
    assert health["gpus"][0]["serial"] == "1653723052734"
    assert facts["kernel_log_unrecognised"]["count"] == 0
    assert facts["headline"]["verdict"] == "unhealthy"


def test_sxid_non_fatal_is_counted_not_a_problem():
    text = "[  10.0] nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 12028, Non-fatal, Link 20 egress non-posted PRIV error\n"
    events = nvswitch_log.parse_sxids(text)
    assert events[0]["fatal"] is False and events[0]["action"] == "ignore" and events[0]["known"] is False
    assert events[0]["name"] == "NVSwitch error SXid 12028"
    assert nvswitch_log.fabric_problem(events) is None


# --- GPUs that failed to initialise (field case 38) -------------------------------------------


@pytest.mark.parametrize("name, bus, count, minor", [
    ("input-dmesg-1058.log", "0000:01:00.0", 2, 0),
    ("input-dmesg-1230.log", "0000:a1:00.0", 6, 7),
])
def test_case38_gsp_boot_failure_names_the_gpu(name, bus, count, minor):
    failures = node_signals.gpu_init_failures(_case(CASE38, name).decode())
    assert len(failures) == 1
    failure = failures[0]
    assert failure["pci_bus_id"] == bus and failure["count"] == count and failure["device_minor"] == minor
    assert failure["code"] == "(0x62:0x40:2168)"
    assert failure["gsp_boot_failed"] is True and failure["reset_needed"] is True
    assert any("unexpected WPR2 already up" in cause for cause in failure["causes"])


def test_gsp_boot_failure_causes_without_a_gpu_instance_name():
    # R575 prints the causes with no "GPU0 " (NVIDIA/open-gpu-kernel-modules issue 876, corpus
    # kernel-log/gsp-wpr2-already-up-xid120-crashcat-rtx5080-laptop.log); R580+ names the instance.
    text = "\n".join([
        "[   84.810006] NVRM: _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP",
        "[   84.810007] NVRM: _kgspBootGspRm: (the GPU is likely in a bad state and may need to be reset)",
        "[   84.810046] NVRM: RmInitAdapter: Cannot initialize GSP firmware RM",
        "[   84.811879] NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x62:0x40:1941)",
        "[   84.813774] NVRM: GPU 0000:01:00.0: rm_init_adapter failed, device minor number 0",
    ]) + "\n"
    failures = node_signals.gpu_init_failures(text)
    assert [(f["pci_bus_id"], f["count"], f["code"], f["device_minor"]) for f in failures] == [
        ("0000:01:00.0", 2, "(0x62:0x40:1941)", 0)]
    assert failures[0]["gsp_boot_failed"] is True and failures[0]["reset_needed"] is True
    assert failures[0]["causes"][0] == "_kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP"
    found = kernel_log_coverage.unrecognised_lines(text)
    assert (found["count"], found["error_count"], found["nvidia_lines"]) == (0, 0, 5)


def test_case38_bundle_gpu_not_usable_no_xid_no_rollback_signal():
    facts = _bundle(dmesg_txt=_case(CASE38, "input-dmesg-1058.log"))
    assert facts["xid_events"] == []
    health = facts["health"]
    assert health["state"] == "unhealthy"
    assert [(gpu["pci_bus_id"], gpu["action"], gpu["listed"]) for gpu in health["gpus"]] == [
        ("0000:01:00.0", "reset_gpu", False)]
    assert "power-cycle" in health["gpus"][0]["signals"][0]["reason"]
    # The assertion lines, WPR2 and the left-over mapping line are the failure's context, not unknown.
    assert facts["kernel_log_unrecognised"]["error_count"] == 0


# --- the driver's probe refusal ------------------------------------------------------------------


def test_probe_refusal_is_a_node_problem_and_read():
    text = "\n".join("[    4.%06d] %s" % (i, line) for i, line in enumerate([
        "NVRM: The NVIDIA GPU 0000:18:00.0 (PCI ID: 10de:1db4)",
        "NVRM: installed in this system is not supported by the",
        "NVRM: NVIDIA 620.70.06 driver release.",
        "NVRM: The NVIDIA probe routine failed for 1 device(s).",
        "NVRM: None of the NVIDIA devices were initialized.",
        "nvidia-nvlink: Unregistered Nvlink Core, major device number 234",
    ]))
    failures = node_signals.probe_failures(text)
    assert failures == [{"pci_bus_id": "0000:18:00.0", "pci_id": "10de:1db4", "gpu_name": None,
                         "reason": "not_supported", "legacy_branch": None,
                         "first_line": "[    4.000000] NVRM: The NVIDIA GPU 0000:18:00.0 (PCI ID: 10de:1db4)"}]
    assert kernel_log_coverage.unrecognised_lines(text)["count"] == 0
    facts = _bundle(dmesg_txt=text.encode())
    assert [p["kind"] for p in facts["health"]["problems"]] == ["gpu_not_supported_by_driver"]


def test_probe_legacy_names_the_branch():
    text = ("NVRM: The NVIDIA Tesla V100-SXM2-32GB GPU installed in this system is\n"
            "NVRM:  supported through the NVIDIA 580.xx Legacy drivers.\n")
    failures = node_signals.probe_failures(text)
    assert [(f["reason"], f["legacy_branch"], f["gpu_name"]) for f in failures] == [
        ("legacy", "580.xx", "Tesla V100-SXM2-32GB")]


# --- follow-on Xids --------------------------------------------------------------------------


FOLLOW_ON = ("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149\n"
             "kernel: NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c caused by previous Xid 145\n")


def test_follow_on_xid_without_its_root_takes_the_roots_class():
    # Lines as posted in NVIDIA/open-gpu-kernel-modules issue 1150: the roots are not in the log.
    events = {event["pci_bus_id"]: event for event in kernel_log.parse_kernel_log(FOLLOW_ON)["events"]}
    dc, ed = events["0000:dc:00.0"], events["0000:ed:00.0"]
    assert (dc["xid"], dc["caused_by_xid"], dc["root_in_log"]) == (45, 149, False)
    assert dc["classified_by_root"] is True and dc["fatal"] is True and dc["action"] == "reset_gpu"
    assert (ed["caused_by_xid"], ed["root_in_log"]) == (145, False)


def test_follow_on_xid_with_its_root_keeps_its_own_class():
    root = "kernel: NVRM: Xid (PCI:0000:dc:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x0)\n"
    events = kernel_log.parse_kernel_log(root + FOLLOW_ON.splitlines()[0])["events"]
    follow = [event for event in events if event["xid"] == 45][0]
    assert follow["root_in_log"] is True and follow["classified_by_root"] is False
    assert follow["action"] == kernel_log.classify(45)["action"]
    assert [event["caused_by_xid"] for event in events if event["xid"] == 149] == [None]


# --- escaped multi-line messages ---------------------------------------------------------------


def test_rsyslog_octal_escapes_are_decoded_before_reading():
    line = ("Mar  3 10:00:00 gpu-node kernel: [   12.5] NVRM: API mismatch: the client has the version 535.183.01, "
            "but#012NVRM: this kernel module has the version 535.161.08.  Please#012NVRM: make sure that this "
            "kernel module and all NVIDIA driver#012NVRM: components have the same version.\n")
    parsed = kernel_log.parse_kernel_log(line)
    assert [(m["client_version"], m["kernel_module_version"]) for m in parsed["api_mismatches"]] == [
        ("535.183.01", "535.161.08")]
    assert kernel_log_coverage.unrecognised_lines(line)["count"] == 0


def test_literal_backslash_n_is_decoded():
    assert kernel_log.decode_escapes("NVRM: a\\nNVRM: b") == "NVRM: a\nNVRM: b"
    assert kernel_log.decode_escapes("tab#011x") == "tab\tx"
    assert kernel_log.decode_escapes(None) is None


def test_journald_blob_is_unrecognised_at_error_level():
    text = "Mar 03 10:00:01 gpu-node kernel: [355B blob data]\n"
    found = kernel_log_coverage.unrecognised_lines(text)
    assert (found["count"], found["error_count"]) == (1, 1)
    assert found["lines"][0]["blob"] is True and found["by_source"] == {"journald": 1}


# --- fail loud on what no rule reads --------------------------------------------------------


UNKNOWN_ERROR = "[  301.25] NVRM: GPU 0000:4e:00.0: knvlinkCoreShutdownDeviceLinks_IMPL: link 3 shutdown failed\n"


def test_unknown_nvrm_error_line_is_kept_with_its_bus_id():
    found = kernel_log_coverage.unrecognised_lines("[  1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  "
                                                   "580.95.05\n" + UNKNOWN_ERROR)
    assert (found["count"], found["error_count"], found["informational_lines"]) == (1, 1, 1)
    assert found["lines"] == [{"line": UNKNOWN_ERROR.strip(), "level": "error", "blob": False,
                               "pci_bus_id": "0000:4e:00.0"}]
    assert found["by_source"] == {"NVRM": 1}


@pytest.mark.parametrize("line, level", [
    ("<3>[  5.0] NVRM: something new here", "error"),
    ("<6>[  5.0] NVRM: GPU 0000:4e:00.0: link training failed", "info"),   # the printed level wins
    ("kern  :warn  : [  5.0] nvidia-modeset: something new here", "warning"),
    ("node-a: kern: err: [2026-04-22T21:30:51.1Z]: NVRM: something new here", "error"),
    ("[  5.0] nvidia_uvm: something new here", "info"),
    ("[  5.0] nvidia-peermem: could not register the peer memory client", "error"),
])
def test_level_from_the_prefix_or_from_the_words(line, level):
    found = kernel_log_coverage.unrecognised_lines(line + "\n")
    assert [entry["level"] for entry in found["lines"]] == [level]


def test_case06_rpc_dump_is_context_of_the_xid():
    found = kernel_log_coverage.unrecognised_lines(_case("06-xid119-gsp-rpc-timeout", "input.log").decode())
    assert found["count"] == 0 and found["context_lines"] == 21


def test_case30_core_dump_line_is_a_warning_not_unknown():
    text = _case("30-xid154-gsp-reset-required-talos-log", "input.log").decode()
    found = kernel_log_coverage.unrecognised_lines(text)
    assert (found["count"], found["error_count"]) == (1, 0)
    assert found["lines"][0]["level"] == "warning"


def test_unknown_error_line_makes_the_node_unknown_and_not_verified():
    facts = _bundle(dmesg_txt=UNKNOWN_ERROR.encode())
    assert facts["health"]["state"] == "unknown" and facts["health"]["healthy"] is False
    assert "knvlinkCoreShutdownDeviceLinks_IMPL" in facts["health"]["unknown"][0]
    assert facts["headline"]["verdict"] == "unknown"
    assert "kernel_log_unrecognised" in facts["headline"]["unknown"]
    assert facts["headline"]["action"] == "read_unrecognised"

    after = _healthy_doc("620.70.06")
    after["kernel_log_unrecognised"] = kernel_log_coverage.unrecognised_lines(UNKNOWN_ERROR)
    verdict = verify_upgrade(after, _healthy_doc("580.95.05"), "620.70.06", options={"rebooted": True})
    assert verdict["ok"] is False and "health_unknown" in verdict["flags"]
    assert any("knvlinkCoreShutdownDeviceLinks_IMPL" in reason for reason in verdict["reasons"])
    clean = verify_upgrade(_healthy_doc("620.70.06"), _healthy_doc("580.95.05"), "620.70.06",
                           options={"rebooted": True})
    assert clean["ok"] is True, clean["reasons"]


# --- throttle reasons and the GPU fabric -------------------------------------------------------


def _healthy_doc(version, gpus=2):
    doc = new_facts("nvml")
    doc["driver"].update(userspace_version=version, loaded_version=version, on_disk_version=version,
                         state="ok", branch=version.split(".")[0])
    for index in range(gpus):
        gpu = new_gpu(index)
        gpu.update(uuid="GPU-%08d-0000-0000-0000-000000000000" % index, pci_bus_id="0000:%02x:00.0" % (0x18 + index))
        gpu["clocks_event_reasons"] = ["gpu_idle"]
        doc["gpus"].append(gpu)
    doc["gpu_count"] = doc["attached_gpus"] = gpus
    doc["xid_summary"] = kernel_log.summarize_xids([])
    return doc


@pytest.mark.parametrize("reasons, state", [
    (["gpu_idle"], "healthy"),
    (["applications_clocks_setting", "sw_power_cap"], "healthy"),
    (["hw_slowdown"], "degraded"),
    (["gpu_idle", "hw_power_brake_slowdown"], "degraded"),
    (["sw_thermal_slowdown"], "degraded"),
])
def test_clocks_event_reasons_judged(reasons, state):
    doc = _healthy_doc("580.95.05")
    doc["gpus"][1]["clocks_event_reasons"] = reasons
    health = node_health(doc)
    assert health["state"] == state and health["healthy"] is (state == "healthy")
    if state == "degraded":
        assert node_headline(dict(doc, health=health))["verdict"] == "degraded"
        assert "gpu_degraded" in healthy(doc)["flags"]


@pytest.mark.parametrize("fabric, usable", [
    (None, True),
    ({"state": None, "status": None}, True),
    ({"state": "completed", "status": "Success"}, True),
    ({"state": "in_progress", "status": None}, False),
    ({"state": "not_started", "status": None}, False),
    ({"state": "completed", "status": "Failure"}, False),
])
def test_gpu_fabric_state_decides_usable(fabric, usable):
    # Field case 43: fabric "In Progress" on every B200 while nvidia-smi otherwise looks healthy.
    doc = _healthy_doc("580.126.20")
    if fabric is not None:
        doc["gpus"][0]["fabric"] = fabric
    health = node_health(doc)
    assert (not health["gpus"]) is usable
    if not usable:
        assert health["gpus"][0]["action"] == "reset_gpu"
        assert "nvidia-fabricmanager" in health["gpus"][0]["signals"][0]["reason"]


def test_dev_kmsg_records_and_bare_kernel_prefix_are_read():
    kmsg = "3,3964,206764307,-;NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.\n"
    events = kernel_log.parse_kernel_log(kmsg)["events"]
    assert [(e["xid"], e["time"], e["pci_bus_id"]) for e in events] == [(79, 206.764307, "0000:18:00.0")]
    found = kernel_log_coverage.unrecognised_lines("3,3965,206764400,-;NVRM: GPU 0000:18:00.0: a new failure\n")
    assert [entry["level"] for entry in found["lines"]] == ["error"]  # priority 3: err
    bare = kernel_log_coverage.unrecognised_lines("kernel: nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver\n")
    assert (bare["nvidia_lines"], bare["informational_lines"], bare["count"]) == (1, 1, 0)
