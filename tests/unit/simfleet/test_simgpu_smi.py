# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulated nvidia-smi and dmesg: same state as NVML, real shapes, messages and exit codes."""

import os
import xml.etree.ElementTree as ET

import pytest

from simfleet.gpu.faults import apply_fault, apply_fault_to_file
from simfleet.gpu.state import initial_state

CASE_01 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "cases",
                       "01-a100-sxm4-mig-xml-v12", "input.xml")


def _xml(node, *argv):
    code, out, _err = node.smi("-q", "-x", *argv)
    assert code == 0
    return out, ET.fromstring(out.split("\n", 2)[2])


def test_xml_carries_the_state_values(make_node):
    node = make_node("h100", version="580.126.20")
    out, doc = _xml(node)
    assert '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">' in out
    assert doc.findtext("driver_version") == "580.126.20"
    assert doc.findtext("cuda_version") == "13.0"
    assert doc.findtext("attached_gpus") == "8"
    state = node.state()
    gpus = doc.findall("gpu")
    assert [g.get("id") for g in gpus] == [g["pci"]["bus_id"] for g in state["gpus"]]
    first, want = gpus[0], state["gpus"][0]
    assert first.findtext("uuid") == want["uuid"]
    assert first.findtext("serial") == want["serial"]
    assert first.findtext("product_architecture") == "Hopper"
    assert first.findtext("gpu_power_readings/current_power_limit") == "700.00 W"
    assert first.findtext("gpu_power_readings/min_power_limit") == "200.00 W"
    assert first.findtext("gpu_power_readings/instant_power_draw") == "68.92 W"
    assert first.findtext("ecc_mode/current_ecc") == "Enabled"
    assert first.findtext("mig_mode/pending_mig") == "Disabled"
    assert first.findtext("persistence_mode") == "Disabled"
    assert first.findtext("pci/pci_gpu_link_info/pcie_gen/current_link_gen") == "5"
    assert first.findtext("fb_memory_usage/total") == "81559 MiB"
    assert first.findtext("remapped_rows/remapped_row_pending") == "No"
    assert first.findtext("retired_pages/pending_retirement") == "N/A"


def test_setters_seen_by_xml_and_pending_ecc_after_boot(make_node, nvml):
    node = make_node("h100")
    assert node.smi("-i", "1", "-pl", "450")[0] == 0
    assert node.smi("-i", "1", "-e", "0")[0] == 0
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetPowerManagementLimit(handle) == 450000
    nvml.nvmlShutdown()
    _out, doc = _xml(node, "-i", "1")
    gpu = doc.find("gpu")
    assert gpu.findtext("gpu_power_readings/current_power_limit") == "450.00 W"
    assert (gpu.findtext("ecc_mode/current_ecc"), gpu.findtext("ecc_mode/pending_ecc")) == ("Enabled", "Disabled")
    node.boot()
    _out, doc = _xml(node, "-i", "1")
    gpu = doc.find("gpu")
    assert gpu.findtext("gpu_power_readings/current_power_limit") == "700.00 W"
    assert (gpu.findtext("ecc_mode/current_ecc"), gpu.findtext("ecc_mode/pending_ecc")) == ("Disabled", "Disabled")


def test_r535_xml_has_the_v12_elements_of_the_field_capture(make_node):
    """Every element of the real A100 capture (driver 535.54.03) is there, in the same order."""
    node = make_node("a100", version="535.129.03", flavor="proprietary")
    nvml_order = [child.tag for child in ET.parse(CASE_01).getroot().find("gpu")]
    _out, doc = _xml(node, "-i", "0")
    ours = [child.tag for child in doc.find("gpu")]
    assert [tag for tag in ours if tag in nvml_order] == nvml_order
    assert doc.find("gpu").findtext("gpu_power_readings/power_draw") == "54.31 W"


def test_mig_on_reports_devices_and_na_like_the_real_tool(make_node, nvml):
    node = make_node("a100", version="535.129.03", flavor="proprietary")
    node.smi("-i", "0", "-mig", "1")
    node.smi("-i", "0", "-r")
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    for _instance in range(3):
        gi = nvml.nvmlDeviceCreateGpuInstance(handle, 14)  # MIG 2g.10gb
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, 1)
    _out, doc = _xml(node, "-i", "0")
    gpu = doc.find("gpu")
    devices = gpu.findall("mig_devices/mig_device")
    assert [d.findtext("gpu_instance_id") for d in devices] == ["3", "4", "5"]
    assert devices[0].findtext("device_attributes/shared/multiprocessor_count") == "28"
    assert devices[0].findtext("fb_memory_usage/total") == "9856 MiB"
    assert gpu.findtext("utilization/gpu_util") == "N/A"
    assert gpu.findtext("remapped_rows") == "N/A"
    code, out, _err = node.smi("-L")
    assert code == 0
    assert out.count("  MIG 2g.10gb") == 3


