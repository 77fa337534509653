"""How a golden node's contract changes are explained, and the comparison of a class with its golden node.

Contracts are read through the simulated NVML of a simulated H100 node (tests/simfleet), as
gpu_facts reads them on a node.
"""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from simnode import SIMFLEET  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
from simfleet.gpu import load_pynvml as load_sim_pynvml  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.state import boot_node_root, initial_state, write_node_root  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.module_utils.contract import contract_from_facts  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import assemble_facts  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import read_nvml  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import contract_decision as cd  # noqa: E402


def facts_of(tmp_path, monkeypatch, name, version, node="node-h100", **gpu_changes):
    """``ansible_facts.nvidia``-shaped facts (only ``contract``) of a simulated H100 node on ``version``.

    ``gpu_changes``: ``reserved_mib``, ``app_graphics`` (MHz) set on every GPU of the simulated
    state. The same ``node`` has the same GPUs (UUIDs).
    """
    root = str(tmp_path / name)
    state = initial_state("h100", node)
    for gpu in state["gpus"]:
        if "reserved_mib" in gpu_changes:
            gpu["memory"]["reserved_mib"] = gpu_changes["reserved_mib"]
        if "app_graphics" in gpu_changes:
            gpu["clocks"]["app_graphics"] = gpu_changes["app_graphics"]
    write_node_root(root, state, userspace_version=version)
    boot_node_root(root)
    monkeypatch.setenv("SIMGPU_ROOT", root)
    return {"contract": contract_from_facts(assemble_facts({"nvml": read_nvml(load_sim_pynvml())}))}


def with_gpus(contract, **values):
    """The contract with ``values`` set on every GPU (what a boot of the new driver would read)."""
    return dict(contract, gpus=[dict(gpu, **values) for gpu in contract["gpus"]])


def test_a_driver_update_is_explained_field_by_field(tmp_path, monkeypatch):
    # The simulated R620 reserves 64 MiB more per GPU, and 620.82.01 lowers the default
    # application clock by 45 MHz (simgpu catalog.CONTRACT_OFFSETS).
    before = facts_of(tmp_path, monkeypatch, "before", "580.126.20")
    after = facts_of(tmp_path, monkeypatch, "after", "620.82.01")
    record = cd.record_contract(after, before, policy=None, keep_after=True)
    by_field = dict((c["field"], c) for c in record["changes"])
    # The driver's own versions change because the update is that change.
    for field in ("driver_userspace_version", "cuda_driver_version", "gsp_firmware_version"):
        assert by_field[field]["decision"] == "expected", field
    assert by_field["cuda_driver_version"]["text"] == "CUDA 13.0 → 13.5"
    reserved = by_field["memory_reserved_mib"]
    assert (reserved["decision"], reserved["text"], reserved["gpus"]) == (
        "open", "reserved memory 480 → 544 MiB on 8 GPUs", list(range(8)))
    clock = by_field["app_clock_default_graphics_mhz"]
    assert (clock["decision"], clock["text"]) == ("open", "default application clock (graphics) 1980 → 1935 MHz on 8 GPUs")
    assert "reserved memory 480 → 544 MiB on 8 GPUs" in record["lines"]
    assert record["after"]["gpus"][0]["memory_reserved_mib"] == 544
    assert "after" not in cd.record_contract(after, before)
    # Nothing to compare without a contract on both sides.
    assert cd.record_contract(after, {}) is None and cd.record_contract(None, before) is None


