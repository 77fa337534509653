"""Facts assembled from capture bundles made of the field cases: their right values."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import captures  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import (  # noqa: E402
    CaptureError,
    assemble_facts,
)


def facts_of(name):
    return assemble_facts(captures.read(name), capture=True)


def test_case01_a100_mig_xml():
    facts = facts_of("a100-mig")
    assert facts["source"] == "capture"
    assert facts["gpu_count"] == 1 and facts["attached_gpus"] == 4
    assert any("attached_gpus=4" in w for w in facts["warnings"])
    gpu = facts["gpus"][0]
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu["mig"]["mode_current"] is True and gpu["mig"]["mode_pending"] is True
    assert [d["gpu_instance_id"] for d in gpu["mig"]["devices"]] == [3, 4, 5, 6]
    assert gpu["utilization_gpu_pct"] is None
    assert gpu["persistence_mode"] is False
    assert gpu["power"]["limit_w"] == 500.0 and gpu["power"]["draw_w"] == 67.03
    assert facts["driver"]["userspace_version"] == "535.54.03"
    assert facts["driver"]["cuda_driver_version"] == "12.2"
    # No module files in the bundle: NVML answered, so loaded == userspace; on disk unchecked.
    assert facts["driver"]["state"] == "ok"
    assert facts["driver"]["on_disk_version"] is None


def test_case04_remapped_rows_pending_from_text():
    gpu = facts_of("a10-remap-pending")["gpus"][0]
    assert gpu["remapped_rows"]["pending"] is True
    assert gpu["remapped_rows"]["uncorrectable"] == 4


def test_case06_xid119_count_and_action():
    facts = facts_of("xid119-gsp")
    assert facts["xid_summary"]["by_xid"] == {"119": 5}
    assert facts["xid_summary"]["rate_limited"] is True
    assert {e["pci_bus_id"] for e in facts["xid_events"]} == {"0000:9b:00.0"}
    assert {e["action"] for e in facts["xid_events"]} == {"reset_gpu"}
    # Nothing but a kernel log: the driver verdict is undetermined, never "ok".
    assert facts["driver"]["state"] is None


def test_case06_kernel_log_alone_headline_names_the_gpu_and_keeps_unknowns_null():
    """Field case 06: only a kernel log with a critical Xid 119 on 0000:9b:00.0."""
    facts = facts_of("xid119-gsp")
    assert facts["gpu_count"] is None and facts["gpus"] == []
    assert facts["kernel_log_gpus"] == [{"pci_bus_id": "0000:9b:00.0", "serial": "0000000000001",
                                         "uuid": "GPU-00000000-0000-0000-0000-000000000001"}]
    reasons = " ".join(facts["driver"]["state_reasons"])
    assert "No NVIDIA driver was seen" not in reasons
    assert "NVRM lines" in reasons and "undetermined" in reasons
    # The GPU the log names is not usable, although no GPU source lists it.
    assert facts["health"]["healthy"] is False
    assert [(g["pci_bus_id"], g["index"], g["listed"], g["action"]) for g in facts["health"]["gpus"]] == [
        ("0000:9b:00.0", None, False, "reset_gpu")]
    headline = facts["headline"]
    assert headline["verdict"] == "unhealthy"
    assert headline["action"] == "reset_gpu"
    assert [(g["gpu"], g["problem"]) for g in headline["gpus"]] == [
        ("GPU 0000:9b:00.0 (serial 0000000000001, GPU-00000000-0000-0000-0000-000000000001)",
         "Xid 119 (GSP RPC timeout)")]
    assert headline["summary"].startswith("unhealthy: 1 GPU(s) not usable (GPU count unknown): GPU 0000:9b:00.0")
    assert "0000:9b:00.0" in headline["next_step"] and "reset" in headline["next_step"]
    assert headline["unknown"] == ["gpu_count", "driver.state", "driver.userspace_version", "driver.loaded_version"]


def test_case01_xml_alone_reasons_do_not_claim_a_loaded_version():
    facts = facts_of("a100-mig")
    driver = facts["driver"]
    assert driver["loaded_version"] is None and driver["state"] == "ok"
    reasons = " ".join(driver["state_reasons"])
    assert "agree" not in reasons
    assert "535.54.03" in reasons and "not read" in reasons
    headline = facts["headline"]
    assert headline["verdict"] == "healthy" and headline["gpus"] == [] and headline["action"] is None
    assert headline["summary"] == "healthy: 1 GPU(s) usable, driver 535.54.03."
    assert headline["unknown"] == ["driver.loaded_version"]


def test_case08_application_xids_are_not_driver_faults():
    facts = facts_of("xid-app-and-109")
    summary = facts["xid_summary"]
    assert summary["by_xid"] == {"13": 3, "31": 1, "109": 2}
    actions = dict((e["xid"], e["action"]) for e in facts["xid_events"])
    assert actions[13] == "check_application" and actions[31] == "check_application"
    assert actions[109] == "reset_gpu"
    assert summary["any_fatal"] is False


def test_case09_xid64_keeps_the_gpu_out_of_the_pool():
    facts = facts_of("xid63-64")
    actions = dict((e["xid"], (e["action"], e["fatal"])) for e in facts["xid_events"])
    assert actions[63] == ("reset_gpu", False)
    assert actions[64] == ("hardware_inspection", True)
    assert facts["xid_summary"]["any_fatal"] is True


def test_case17_nvml_mismatch_is_evidence_not_a_crash_nor_a_claim():
    facts = facts_of("nvml-mismatch-after-unattended-upgrade")
    assert facts["nvml_error"] == "LibRmVersionMismatch"
    # The bundle holds no modinfo: whether a reboot fixes the mismatch is not known, and said so.
    assert facts["driver"]["state"] is None
    assert "modinfo-nvidia.txt" in facts["driver"]["state_reasons"][-1]
    # nvidia-smi failed: the GPUs were not counted, which is not the same as none.
    assert facts["gpu_count"] is None
    assert facts["headline"]["verdict"] == "unknown" and "driver.state" in facts["headline"]["unknown"]


def test_case23_module_older_than_userspace_is_broken():
    facts = facts_of("dkms-module-older-than-userspace")
    driver = facts["driver"]
    assert driver["userspace_version"] == "595.84"
    assert driver["on_disk_version"] == "595.80"
    assert driver["state"] == "broken"
    assert any("reboot will not fix" in reason for reason in driver["state_reasons"])
    assert facts["xid_events"] == []


def test_case24_module_built_for_another_kernel_is_broken_not_lost():
    facts = facts_of("no-module-for-running-kernel")
    driver = facts["driver"]
    assert driver["running_kernel"] == "3.13.0-116-generic"
    assert driver["module_present_for"] == ["3.13.0-88-generic"]
    assert driver["state"] == "broken"
    assert any("not built for the running kernel" in reason for reason in driver["state_reasons"])


def test_case26_switch_ports_downgraded_but_gpu_link_healthy():
    facts = facts_of("pcie-switch-downgraded")
    links = facts["pcie_gpu_links"]
    assert links["gpus"] == [{"pci_bus_id": "0000:19:00.0", "gen_current": 5, "gen_max": 5,
                              "width_current": 16, "width_max": 16, "upstream": "0000:17:01.0",
                              "gen_attainable": 5, "width_attainable": 16, "healthy": True, "note": None}]
    assert links["degraded_gpus"] == []
    assert links["other_downgraded_ports"] == 2
    assert not any("PCIe" in w for w in facts["warnings"])


@pytest.mark.parametrize("filename,data,word", [
    ("nvidia-smi-q.xml", b"<?xml version=\"1.0\" ?>\n<nvidia_smi_log>\n<driver_version>5", "nvidia-smi-q.xml"),
    ("dmesg.txt", b"\x7fELF\x02\x01\x01\x00\x00\x00garbage", "binary"),
    ("modinfo-nvidia.txt", b"\xff\xfe\xfa not utf-8", "UTF-8"),
])
def test_bad_capture_files_give_an_error_naming_the_file(filename, data, word):
    with pytest.raises(CaptureError) as caught:
        assemble_facts({filename: data}, capture=True)
    assert caught.value.filename == filename
    assert word in str(caught.value)


def test_empty_capture_has_nulls_and_no_verdict():
    facts = assemble_facts({}, capture=True)
    assert facts["source"] == "capture"
    assert facts["gpus"] == [] and facts["xid_events"] == []
    assert facts["driver"]["userspace_version"] is None
    assert facts["driver"]["state"] is None


def test_live_host_without_any_driver_is_not_installed():
    facts = assemble_facts({"running_kernel": "6.1.0-28-amd64", "dpkg_l": "", "modinfo":
                            "modinfo: ERROR: Module nvidia not found.\n",
                            "nvml": {"init_error": "LibraryNotFound", "driver": {}, "gpus": [],
                                     "device_count": None, "unsupported": []}})
    assert facts["source"] == "none"
    assert facts["driver"]["state"] == "not_installed"
    assert facts["nvml_error"] == "LibraryNotFound"