def test_query_gpu_csv(make_node):
    state = apply_fault(initial_state("l40s", "n1"), "nvml_not_supported", {"field": "power_usage", "gpu": 3})
    node = make_node("l40s", state=state)
    code, out, _err = node.smi("--query-gpu=index,name,power.limit,power.draw,memory.total,mig.mode.current",
                               "--format=csv")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "index, name, power.limit [W], power.draw [W], memory.total [MiB], mig.mode.current"
    assert lines[1] == "0, NVIDIA L40S, 350.00 W, 34.52 W, 46068 MiB, [Not Supported]"
    assert lines[4] == "3, NVIDIA L40S, 350.00 W, [Not Supported], 46068 MiB, [Not Supported]"
    code, out, _err = node.smi("--query-gpu=power.default_limit,pci.bus_id", "--format=csv,noheader,nounits", "-i", "2")
    assert out == "350.00, 00000000:A1:00.0\n"
    code, out, _err = node.smi("--query-gpu=power.bogus", "--format=csv")
    assert (code, out) == (2, 'Field "power.bogus" is not a valid field to query.\n\n')


def test_power_limit_messages(make_node, monkeypatch):
    node = make_node("h100")
    code, out, _err = node.smi("-i", "0", "-pl", "50")
    assert code == 2
    assert out.splitlines()[0] == ("Provided power limit 50.00 W is not a valid power limit which should be "
                                   "between 200.00 W and 700.00 W for GPU 00000000:18:00.0")
    code, out, _err = node.smi("-i", "0", "-pl", "500")
    assert code == 0
    assert out.splitlines()[0] == "Power limit for GPU 00000000:18:00.0 was set to 500.00 W from 700.00 W."
    apply_fault_to_file(node.state_path, "nvml_not_supported", ["power_limit", "1"])
    code, out, _err = node.smi("-i", "1", "-pl", "500")
    assert (code, out) == (0, "Changing power management limit is not supported for GPU: 00000000:2A:00.0.\n"
                              "Treating as warning and moving on.\nAll done.\n")
    monkeypatch.setenv("SIMGPU_FAKE_UID", "1000")
    code, out, _err = node.smi("-i", "2", "-pl", "500")
    assert code == 4
    assert out.splitlines()[0] == "Failed to set power management limit for GPU 00000000:3A:00.0: Insufficient Permissions"


def test_init_failure_messages(make_node):
    node = make_node("h100", boot=False)
    code, out, _err = node.smi()
    assert code == 9
    assert out.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    os.unlink(os.path.join(node.root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))
    code, out, _err = node.smi("-L")
    assert code == 12
    assert out.startswith("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.")


@pytest.mark.parametrize("profile, version, flavor, message", [
    ("v100", "580.126.20", "open", "NVRM: installed in this system is not supported by open"),
    ("b200", "580.126.20", "proprietary", "NVRM: installed in this system requires use of the NVIDIA open kernel modules."),
    ("v100", "595.71.05", "proprietary", "NVRM:  supported through the NVIDIA 580.xx Legacy drivers."),
    ("b200", "535.129.03", "open", "NVRM: NVIDIA 535.129.03 driver release."),
])
def test_module_refuses_gpus_it_cannot_drive(make_node, profile, version, flavor, message):
    node = make_node(profile, version=version, flavor=flavor, boot=False)
    result = node.boot()
    assert (result["loaded"], result["reason"]) == (None, "no_supported_gpu")
    _code, log = node.dmesg("-t")
    assert message in log.splitlines()
    assert "NVRM: None of the NVIDIA devices were initialized." in log.splitlines()
    assert node.smi()[0] == 9


def test_supported_pairs_load(make_node):
    assert make_node("v100", version="580.178.04", flavor="proprietary", boot=False).boot()["loaded"] == {
        "version": "580.178.04", "flavor": "proprietary"}


def test_dmesg_formats_and_xid_storm(make_node):
    node = make_node("h100")
    apply_fault_to_file(node.state_path, "xid_storm", {"xid": 119, "count": 5, "gpu": 4})
    code, log = node.dmesg()
    assert code == 0
    lines = log.splitlines()
    assert lines[0].startswith("[    0.000000] Linux version 6.1.0-31-amd64 ")
    assert "[    4.101217] nvidia: loading out-of-tree module taints kernel." in lines
    xids = [line for line in lines if "NVRM: Xid (PCI:0000:9a:00): 119, pid=" in line]
    assert len(xids) == 5
    _code, human = node.dmesg("-T")
    assert human.splitlines()[0].startswith("[")
    assert human.splitlines()[0][25] == "]"
    assert node.dmesg("--bogus")[0] == 1


def test_fabric_manager_needs_the_exact_driver_version(make_node):
    from simgpu import daemons

    node = make_node("h100", version="580.126.20")
    _out, doc = _xml(node, "-i", "0")
    assert doc.find("gpu").findtext("fabric/state") == "In Progress"
    import io

    out = io.StringIO()
    assert daemons.fabricmanager_main(["--version", "580.105.08"], root=node.root, stdout=out) == 1
    assert out.getvalue() == ("fabric manager NVIDIA GPU driver interface version 580.105.08 don't match with driver "
                              "version 580.126.20. Please update with matching NVIDIA driver package.\n")
    assert daemons.fabricmanager_main(["--version", "580.126.20"], root=node.root, stdout=out) == 0
    _out, doc = _xml(node, "-i", "0")
    assert doc.find("gpu").findtext("fabric/state") == "Completed"
