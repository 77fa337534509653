"""The hardware contract read through the NVML double, nvidia-smi XML captures and a capture bundle."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import captures  # noqa: E402  pylint: disable=wrong-import-position
from simnode import SIMFLEET  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
from simfleet.gpu import load_pynvml as load_sim_pynvml  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.faults import apply_fault  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.state import boot_node_root, initial_state, write_node_root  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.module_utils.contract import (  # noqa: E402
    GPU_FIELDS,
    NODE_FIELDS,
    UNIT_FIELDS,
    contract_from_facts,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import assemble_facts  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import read_nvml  # noqa: E402

SMI = os.path.join(captures.CASES, "..", "smi")


def smi(name):
    with open(os.path.join(SMI, name), encoding="utf-8") as handle:
        return handle.read()


@pytest.fixture(name="sim_node")
def fixture_sim_node(tmp_path, monkeypatch):
    def make(profile, mutate=None, flavor="open"):
        root = str(tmp_path / profile)
        state = initial_state(profile, "node-%s" % profile)
        if mutate:
            mutate(state)
        write_node_root(root, state, userspace_version="580.126.20", flavor=flavor)
        boot_node_root(root)
        monkeypatch.setenv("SIMGPU_ROOT", root)
        return load_sim_pynvml()
    return make


def test_h100_contract_through_nvml(sim_node):
    facts = assemble_facts({"nvml": read_nvml(sim_node("h100")), "running_kernel": "6.1.0-28-amd64"})
    contract = facts["contract"]
    assert contract["source"] == "nvml" and len(contract["gpus"]) == 8
    gpu = contract["gpus"][0]
    assert (gpu["power_default_limit_w"], gpu["power_enforced_limit_w"], gpu["power_min_limit_w"],
            gpu["power_max_limit_w"]) == (700.0, 700.0, 200.0, 700.0)
    assert (gpu["sm_clock_max_mhz"], gpu["mem_clock_max_mhz"]) == (1980, 2619)
    assert (gpu["app_clock_default_graphics_mhz"], gpu["app_clock_default_mem_mhz"]) == (1980, 2619)
    # nvmlDeviceGetMemoryInfo_v2: 81559 MiB in all, 480 MiB of it reserved by the driver.
    assert (gpu["memory_total_mib"], gpu["memory_reserved_mib"], gpu["bar1_total_mib"]) == (81559, 480, 131072)
    assert gpu["mig_capable"] is True
    assert gpu["mig_profiles_offered"] == sorted(
        ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"])
    assert (gpu["pcie_gen_attainable"], gpu["pcie_width_max"]) == (5, 16)
    assert gpu["gsp_firmware_version"] == "580.126.20"
    assert (gpu["idle_performance_state"], gpu["idle_clocks_event_reasons"]) == ("P0", ["gpu_idle"])
    assert (gpu["persistence_mode"], gpu["compute_mode"], gpu["ecc_current"], gpu["ecc_pending"]) == (
        False, "Default", True, True)
    node = contract["node"]
    assert (node["driver_userspace_version"], node["cuda_driver_version"], node["kernel"]) == (
        "580.126.20", "13.0", "6.1.0-28-amd64")
    # Per-unit values are kept apart, one per GPU, and are not in the contract values.
    assert len({unit["uuid"] for unit in contract["units"]}) == 8
    assert not set(UNIT_FIELDS) - {"index"} & set(gpu)


def test_the_gpus_of_one_node_share_their_contract_values(sim_node):
    contract = contract_from_facts(assemble_facts({"nvml": read_nvml(sim_node("a100"))}))
    values = [dict((k, v) for k, v in gpu.items() if k != "index") for gpu in contract["gpus"]]
    assert all(value == values[0] for value in values)
    assert values[0]["memory_reserved_mib"] == 634 and values[0]["power_default_limit_w"] == 400.0


def test_unsupported_field_is_null_not_zero(sim_node):
    def volta_like(state):
        apply_fault(state, "nvml_not_supported", {"field": "power_limit", "gpu": 2})
    contract = contract_from_facts(assemble_facts({"nvml": read_nvml(sim_node("v100", volta_like, flavor="proprietary"))}))
    assert contract["gpus"][2]["power_max_limit_w"] is None
    assert contract["gpus"][1]["power_max_limit_w"] == 300.0
    gpu = contract["gpus"][0]
    # Volta: no GSP firmware, no MIG (NotSupported → not capable, no profiles), no reserved memory reported.
    assert gpu["gsp_firmware_version"] is None
    assert (gpu["mig_capable"], gpu["mig_profiles_offered"]) == (False, [])


def test_h100_xml_capture_contract():
    contract = contract_from_facts(assemble_facts({"smi_xml": smi("h100-sxm5-r580-v13.xml")}))
    idle, busy = contract["gpus"]
    assert contract["node"]["driver_userspace_version"] == "580.95.05"
    assert contract["node"]["cuda_driver_version"] == "13.0"
    assert (idle["memory_total_mib"], idle["memory_reserved_mib"], idle["bar1_total_mib"]) == (81559, 545, 131072)
    assert (idle["app_clock_default_graphics_mhz"], idle["app_clock_default_mem_mhz"]) == (1755, 2619)
    assert idle["gsp_firmware_version"] == "580.95.05" and idle["vbios_version"] == "96.00.99.00.01"
    assert (idle["idle_performance_state"], idle["idle_clocks_event_reasons"]) == ("P0", ["gpu_idle"])
    assert idle["mig_profiles_offered"] is None  # nvidia-smi -q -x does not list them: unknown, not none
    # GPU 1 runs a process: its P-state and clocks event reasons say nothing about idle.
    assert (busy["idle_performance_state"], busy["idle_clocks_event_reasons"]) == (None, None)
    assert busy["power_enforced_limit_w"] == 500.0 and busy["power_default_limit_w"] == 700.0


def test_v100_xml_capture_contract():
    contract = contract_from_facts(assemble_facts({"smi_xml": smi("v100-sxm2-r515-v11.xml")}))
    gpu = contract["gpus"][1]
    assert (gpu["power_enforced_limit_w"], gpu["power_max_limit_w"]) == (250.0, 300.0)
    assert gpu["ecc_pending"] is False
    assert gpu["pcie_width_max"] == 16


def test_case01_a100_mig_capture_contract():
    facts = assemble_facts(captures.read("a100-mig"), capture=True)
    gpu = facts["contract"]["gpus"][0]
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu["mig_capable"] is True
    assert gpu["power_default_limit_w"] == 500.0


def test_field_lists_match_what_is_built():
    contract = contract_from_facts(assemble_facts({"smi_xml": smi("h100-sxm5-r580-v13.xml")}))
    assert sorted(contract["gpus"][0]) == sorted([key for key, _u, _l, _s in GPU_FIELDS] + ["index"])
    assert sorted(contract["node"]) == sorted(key for key, _u, _l, _s in NODE_FIELDS)
    assert sorted(contract["units"][0]) == sorted(UNIT_FIELDS)
    for key, unit, _label, _source in GPU_FIELDS:
        assert (unit is not None) == key.endswith(("_w", "_mhz", "_mib")), key


def test_node_versions_from_packages():
    dpkg = "\n".join([
        "ii  nvidia-fabricmanager   580.126.20-1   amd64   Fabric Manager for NVSwitch based systems",
        "ii  libnvidia-nscq         580.126.20-1   amd64   NVSwitch Configuration and Query library",
        "ii  nvidia-driver-cuda     580.126.20-1   amd64   NVIDIA driver CUDA integration components",
    ])
    facts = assemble_facts({"smi_xml": smi("h100-sxm5-r580-v13.xml"), "dpkg_l": dpkg,
                            "peermem_version": "580.126.20\n", "mokutil_sb_state": "SecureBoot disabled"})
    node = facts["contract"]["node"]
    assert (node["fabricmanager_version"], node["nscq_version"], node["dcgm_version"]) == (
        "580.126.20", "580.126.20", None)
    assert (node["peermem_version"], node["peermem_state"], node["secure_boot"]) == ("580.126.20", "loaded", False)


def test_no_facts_no_contract():
    with pytest.raises(ValueError, match="mapping"):
        contract_from_facts(None)


def test_docs_document_every_contract_field():
    with open(os.path.join(captures.CASES, "..", "..", "..", "docs", "contract.md"), encoding="utf-8") as handle:
        docs = handle.read()
    for key, unit, _label, _source in GPU_FIELDS + NODE_FIELDS:
        assert "| `%s` | %s |" % (key, unit or "—") in docs, key