def test_the_declared_policy_holds_what_it_sets(tmp_path, monkeypatch):
    before = facts_of(tmp_path, monkeypatch, "before", "580.126.20")
    before = {"contract": with_gpus(before["contract"], power_enforced_limit_w=600.0)}
    after = {"contract": with_gpus(before["contract"], power_enforced_limit_w=700.0)}
    open_change = cd.record_contract(after, before)["changes"]
    assert [(c["field"], c["decision"]) for c in open_change] == [("power_enforced_limit_w", "open")]
    held = cd.record_contract(after, before, {"gpu_policy_power_limit_w": 600, "gpu_policy_ecc_mode": None})["changes"]
    assert [(c["field"], c["decision"]) for c in held] == [("power_enforced_limit_w", "held")]
    assert cd.held_fields({"gpu_policy_power_limit_percent": "90", "gpu_policy_ecc_mode": "", "gpu_policy_compute_mode": "default"}) \
        == ["compute_mode", "power_enforced_limit_w"]
    assert cd.held_fields({"gpu_policy_power_limit_w": "650"}) == ["power_default_limit_w", "power_enforced_limit_w"]


def test_the_controller_settles_open_changes_against_the_accept_list():
    changes = [{"field": "driver_loaded_version", "text": "driver (loaded module) 580.126.20 → 620.82.01",
                "decision": "expected"},
               {"field": "memory_reserved_mib", "text": "reserved memory 480 → 544 MiB on 8 GPUs", "decision": "open"},
               {"field": "app_clock_default_graphics_mhz", "text": "default application clock (graphics) 1980 → 1830 MHz",
                "decision": "open"}]
    settled = cd.resolve(changes, cd.parse_accept("memory_reserved_mib"))
    assert [(c["field"], c["decision"], c["why"]) for c in settled] == [
        ("driver_loaded_version", "expected", "the driver's own"),
        ("memory_reserved_mib", "accepted", "accepted in rollout_contract_accept"),
        ("app_clock_default_graphics_mhz", "unexplained", "unexplained")]
    assert cd.unexplained(changes, ["memory_reserved_mib", "app_clock_default_*"]) == []
    reason = cd.stop_reason("node01", "gpu_h100", cd.unexplained(changes, []))
    assert reason.startswith("contract changes unexplained on golden node node01 (class gpu_h100): reserved memory "
                             "480 → 544 MiB on 8 GPUs; default application clock (graphics) 1980 → 1830 MHz; accept with "
                             "rollout_contract_accept=memory_reserved_mib,app_clock_default_graphics_mhz")


def test_bad_accept_lists_and_modes_are_refused_with_the_value():
    assert cd.parse_accept(" memory_reserved_mib ,app_clock_default_*,") == ["memory_reserved_mib", "app_clock_default_*"]
    assert cd.parse_accept(["*"]) == ["*"] and cd.parse_accept("") == [] and cd.parse_accept(None) == []
    with pytest.raises(ValueError, match=r"'memory_reserve_mib' matches no contract field \(did you mean memory_reserved_mib\?\)"):
        cd.parse_accept("memory_reserve_mib")
    with pytest.raises(ValueError, match="not a field name"):
        cd.parse_accept([3])
    with pytest.raises(ValueError, match="must be a list"):
        cd.parse_accept({"a": 1})
    assert cd.parse_mode("WARN") == "warn" and cd.parse_mode(None) == "stop"
    with pytest.raises(ValueError, match="rollout_contract_changes must be stop or warn, got 'ignore'"):
        cd.parse_mode("ignore")


def test_a_node_that_differs_from_its_golden_node_is_named_by_field(tmp_path, monkeypatch):
    golden = facts_of(tmp_path, monkeypatch, "golden", "620.82.01", node="node01")["contract"]
    same = facts_of(tmp_path, monkeypatch, "same", "620.82.01", node="node02")["contract"]
    slow = with_gpus(facts_of(tmp_path, monkeypatch, "slow", "620.82.01", node="node03")["contract"],
                     sm_clock_max_mhz=1410)
    assert cd.golden_match(same, {"node": "node01", "contract": golden}) == {
        "node": "node01", "matches": True, "fields": [], "reasons": []}
    match = cd.golden_match(slow, {"node": "node01", "contract": golden})
    assert match["matches"] is False and match["fields"] == ["sm_clock_max_mhz"]
    assert match["reasons"] == ["maximum SM clock: golden 1980 MHz, this node 1410 MHz on GPUs 0-7"]
    assert cd.golden_match(slow, {"node": "node01", "contract": golden}, ["sm_clock_*"])["matches"] is True
    # The kernel and the idle readings are a node's own; no golden node yet: nothing to compare.
    other_kernel = dict(same, node=dict(same["node"], kernel="6.1.0-99-amd64"))
    assert cd.golden_match(other_kernel, {"node": "node01", "contract": golden})["matches"] is True
    assert cd.golden_match(same, None) is None and cd.golden_match(None, {"node": "n", "contract": golden}) is None


