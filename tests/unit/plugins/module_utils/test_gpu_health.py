"""Health signals in every form: field cases 30, 32, 33 and 04, the NVML recovery action, nvidia-smi's words."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import captures  # noqa: E402  pylint: disable=wrong-import-position
from simnode import SIMFLEET  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
from simfleet.gpu import load_pynvml as load_sim_pynvml  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.state import boot_node_root, initial_state, write_node_root  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import assemble_facts  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_health import node_health  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.kernel_log import parse_kernel_log  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.node_signals import (  # noqa: E402
    module_load_failures,
    module_signer,
    parse_mokutil_sb_state,
    reset_required_messages,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import read_nvml  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_verdict import healthy, verify_upgrade  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_xml import parse_nvidia_smi_xml  # noqa: E402

CASE30 = "30-xid154-gsp-reset-required-talos-log"
CASE32 = "32-nvidia-peermem-ib-core-symbol-mismatch-gb300"
CASE33 = "33-signed-module-rejected-secure-boot"


def case(name, filename):
    with open(os.path.join(captures.CASES, name, filename), encoding="utf-8") as handle:
        return handle.read()


def h100_xml():
    with open(os.path.join(captures.CASES, "..", "smi", "h100-sxm5-r580-v13.xml"), encoding="utf-8") as handle:
        return handle.read()


# --- case 30: Talos log, Xid 154 "GPU Reset Required" ------------------------------------------------

def test_case30_talos_xid154_is_read_with_its_time():
    events = parse_kernel_log(case(CASE30, "input.log"))["events"]
    assert len(events) == 1
    event = events[0]
    assert (event["xid"], event["pci_bus_id"]) == (154, "0000:0b:00.0")
    assert event["time"] == event["wall_time"] == "2026-04-22T21:30:51.870495804Z"
    assert event["epoch_s"] == 1776893451.870496  # 2026-04-22T21:30:51.870496Z
    assert (event["severity"], event["action"]) == ("critical", "reset_gpu")
    assert event["message"].endswith("to 0x1 (GPU Reset Required)")


def test_case30_unnumbered_reset_message_is_a_signal_but_no_xid():
    messages = reset_required_messages(case(CASE30, "input.log"))
    assert [m["time"] for m in messages] == ["2026-04-22T21:30:51.526447914Z"]
    assert messages[0]["pci_bus_id"] is None
    assert "GPU marked for reset" in messages[0]["message"]


def test_case30_gpu_is_not_healthy_and_a_canary_fails_verification():
    facts = assemble_facts({"smi_xml": h100_xml(), "kernel_log": case(CASE30, "input.log").replace(
        "0000:0b:00", "0000:18:00")})
    health = facts["health"]
    assert health["healthy"] is False
    assert [(g["index"], g["pci_bus_id"], g["action"]) for g in health["gpus"]] == [(0, "0000:18:00.0", "reset_gpu")]
    assert health["gpus"][0]["signals"][0]["source"] == "xid"
    # The unnumbered "GPU marked for reset" line names no GPU: a node problem that a reset or reboot clears.
    assert [(p["kind"], p["reboot_fixes"]) for p in health["problems"]] == [("gpu_reset_required_unattributed", True)]
    verdict = healthy(facts)
    assert "gpu_not_usable" in verdict["flags"] and "fatal_xid" not in verdict["flags"]
    assert "GPU 0000:18:00.0 (serial 1650000000001, GPU-00000000-0000-0000-0000-0000000000a0): reset_gpu: Xid 154" \
        in verdict["details"]["gpu_not_usable"]
    after = dict(facts, driver=dict(facts["driver"], state="ok", loaded_version="580.95.05",
                                    on_disk_version="580.95.05"))
    checked = verify_upgrade(after, after, "580.95.05", options={"rebooted": True})
    assert checked["ok"] is False and "gpu_not_usable" in checked["flags"]


# --- case 32: nvidia_peermem refused by ib_core ------------------------------------------------------

def test_case32_peermem_symbol_mismatch_is_one_node_problem():
    log = case(CASE32, "input-dmesg.log") + case(CASE32, "input-peermem-ctr.log")
    failures = module_load_failures(log)
    assert len(failures) == 1
    failure = failures[0]
    assert (failure["module"], failure["reason"], failure["error"], failure["count"]) == (
        "nvidia_peermem", "symbol_version_mismatch", -22, 8)
    assert failure["symbols"] == ["ib_register_peer_memory_client", "ib_unregister_peer_memory_client"]
    assert (failure["first_time"], failure["last_time"]) == ("Tue Sep  8 17:16:02 2026", "Tue Sep  8 17:21:18 2026")
    assert parse_kernel_log(log)["events"] == []  # not an Xid


def test_case32_gpus_look_fine_but_gpudirect_rdma_is_gone():
    facts = assemble_facts({"smi_xml": h100_xml(), "kernel_log": case(CASE32, "input-dmesg.log"),
                            "peermem_version": None})
    assert facts["gpu_count"] == 2 and facts["xid_events"] == []
    assert facts["node"]["peermem_state"] == "failed" and facts["contract"]["node"]["peermem_state"] == "failed"
    health = facts["health"]
    assert health["gpus"] == []
    assert len(health["problems"]) == 1
    problem = health["problems"][0]
    assert problem["kind"] == "peermem_not_loaded" and problem["reboot_fixes"] is False
    assert "GPUDirect RDMA is unavailable" in problem["reason"]
    assert "ib_register_peer_memory_client" in problem["reason"] and "error -22" in problem["reason"]
    assert "the InfiniBand stack, the NVIDIA driver, nvidia_peermem" in problem["remedy"]
    assert "node_problem" in healthy(facts)["flags"]


# --- case 33: signed module refused under Secure Boot ------------------------------------------------

def case33_inputs(**extra):
    inputs = {"modinfo": case(CASE33, "input-deepin-2144-modinfo.txt"),
              "running_kernel": "6.18.48-amd64-desktop-rolling",
              "modules_find": case(CASE33, "input-deepin-2144-module-path.txt"),
              "smi_error": case(CASE33, "input-deepin-2144-nvidia-smi.txt"),
              "mokutil_sb_state": "SecureBoot enabled\n", "sys_module_version": None}
    inputs.update(extra)
    return inputs


def test_case33_not_loaded_signature_refused_and_reboot_will_not_fix_it():
    facts = assemble_facts(case33_inputs())
    driver = facts["driver"]
    assert driver["state"] == "not_loaded"
    assert driver["on_disk_version"] == "580.119.02"
    assert driver["not_loaded_cause"] == "module_signature_rejected"
    reasons = " ".join(driver["state_reasons"])
    assert 'signed by "DKMS module signing key"' in reasons
    assert "A reboot into the same kernel will not fix it" in reasons
    assert "Machine Owner Key" in reasons and "signed precompiled modules" in reasons
    assert facts["node"]["secure_boot"] is True and facts["node"]["module_signer_trusted"] is False
    problems = facts["health"]["problems"]
    assert [(p["kind"], p["reboot_fixes"]) for p in problems] == [("module_signature_rejected", False)]
    assert "mokutil --import" in problems[0]["remedy"] and "signed precompiled modules" in problems[0]["remedy"]


def test_case33_kernel_refusal_line_is_certain_evidence_even_without_mokutil():
    # The kernel's own words (kernel/module/signing.c) for a module whose key the kernel does not trust.
    log = "[    7.312001] Loading of module with unavailable key is rejected\n"
    assert module_load_failures(log)[0]["reason"] == "signature_rejected"
    facts = assemble_facts(case33_inputs(mokutil_sb_state=None, kernel_log=log))
    assert facts["driver"]["state"] == "not_loaded"
    assert "The kernel refused the module's signature" in " ".join(facts["driver"]["state_reasons"])
    assert facts["health"]["problems"][0]["kind"] == "module_signature_rejected"


def test_case33_without_secure_boot_not_loaded_is_not_blamed_on_the_signature():
    facts = assemble_facts(case33_inputs(mokutil_sb_state="SecureBoot disabled\n"))
    assert facts["driver"]["state"] == "not_loaded"
    assert facts["driver"]["not_loaded_cause"] is None
    assert facts["health"]["problems"] == []


def test_node_signal_parsers():
    assert module_signer(case(CASE33, "input-deepin-2144-modinfo.txt")) == "DKMS module signing key"
    assert module_signer("version: 580.119.02\nname: nvidia\n") is None
    assert parse_mokutil_sb_state("SecureBoot enabled") is True
    assert parse_mokutil_sb_state("SecureBoot disabled\nPlatform is in Setup Mode") is False
    assert parse_mokutil_sb_state("EFI variables are not supported on this system") is False
    assert parse_mokutil_sb_state("mokutil: command failed") is None
    refused = module_load_failures("modprobe: ERROR: could not insert 'nvidia': Key was rejected by service\n")
    assert [(f["module"], f["reason"]) for f in refused] == [("nvidia", "signature_rejected")]


# --- the same kind in other forms: NVML field, nvidia-smi value, remapped rows (case 04) ------------

def test_nvml_recovery_action_field_marks_the_gpu(tmp_path, monkeypatch):
    root = str(tmp_path / "root")
    state = initial_state("h100", "node-h100")
    state["gpus"][5]["recovery_action"] = 1  # NVML_GPU_RECOVERY_ACTION_GPU_RESET
    write_node_root(root, state, userspace_version="580.126.20")
    boot_node_root(root)
    monkeypatch.setenv("SIMGPU_ROOT", root)
    facts = assemble_facts({"nvml": read_nvml(load_sim_pynvml())})
    assert [g["extended"]["recovery_action"] for g in facts["gpus"]] == ["none"] * 5 + ["gpu_reset"] + ["none"] * 2
    assert [(g["index"], g["action"], g["signals"][0]["source"]) for g in facts["health"]["gpus"]] == [
        (5, "reset_gpu", "field")]


def test_nvidia_smi_gpu_requires_reset_value_marks_the_gpu():
    text = h100_xml().replace("<performance_state>P0</performance_state>",
                              "<performance_state>[GPU requires reset]</performance_state>", 1)
    gpus = parse_nvidia_smi_xml(text)["gpus"]
    assert gpus[0]["errors"] == ["GpuRequiresReset"] and gpus[1]["errors"] == []
    assert gpus[0]["extended"]["performance_state"] is None
    health = node_health({"gpus": gpus})
    assert [(g["index"], g["action"]) for g in health["gpus"]] == [(0, "reset_gpu")]


def test_case04_remapped_row_pending_needs_a_reset_although_reset_required_says_no():
    facts = assemble_facts(captures.read("a10-remap-pending"), capture=True)
    assert [(g["action"], g["signals"][0]["source"]) for g in facts["health"]["gpus"]] == [("reset_gpu", "field")]
    assert "row remapping waits for a GPU reset" in facts["health"]["gpus"][0]["signals"][0]["reason"]


def test_ignored_xids_and_application_xids_leave_the_gpu_usable():
    facts = assemble_facts(captures.read("xid-app-and-109"), capture=True)
    gpus = [{"index": 0, "pci_bus_id": e["pci_bus_id"]} for e in facts["xid_events"][:1]]
    facts["gpus"] = gpus
    assert {s["reason"].split(" ")[1] for s in node_health(facts)["gpus"][0]["signals"]} == {"109"}
    assert node_health(facts, ignore_xids=[109])["gpus"] == []


def test_an_unsigned_module_loaded_with_a_tainted_kernel_is_not_a_refusal():
    tainted = "nvidia: module verification failed: signature and/or required key missing - tainting kernel\n"
    assert module_load_failures(tainted) == []
