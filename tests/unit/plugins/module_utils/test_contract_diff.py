"""The contract diff of a driver update and the comparison with the golden node, as data and as Markdown lines."""

import copy
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import captures  # noqa: E402  pylint: disable=wrong-import-position
from simnode import SIMFLEET  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
from simfleet.gpu import load_pynvml as load_sim_pynvml  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.state import boot_node_root, initial_state, write_node_root  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.module_utils.contract import contract_from_facts  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.contract_diff import (  # noqa: E402
    compare_to_golden,
    contract_diff,
    describe,
    markdown_lines,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import assemble_facts  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import read_nvml  # noqa: E402


def read_node(tmp_path, monkeypatch, name, version, reserved_mib=480, app_graphics=None):
    """The contract of a simulated H100 node running driver ``version`` (reserved memory as given)."""
    root = str(tmp_path / name)
    state = initial_state("h100", "node-h100")
    for gpu in state["gpus"]:
        gpu["memory"]["reserved_mib"] = reserved_mib
        if app_graphics is not None:
            gpu["clocks"]["app_graphics"] = app_graphics
    write_node_root(root, state, userspace_version=version)
    boot_node_root(root)
    monkeypatch.setenv("SIMGPU_ROOT", root)
    return contract_from_facts(assemble_facts({"nvml": read_nvml(load_sim_pynvml())}))


def test_driver_update_diff_is_grouped_across_gpus(tmp_path, monkeypatch):
    before = read_node(tmp_path, monkeypatch, "before", "580.126.20", reserved_mib=545)
    after = read_node(tmp_path, monkeypatch, "after", "590.48.01", reserved_mib=612, app_graphics=1830)
    entries = contract_diff(before, after)
    reserved = [e for e in entries if e["field"] == "memory_reserved_mib"]
    assert len(reserved) == 1
    assert (reserved[0]["before"], reserved[0]["after"], reserved[0]["count"], reserved[0]["gpus"]) == (
        545, 612, 8, list(range(8)))
    lines = markdown_lines(entries)
    assert "- reserved memory 545 → 612 MiB on 8 GPUs" in lines
    assert "- default application clock (graphics) 1980 → 1830 MHz on 8 GPUs" in lines
    assert "- driver (userspace) 580.126.20 → 590.48.01" in lines
    assert "- CUDA 13.0 → 13.1" in lines
    assert "- GSP firmware 580.126.20 → 590.48.01 on 8 GPUs" in lines
    # Per-unit values never appear: the UUIDs are the same units, serials are not compared.
    assert not [e for e in entries if e["field"] in ("uuid", "serial", "pci_bus_id")]


def test_no_change_and_one_gpu_change(tmp_path, monkeypatch):
    before = read_node(tmp_path, monkeypatch, "before", "580.126.20")
    assert contract_diff(before, copy.deepcopy(before)) == []
    assert markdown_lines([]) == ["- no contract change"]
    after = copy.deepcopy(before)
    after["gpus"][3]["pcie_width_max"] = 8
    after["gpus"][3]["mig_profiles_offered"] = [p for p in after["gpus"][3]["mig_profiles_offered"] if p != "1g.20gb"]
    assert markdown_lines(contract_diff(before, after)) == [
        r"- MIG profiles offered changed: - 1g.20gb on 1 GPU",
        "- PCIe width (attainable) 16 → 8 on 1 GPU",
    ]


def test_gpus_pair_by_uuid_not_by_position(tmp_path, monkeypatch):
    before = read_node(tmp_path, monkeypatch, "before", "580.126.20")
    after = copy.deepcopy(before)
    # The driver enumerates the GPUs in another order after the update: no contract change.
    after["gpus"].reverse()
    after["units"].reverse()
    for position, (gpu, unit) in enumerate(zip(after["gpus"], after["units"])):
        gpu["index"] = unit["index"] = position
    assert contract_diff(before, after) == []
    # One GPU gone: named once, the other seven unchanged.
    del after["gpus"][0], after["units"][0]
    entries = contract_diff(before, after)
    assert [describe(e) for e in entries] == ["GPU count 8 → 7", "GPU gone: GPU 7"]


def test_unknown_is_a_change_that_says_so():
    facts = assemble_facts(captures.read("a100-mig"), capture=True)
    before = contract_from_facts(facts)
    after = copy.deepcopy(before)
    after["gpus"][0]["bar1_total_mib"] = None
    entry = [e for e in contract_diff(before, after) if e["field"] == "bar1_total_mib"][0]
    assert entry["kind"] == "no_longer_known"
    assert describe(entry) == "BAR1 size %d MiB → unknown on 1 GPU" % before["gpus"][0]["bar1_total_mib"]


def test_outlier_against_the_golden_node_names_the_field(tmp_path, monkeypatch):
    golden = read_node(tmp_path, monkeypatch, "golden", "590.48.01", reserved_mib=612)
    canary = read_node(tmp_path, monkeypatch, "canary", "590.48.01", reserved_mib=612)
    # Other units, same class: every contract value matches though UUIDs and serials differ.
    canary["units"] = [dict(unit, uuid=unit["uuid"] + "-x", serial="other") for unit in canary["units"]]
    assert compare_to_golden(canary, golden) == {"matches": True, "differences": [], "reasons": []}
    outlier = copy.deepcopy(canary)
    for gpu in outlier["gpus"][4:]:
        gpu["sm_clock_max_mhz"] = 1755
    outlier["gpus"][0]["memory_reserved_mib"] = 700
    verdict = compare_to_golden(outlier, golden)
    assert verdict["matches"] is False
    assert verdict["reasons"] == [
        "maximum SM clock: golden 1980 MHz, this node 1755 MHz on GPUs 4-7",
        "reserved memory: golden 612 MiB, this node 700 MiB on GPU 0",
    ]
    assert [(d["field"], d["before"], d["after"]) for d in verdict["differences"]] == [
        ("sm_clock_max_mhz", 1980, 1755), ("memory_reserved_mib", 612, 700)]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="before is not a hardware contract"):
        contract_diff({"gpus": []}, {"gpus": [], "node": {}})
    with pytest.raises(ValueError, match="golden is not a hardware contract"):
        compare_to_golden({"gpus": [], "node": {}}, None)