def test_a_corrupt_record_of_changes_stops_the_rollout_instead_of_opening_the_canary_stage():
    from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_budget as rb
    from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_journal as rj
    plan = {"nodes": [{"name": "g", "stage": "golden", "class": "gpu_h100"},
                      {"name": "k", "stage": "canary", "class": "gpu_h100"}]}
    accept_all_but = rb.normalize_options({"contract_accept": "memory_*"})
    for corrupt in ({"field": "memory_reserved_mib"}, "memory_reserved_mib", None, ["memory_reserved_mib"], [None],
                    [{"decision": "open", "text": "x"}], [{"field": "x", "decision": ["open"]}]):
        lines = ['{"event": "started", "node": "g", "run_id": "r", "time": 1}',
                 json.dumps({"event": "finished", "node": "g", "status": "done", "result": "upgraded", "changed": True,
                             "time": 2, "contract_changes": corrupt})]
        decision = rb.decide(rj.fleet_state(plan, rj.fold_lines(lines)), accept_all_but)
        assert decision["action"] == "stop" and decision["start"] == [], corrupt
        assert decision["stop"]["code"] in ("contract_unexplained",), corrupt
    # A decision the record cannot prove is reopened: "expected" only for the driver's own fields.
    forged = [{"field": "memory_reserved_mib", "text": "reserved memory 480 → 544 MiB", "decision": "expected"}]
    assert [c["decision"] for c in cd.resolve(forged, [])] == ["unexplained"]
    reason = cd.stop_reason("g", "gpu_h100", cd.unexplained([{"field": 3}], []))
    assert "cannot be read" in reason and "rollout_contract_accept=" not in reason
    # A contract that is there but is no contract: one unreadable change, no contract kept for the class.
    bad = cd.record_contract({"contract": "x"}, {"contract": {"node": {}, "gpus": [None]}}, keep_after=True)
    assert [c["field"] for c in bad["changes"]] == [cd.UNREADABLE] and "after" not in bad
    with pytest.raises(ValueError, match="cannot compare with golden node g1"):
        cd.golden_match({"node": {}, "gpus": [{"index": 0}], "units": []},
                        {"node": "g1", "contract": {"node": {}, "gpus": [None], "units": []}})


def test_a_snapshot_with_its_trace_is_read_back_whole(tmp_path, monkeypatch):
    """The snapshot node_upgrade saves (facts, local facts, trace before) stays within what node_lock reads.

    Written as the role writes it (to_nice_json: indent 4), with the facts of a simulated 8-GPU
    H100 node with 1,000 Xid lines in its kernel log and a 3 s trace every 0.5 s of its 8 GPUs.
    """
    from ansible_collections.gpufleet.nvidia.plugins.module_utils import gpu_trace, node_lock
    root = str(tmp_path / "snap")
    write_node_root(root, initial_state("h100", "node-snap"), userspace_version="580.126.20")
    boot_node_root(root)
    monkeypatch.setenv("SIMGPU_ROOT", root)
    storm = "".join("[ %5d.%06d] NVRM: Xid (PCI:0000:%02x:00): %d, pid=%d, name=python3, Ch 00000010\n"
                    % (100 + n, n, 0x18 + n % 8, (13, 31, 43, 79, 94, 119)[n % 6], 4000 + n) for n in range(1000))
    facts = assemble_facts({"nvml": read_nvml(load_sim_pynvml()), "kernel_log": storm})
    assert facts["xid_summary"]["total"] == 1000 and facts["gpu_count"] == 8
    rows = []
    for step in range(7):
        for index in range(8):
            row = gpu_trace.new_row(time_s=step * 0.5, gpu=index, pci_bus_id="0000:%02x:00.0" % (0x18 + index),
                                    uuid="GPU-%08d-0000-0000-0000-000000000000" % index)
            row.update(pstate="P0", sm_clock_mhz=1980, mem_clock_mhz=2619, power_w=699.9, temperature_c=61,
                       utilization_gpu_pct=100, clocks_event_reasons=["sw_power_cap"])
            rows.append(row)
    snapshot = {"rollout_id": "driver-ltsb", "run_id": "ctl-1-1", "facts": facts, "local_facts": {},
                "trace": {"csv": gpu_trace.to_csv(rows), "summary": gpu_trace.summarize(rows)}}
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(snapshot, indent=4) + "\n")
    assert path.stat().st_size < node_lock.MAX_STATE_BYTES // 4
    state = node_lock.read_state(str(path))
    assert state["unreadable"] is None and state["content"]["trace"]["summary"]["0000:18:00.0"]["samples"] == 7


@pytest.mark.parametrize("pattern", ["*", "*_*", "*e*", "?*", "unreadable_*", cd.UNREADABLE, "[u]*"])
def test_no_accept_pattern_accepts_an_unreadable_record(pattern):
    for changes in ("corrupt", [{"no": "field"}], [cd.unreadable("the record")],
                    [{"field": cd.UNREADABLE, "decision": "accepted"}]):
        resolved = cd.resolve(changes, [pattern])
        assert [c["decision"] for c in resolved] == ["unexplained"], (pattern, changes)
        assert resolved[0]["field"] == cd.UNREADABLE


def test_held_only_for_a_policy_field_and_now_known_only_with_its_evidence():
    record = [{"field": "memory_reserved_mib", "decision": "held", "text": "reserved memory 480 → 544 MiB"},
              {"field": "power_enforced_limit_w", "decision": "held", "text": "power limit 700 → 650 W"},
              {"field": "compute_mode", "decision": "held", "text": "compute mode"},
              {"field": "max_sm_clock_mhz", "decision": "now_known", "text": "max SM clock ? → 1980 MHz"},
              {"field": "max_sm_clock_mhz", "decision": "now_known", "before": None, "text": "max SM clock"},
              {"field": "max_sm_clock_mhz", "decision": "now_known", "before": 1410, "text": "max SM clock"}]
    assert [c["decision"] for c in cd.checked_changes(record)] == [
        "open", "held", "held", "open", "now_known", "open"]
    # With the node's declared policy known, held is believed only for its fields.
    declared = cd.held_fields({"gpu_policy_power_limit_w": 650})
    assert [c["decision"] for c in cd.checked_changes(record, declared)][:3] == ["open", "held", "open"]


def test_nan_is_unknown_not_a_change():
    nan = float("nan")
    entries = [{"scope": "gpu", "field": "max_sm_clock_mhz", "label": "max SM clock", "unit": "MHz", "before": nan,
                "after": nan, "kind": "changed", "gpus": [0]},
               {"scope": "gpu", "field": "max_mem_clock_mhz", "label": "max memory clock", "unit": "MHz",
                "before": nan, "after": 2619, "kind": "changed", "gpus": [0]},
               {"scope": "gpu", "field": "max_graphics_clock_mhz", "label": "max graphics clock", "unit": "MHz",
                "before": 1980, "after": nan, "kind": "changed", "gpus": [0]},
               {"scope": "gpu", "field": "gpu_removed", "label": "GPU gone", "unit": None, "before": None,
                "after": None, "kind": "gpu_removed", "gpus": [3], "count": 1}]
    changes = cd.classify(entries)
    assert [(c["field"], c["decision"]) for c in changes] == [
        ("max_mem_clock_mhz", "now_known"), ("max_graphics_clock_mhz", "open"), ("gpu_removed", "open")]
    assert changes[0]["before"] is None
    assert [c["decision"] for c in cd.resolve(changes, [])] == ["now_known", "unexplained", "unexplained"]
