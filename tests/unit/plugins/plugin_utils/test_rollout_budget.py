# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Budgets, windows, stage gates and stop reasons of a rollout step (plugin_utils.rollout_budget)."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_budget as rb

# One admission per node (the drain and the install together): the stage and window rules as a
# step applies them to starts. With drain_ahead (the default) the same rules apply to installs,
# tested below with AHEAD.
OPTIONS = rb.normalize_options({"drain_ahead": False})
WHOLE_POOL = rb.normalize_options({"canary_quorum": "100%", "drain_ahead": False})
AHEAD = rb.normalize_options({})


def fleet(counts, golden=1, canary=1):
    """Nodes in priority order: per class golden, canary, then waves."""
    nodes = []
    for klass, count in counts.items():
        for index in range(count):
            stage = "golden" if index < golden else "canary" if index < golden + canary else "waves"
            nodes.append({"name": "%s-%02d" % (klass, index), "class": klass, "stage": stage, "status": "pending"})
    order = {"golden": 0, "canary": 1, "waves": 2}
    return sorted(nodes, key=lambda n: order[n["stage"]])


def by_name(nodes):
    return dict((n["name"], n) for n in nodes)


@pytest.mark.parametrize("value,expected", [
    (3, ("count", 3.0)), ("3", ("count", 3.0)), ("10%", ("percent", 10.0)), (" 2.5% ", ("percent", 2.5)),
    ("100%", ("percent", 100.0)),
])
def test_parse_amount(value, expected):
    assert rb.parse_amount(value, "rollout_max_unavailable") == expected


@pytest.mark.parametrize("value,words", [
    (0, "at least 1"), ("0", "at least 1"), ("-1", "rollout_max_unavailable"), ("-50%", "-50%"),
    ("0%", "more than 0%"), ("101%", "at most 100%"), ("all", "'all'"), (True, "True"), (1.5, "whole"),
    (None, "None"),
])
def test_parse_amount_refuses_with_the_value_named(value, words):
    with pytest.raises(ValueError) as err:
        rb.parse_amount(value, "rollout_max_unavailable")
    assert "rollout_max_unavailable" in str(err.value) and words in str(err.value)


def test_failure_budget_may_be_zero_and_options_are_checked():
    assert rb.parse_amount("0", "rollout_failure_budget", allow_zero=True) == ("count", 0.0)
    opts = rb.normalize_options({"max_unavailable": "25%", "signature_limit": "3", "window_growth": "0"})
    assert opts["max_unavailable"] == ("percent", 25.0) and opts["signature_limit"] == 3
    assert opts["window_growth"] == 0.0
    with pytest.raises(ValueError, match="rollout_signature_limit must be a whole number, at least 1, got '0'"):
        rb.normalize_options({"signature_limit": "0"})
    with pytest.raises(ValueError, match="rollout_window_growth must be a number, 0 or more, got 'nan'"):
        rb.normalize_options({"window_growth": "nan"})
    with pytest.raises(ValueError, match="unknown budget options: max_unavailble"):
        rb.normalize_options({"max_unavailble": "5%"})


def test_amount_of_rounds_down_and_keeps_at_least_one():
    assert rb.amount_of(("percent", 10.0), 25) == 2
    assert rb.amount_of(("percent", 10.0), 4) == 1
    assert rb.amount_of(("count", 50.0), 4) == 4
    assert rb.amount_of(("percent", 1.0), 40, minimum=0) == 0


def test_golden_first_then_canary_then_waves_per_class():
    nodes = fleet({"gpu_h100": 20, "gpu_a100": 20})
    first = rb.decide(nodes, OPTIONS)
    assert first["action"] == "start" and first["start"] == ["gpu_h100-00", "gpu_a100-00"]
    assert first["stages"] == {"gpu_h100": "golden", "gpu_a100": "golden"}
    named = by_name(nodes)
    named["gpu_h100-00"]["status"] = "in_flight"
    named["gpu_a100-00"]["status"] = "done"
    second = rb.decide(nodes, OPTIONS)
    # The A100 class moves on to its canary while the H100 golden node still runs.
    assert second["start"] == ["gpu_a100-01"]
    assert second["stages"] == {"gpu_h100": "golden", "gpu_a100": "canary"}
    named["gpu_a100-01"]["status"] = "done"
    third = rb.decide(nodes, OPTIONS)
    # Waves: window 1 + 2 x 2 verified = 5, within the budget of 10 % of 20 = 2.
    assert third["start"] == ["gpu_a100-02", "gpu_a100-03"]
    assert third["budgets"]["gpu_a100"]["max_unavailable"] == 2


def test_window_widens_with_verified_nodes():
    nodes = fleet({"gpu_h100": 200})
    named = by_name(nodes)
    for name in ("gpu_h100-00", "gpu_h100-01"):
        named[name]["status"] = "done"
    assert len(rb.decide(nodes, OPTIONS)["start"]) == 5          # 1 + 2 x 2
    for index in range(2, 12):
        named["gpu_h100-%02d" % index]["status"] = "done"
    assert len(rb.decide(nodes, OPTIONS)["start"]) == 20         # the budget (10 % of 200) is smaller


def test_capacity_budget_counts_in_flight_quarantined_and_out_of_service():
    nodes = fleet({"gpu_h100": 30}, canary=0)
    named = by_name(nodes)
    named["gpu_h100-00"]["status"] = "done"
    for index in range(1, 12):
        named["gpu_h100-%02d" % index]["status"] = "done"
    named["gpu_h100-12"]["status"] = "failed"
    named["gpu_h100-12"]["signature"] = "gpu_unreadable"
    named["gpu_h100-13"]["out_of_service"] = True
    decision = rb.decide(nodes, OPTIONS)
    # 10 % of 30 = 3 slots; one quarantined, one drained by someone else: one left.
    assert decision["start"] == ["gpu_h100-14"]
    assert decision["quarantined"] == ["gpu_h100-12"] and decision["deferred"] == ["gpu_h100-13"]
    assert decision["stop"] is None


def test_isolated_failure_is_quarantined_two_with_one_signature_stop():
    nodes = fleet({"gpu_h100": 100, "gpu_a100": 100})
    for node in nodes:
        if node["stage"] != "waves" or node["name"].endswith(("02", "03", "04")):
            node["status"] = "done"
    named = by_name(nodes)
    named["gpu_h100-05"].update(status="failed", signature="xid 79", implicates_driver=True, target="620.82.01")
    assert rb.decide(nodes, OPTIONS)["action"] == "start"
    named["gpu_a100-05"].update(status="failed", signature="xid 79", implicates_driver=True, target="620.82.01")
    decision = rb.decide(nodes, OPTIONS)
    assert decision["action"] == "stop" and decision["start"] == []
    assert decision["stop"]["code"] == "driver_implicated"
    assert decision["stop"]["reason"] == ("driver implicated: 2 nodes failed with xid 79 after the install of "
                                          "620.82.01 (2 installed; by chance alone: p=8e-08)")
    assert decision["stop"]["nodes"] == ["gpu_h100-05", "gpu_a100-05"]


def test_two_failures_among_thousands_are_background():
    nodes = fleet({"gpu_h100": 4000, "gpu_a100": 4000})
    for node in nodes:
        node.update(status="done", target="620.82.01")
    for name in ("gpu_h100-05", "gpu_a100-05"):
        by_name(nodes)[name].update(status="failed", signature="xid 48", implicates_driver=True)
    # 8,000 installs x 2e-4 = 1.6 failures expected by chance: two with one signature are not evidence.
    assert rb.stop_reason(nodes, OPTIONS) is None
    for index in range(6, 12):
        by_name(nodes)["gpu_h100-%02d" % index].update(status="failed", signature="xid 48", implicates_driver=True)
    stop = rb.stop_reason(nodes, OPTIONS)
    assert stop["code"] == "driver_implicated" and len(stop["nodes"]) == 8
    assert rb.poisson_tail(2, 0.0) == 0.0 and rb.poisson_tail(0, 5.0) == 1.0
    assert abs(rb.poisson_tail(2, 1.0) - 0.2642) < 1e-4


def test_failures_before_the_install_implicate_nothing():
    nodes = fleet({"gpu_h100": 100})
    for node in nodes[:10]:
        node["status"] = "done"
    for node in nodes[10:13]:
        node.update(status="failed", signature="drain failed", implicates_driver=False)
    decision = rb.decide(nodes, OPTIONS)
    assert decision["stop"] is None and decision["action"] == "start"


def test_failure_budget_of_a_class():
    nodes = fleet({"gpu_h100": 200})
    for node in nodes[:20]:
        node["status"] = "done"
    for index, signature in enumerate(("xid 48", "xid 79", "gpu_unreadable")):
        nodes[20 + index].update(status="failed", signature=signature, implicates_driver=True)
    decision = rb.decide(nodes, OPTIONS)
    # 1 % of 200 = 2: the third failure with another signature exceeds it.
    assert decision["stop"]["code"] == "failure_budget"
    assert decision["stop"]["reason"] == ("failure budget of class gpu_h100 exceeded: 3 nodes failed after the "
                                          "install (budget 2 of 200 nodes)")


def test_golden_or_canary_failure_stops_at_once():
    nodes = fleet({"gpu_h100": 10})
    nodes[0].update(status="failed", signature="version_not_loaded", implicates_driver=True)
    decision = rb.decide(nodes, OPTIONS)
    assert decision["action"] == "stop" and decision["stop"]["code"] == "stage_failure"
    assert decision["stop"]["reason"] == "golden node gpu_h100-00 failed: version_not_loaded"


def test_a_slow_drain_keeps_its_slot_and_holds_no_stage():
    nodes = fleet({"gpu_h100": 40}, canary=3)
    named = by_name(nodes)
    named["gpu_h100-00"]["status"] = "done"
    named["gpu_h100-01"].update(status="in_flight", draining=True)
    named["gpu_h100-02"]["status"] = "done"
    named["gpu_h100-03"]["status"] = "done"
    decision = rb.decide(nodes, OPTIONS)
    assert decision["stages"]["gpu_h100"] == "waves"
    # 10 % of 40 = 4 slots, one held by the draining canary.
    assert decision["start"] == ["gpu_h100-04", "gpu_h100-05", "gpu_h100-06"]


def test_the_waves_open_at_the_canary_quorum_and_the_rest_keep_zero_tolerance():
    nodes = fleet({"gpu_h100": 100}, canary=4)
    named = by_name(nodes)
    named["gpu_h100-00"]["status"] = "done"
    for name in ("gpu_h100-01", "gpu_h100-02", "gpu_h100-03", "gpu_h100-04"):
        named[name]["status"] = "in_flight"
    named["gpu_h100-01"]["status"] = "done"
    assert rb.decide(nodes, OPTIONS)["stages"]["gpu_h100"] == "canary"
    assert rb.decide(nodes, OPTIONS)["start"] == []
    named["gpu_h100-02"]["status"] = "done"
    decision = rb.decide(nodes, OPTIONS)
    # 50 % of 4 canary nodes passed: the waves open; 10 slots, 2 held by the canaries in flight,
    # window 1 + 2 x 3 verified - 2 in flight = 5.
    assert decision["stages"]["gpu_h100"] == "waves"
    assert decision["start"] == ["gpu_h100-%02d" % i for i in range(5, 10)]
    whole = rb.decide(nodes, rb.normalize_options({"drain_ahead": False, "canary_quorum": "100%"}))
    assert whole["stages"]["gpu_h100"] == "canary" and whole["start"] == []
    named["gpu_h100-03"].update(status="failed", signature="xid 79", implicates_driver=True)
    stopped = rb.decide(nodes, OPTIONS)
    assert stopped["action"] == "stop" and stopped["stop"]["code"] == "stage_failure"
    assert stopped["stop"]["reason"] == "canary node gpu_h100-03 failed: xid 79"
    with pytest.raises(ValueError, match="rollout_canary_quorum must be at least 1, got '0'"):
        rb.normalize_options({"canary_quorum": "0"})


def test_a_refused_wave_node_does_not_open_the_waves():
    nodes = fleet({"gpu_h100": 40}, canary=2)
    named = by_name(nodes)
    named["gpu_h100-00"]["status"] = "done"
    named["gpu_h100-01"]["status"] = "in_flight"
    named["gpu_h100-02"]["status"] = "pending"
    named["gpu_h100-03"].update(status="refused", out_of_service=True)
    assert rb.stage_gates(nodes) == {"gpu_h100": "canary"}
    decision = rb.decide(nodes, OPTIONS)
    assert decision["start"] == ["gpu_h100-02"]


def test_a_returning_earlier_stage_node_joins_the_open_stage():
    nodes = fleet({"gpu_h100": 40}, canary=2)
    named = by_name(nodes)
    named["gpu_h100-00"]["status"] = "done"
    named["gpu_h100-01"]["out_of_service"] = True
    named["gpu_h100-02"]["status"] = "done"
    named["gpu_h100-03"]["status"] = "in_flight"
    named["gpu_h100-01"]["out_of_service"] = False     # repaired while the waves run
    decision = rb.decide(nodes, OPTIONS)
    assert decision["stages"]["gpu_h100"] == "waves"
    assert decision["start"][0] == "gpu_h100-01"


def test_failure_domain_budget_and_candidates_and_limit():
    nodes = fleet({"gpu_h100": 100}, golden=1, canary=0)
    for node in nodes:
        node["domain"] = "rack%d" % (int(node["name"][-2:]) % 2)
    nodes[0]["status"] = "done"
    opts = rb.normalize_options({"max_unavailable_domain": "2", "window_initial": "20"})
    decision = rb.decide(nodes, opts)
    assert decision["start"] == ["gpu_h100-01", "gpu_h100-02", "gpu_h100-03", "gpu_h100-04"]
    limited = rb.decide(nodes, opts, candidates=["gpu_h100-07", "gpu_h100-09"], limit=1)
    assert limited["start"] == ["gpu_h100-07"]


def test_done_with_deferred_nodes():
    nodes = fleet({"gpu_h100": 5})
    for node in nodes:
        node["status"] = "done"
    nodes[-1].update(status="pending", out_of_service=True)
    decision = rb.decide(nodes, OPTIONS)
    assert decision["action"] == "done" and decision["deferred"] == ["gpu_h100-04"]


@pytest.mark.parametrize("record,expected", [
    ({"flags": ["new_fatal_xid"], "new_fatal_xids": {"79": 1, "48": 2}, "marks": {"installed": 1}},
     {"signature": "xid 48", "implicates_driver": True}),
    ({"flags": ["gpu_count_changed"], "marks": {"snapshot": 1, "installed": 2}},
     {"signature": "gpu_count_changed", "implicates_driver": True}),
    ({"flags": ["transaction_failed"], "marks": {"started": 1, "drained": 2, "snapshot": 3}},
     {"signature": "install failed", "implicates_driver": True}),
    ({"flags": ["transaction_failed"], "marks": {"started": 1}},
     {"signature": "drain failed", "implicates_driver": False}),
    # Unreachable after its drain, before the install began: the new driver never touched it.
    ({"flags": ["transaction_failed"], "marks": {"started": 1, "drained": 2}},
     {"signature": "snapshot failed", "implicates_driver": False}),
])
def test_failure_signature(record, expected):
    assert rb.failure_signature(record) == expected


def test_a_class_without_golden_nodes_follows_the_fleets_golden_stage():
    nodes = fleet({"gpu_h100": 10}) + [{"name": "v1", "class": "gpu_v100", "stage": "waves", "status": "pending"}]
    first = rb.decide(nodes, OPTIONS)
    assert first["start"] == ["gpu_h100-00"] and first["stages"]["gpu_v100"] == "golden"
    by_name(nodes)["gpu_h100-00"]["status"] = "done"
    second = rb.decide(nodes, OPTIONS)
    assert second["stages"] == {"gpu_h100": "canary", "gpu_v100": "canary"}
    by_name(nodes)["gpu_h100-01"]["status"] = "done"
    assert rb.decide(nodes, OPTIONS)["start"] == ["gpu_h100-02", "v1"]


def test_the_canary_pool_starts_together_once_the_golden_node_passed():
    nodes = fleet({"gpu_h100": 400}, canary=30)
    named = by_name(nodes)
    named["gpu_h100-00"]["status"] = "in_flight"
    # The golden node has not passed: the canary pool waits (window 1 + 2 x 0, one in flight).
    assert rb.decide(nodes, OPTIONS)["start"] == []
    named["gpu_h100-00"]["status"] = "done"
    decision = rb.decide(nodes, OPTIONS)
    assert decision["stages"] == {"gpu_h100": "canary"}
    assert decision["start"] == ["gpu_h100-%02d" % index for index in range(1, 31)]
    # Within the capacity budget: 10 % of 100 nodes is 10.
    small = fleet({"gpu_a100": 100}, canary=30)
    small[0]["status"] = "done"
    assert len(rb.decide(small, OPTIONS)["start"]) == 10


def test_a_canary_that_failed_before_its_install_is_replaced_by_a_stand_in():
    nodes = fleet({"gpu_h100": 40}, canary=2)
    named = by_name(nodes)
    named["gpu_h100-00"]["status"] = "done"
    named["gpu_h100-01"]["status"] = "done"
    named["gpu_h100-02"].update(status="failed", signature="drain failed", implicates_driver=False)
    named["gpu_h100-03"]["out_of_service"] = True      # cannot start: passed over
    # A wave node refused by its preflight cannot stand in: the next one does.
    refused = [dict(n, status="refused") if n["name"] == "gpu_h100-04" else n for n in nodes]
    assert rb.stand_ins(refused) == {"gpu_h100-05": {"stage": "canary", "replaces": "gpu_h100-02"}}
    decision = rb.decide(nodes, WHOLE_POOL)
    assert decision["stop"] is None and decision["quarantined"] == ["gpu_h100-02"]
    assert decision["stand_ins"] == {"gpu_h100-04": {"stage": "canary", "replaces": "gpu_h100-02"}}
    # The stand-in holds the canary stage: only it starts, the waves wait for it.
    assert decision["stages"] == {"gpu_h100": "canary"} and decision["start"] == ["gpu_h100-04"]
    named["gpu_h100-04"]["status"] = "in_flight"
    assert rb.decide(nodes, WHOLE_POOL)["start"] == []
    named["gpu_h100-04"]["status"] = "done"
    decision = rb.decide(nodes, WHOLE_POOL)
    # 10 % of 40 = 4 slots: one quarantined, one out of service, two left.
    assert decision["stages"] == {"gpu_h100": "waves"} and decision["start"] == ["gpu_h100-05", "gpu_h100-06"]


def test_a_stand_in_keeps_zero_tolerance_and_is_itself_replaced_when_blameless():
    nodes = fleet({"gpu_h100": 40})
    named = by_name(nodes)
    named["gpu_h100-00"].update(status="failed", signature="host", implicates_driver=False)
    named["gpu_h100-02"].update(status="failed", signature="network", implicates_driver=False)
    assert rb.stand_ins(nodes) == {"gpu_h100-02": {"stage": "golden", "replaces": "gpu_h100-00"},
                                   "gpu_h100-03": {"stage": "golden", "replaces": "gpu_h100-02"}}
    decision = rb.decide(nodes, OPTIONS)
    assert decision["stages"] == {"gpu_h100": "golden"} and decision["start"] == ["gpu_h100-03"]
    named["gpu_h100-03"].update(status="failed", signature="xid 79", implicates_driver=True)
    decision = rb.decide(nodes, OPTIONS)
    assert decision["action"] == "stop" and decision["stop"]["code"] == "stage_failure"
    assert decision["stop"]["reason"] == "golden node gpu_h100-03 failed: xid 79 (stand-in for gpu_h100-02)"


def test_a_canary_failure_that_does_not_clear_the_driver_still_stops():
    nodes = fleet({"gpu_h100": 40})
    nodes[0]["status"] = "done"
    by_name(nodes)["gpu_h100-01"].update(status="failed", signature="drain failed")
    decision = rb.decide(nodes, OPTIONS)
    assert decision["stop"]["reason"] == "canary node gpu_h100-01 failed: drain failed"
    assert decision["stand_ins"] == {}


def test_each_failure_after_the_install_slows_the_window():
    nodes = fleet({"gpu_h100": 2000, "gpu_a100": 2000}, canary=20)
    for node in nodes:
        if node["stage"] != "waves":
            node["status"] = "done"
    # 21 verified per class: 1 + 2 x 21 = 43 each.
    assert len(rb.decide(nodes, OPTIONS)["start"]) == 86
    by_name(nodes)["gpu_a100-21"].update(status="failed", signature="xid 48", implicates_driver=True)
    decision = rb.decide(nodes, OPTIONS)
    # One failure (in either class): 1 + 2 x 21 / 2 = 22 each.
    assert decision["stop"] is None and len(decision["start"]) == 44


def test_a_wave_node_finished_before_the_failure_is_no_stand_in():
    nodes = fleet({"gpu_h100": 40}, canary=2)
    named = by_name(nodes)
    for name in ("gpu_h100-00", "gpu_h100-01"):
        named[name].update(status="done", finished_at=100.0)
    # The canary drained for hours; meanwhile the waves opened and one wave node failed its install.
    named["gpu_h100-03"].update(status="failed", signature="xid 79", implicates_driver=True, finished_at=200.0)
    named["gpu_h100-04"].update(status="done", finished_at=250.0)
    named["gpu_h100-02"].update(status="failed", signature="drain failed", implicates_driver=False, finished_at=300.0)
    decision = rb.decide(nodes, OPTIONS)
    assert decision["stand_ins"] == {"gpu_h100-05": {"stage": "canary", "replaces": "gpu_h100-02"}}
    assert decision["stop"] is None and decision["stages"] == {"gpu_h100": "waves"}


RESERVED = {"field": "memory_reserved_mib", "scope": "gpu", "text": "reserved memory 480 → 544 MiB on 8 GPUs",
            "decision": "open", "gpus": list(range(8))}
CUDA = {"field": "cuda_driver_version", "scope": "node", "text": "CUDA 13.0 → 13.5", "decision": "expected"}


def test_an_unexplained_contract_change_of_a_golden_node_stops_before_its_canary_stage():
    nodes = fleet({"gpu_h100": 20, "gpu_a100": 20})
    named = by_name(nodes)
    # Recorded and soaking: the stop comes before the canary pool could open.
    named["gpu_h100-00"].update(status="in_flight", contract_changes=[CUDA, RESERVED])
    named["gpu_a100-00"].update(status="done", contract_changes=[CUDA])
    decision = rb.decide(nodes, OPTIONS)
    assert decision["action"] == "stop" and decision["start"] == []
    stop = decision["stop"]
    assert (stop["code"], stop["nodes"], stop["class"]) == ("contract_unexplained", ["gpu_h100-00"], "gpu_h100")
    assert stop["reason"].startswith("contract change unexplained on golden node gpu_h100-00 (class gpu_h100): "
                                     "reserved memory 480 → 544 MiB on 8 GPUs; accept with "
                                     "rollout_contract_accept=memory_reserved_mib")
    assert [c["decision"] for c in decision["contract"]["gpu_h100"]["changes"]] == ["expected", "unexplained"]
    assert decision["contract"]["gpu_a100"]["unexplained"] == []
    # Accepted (the approval step of the workflow), the same state decides on: the A100 canary starts.
    accepted = rb.decide(nodes, rb.normalize_options({"drain_ahead": False, "contract_accept": "memory_reserved_mib"}))
    assert accepted["stop"] is None and accepted["start"] == ["gpu_a100-01"]
    assert [c["decision"] for c in accepted["contract"]["gpu_h100"]["changes"]] == ["expected", "accepted"]
    named["gpu_h100-00"]["status"] = "done"
    assert rb.decide(nodes, rb.normalize_options({"drain_ahead": False, "contract_accept": ["memory_*"]}))["start"] == [
        "gpu_h100-01", "gpu_a100-01"]
    # warn: the report shows it, nothing stops.
    warned = rb.decide(nodes, rb.normalize_options({"drain_ahead": False, "contract_changes": "warn"}))
    assert warned["stop"] is None and len(warned["contract"]["gpu_h100"]["unexplained"]) == 1
    # A wave node's changes are not its class's decision.
    waves = fleet({"gpu_l40s": 20})
    waves[0]["status"] = "done"
    waves[5].update(status="done", contract_changes=[RESERVED])
    assert rb.decide(waves, OPTIONS)["stop"] is None
    with pytest.raises(ValueError, match="rollout_contract_changes must be stop or warn"):
        rb.normalize_options({"contract_changes": "halt"})


# --- Two admissions (drain_ahead, the default): the drain within the capacity budget, the install
# --- when the stage is open and the window has room.

def test_drain_ahead_starts_drains_within_the_budget_whatever_the_stage():
    nodes = fleet({"gpu_h100": 30}, golden=1, canary=2)
    first = rb.decide(nodes, AHEAD)
    # 10 % of 30: three slots; the golden node and both canary nodes drain now, nothing installs.
    assert first["start"] == ["gpu_h100-00", "gpu_h100-01", "gpu_h100-02"] and first["install"] == []
    assert first["stages"] == {"gpu_h100": "golden"}
    named = by_name(nodes)
    for name in first["start"]:
        named[name].update(status="in_flight", draining=True)
    # Draining ahead does not open a later stage: the golden node holds its stage while it drains.
    again = rb.decide(nodes, AHEAD)
    assert again["stages"] == {"gpu_h100": "golden"} and again["start"] == [] and again["action"] == "wait"
    named["gpu_h100-01"].update(draining=False, drained=True)
    assert rb.decide(nodes, AHEAD)["install"] == []          # a canary node waits for the golden node
    named["gpu_h100-00"].update(draining=False, drained=True)
    decision = rb.decide(nodes, AHEAD)
    assert decision["install"] == ["gpu_h100-00"] and decision["action"] == "start"
    named["gpu_h100-00"].update(drained=False)             # installing
    assert rb.phase(named["gpu_h100-00"]) == "installing" and rb.decide(nodes, AHEAD)["install"] == []
    named["gpu_h100-00"].update(status="done", changed=True)
    decision = rb.decide(nodes, AHEAD)
    # The golden node passed: its class's canary pool installs together; the one still draining
    # holds nothing open, and the free slot goes to the first wave node's drain.
    assert decision["stages"] == {"gpu_h100": "canary"} and decision["install"] == ["gpu_h100-01"]
    assert decision["start"] == ["gpu_h100-03"]


def test_drained_wave_nodes_install_within_the_window_once_the_waves_open():
    nodes = fleet({"gpu_h100": 100}, golden=1, canary=1)
    named = by_name(nodes)
    named["gpu_h100-00"].update(status="done", changed=True)
    named["gpu_h100-01"].update(status="in_flight")             # the canary installs (no drain event)
    for index in range(2, 11):
        named["gpu_h100-%02d" % index].update(status="in_flight", drained=True)
    decision = rb.decide(nodes, AHEAD)
    assert decision["stages"] == {"gpu_h100": "canary"} and decision["install"] == [] and decision["start"] == []
    named["gpu_h100-01"].update(status="done", changed=True)
    decision = rb.decide(nodes, AHEAD)
    # Window 1 + 2 x 2 verified = 5 installs at once; the budget (10) is held by the nine drained
    # nodes, so one more drains.
    assert decision["stages"] == {"gpu_h100": "waves"}
    assert decision["install"] == ["gpu_h100-%02d" % i for i in range(2, 7)]
    assert decision["start"] == ["gpu_h100-11"]
    for name in decision["install"]:
        named[name]["drained"] = False
    assert rb.decide(nodes, AHEAD)["install"] == []             # five installing: the window is full


def test_a_stop_releases_the_nodes_not_yet_installing():
    nodes = fleet({"gpu_h100": 40}, golden=1, canary=1)
    named = by_name(nodes)
    named["gpu_h100-00"].update(status="failed", signature="xid 79", implicates_driver=True)
    named["gpu_h100-01"].update(status="in_flight", draining=True)
    named["gpu_h100-02"].update(status="in_flight", drained=True)
    named["gpu_h100-03"].update(status="in_flight")
    decision = rb.decide(nodes, AHEAD)
    assert decision["action"] == "stop" and decision["stop"]["code"] == "stage_failure"
    assert decision["release"] == ["gpu_h100-01", "gpu_h100-02"] and decision["start"] == []


def test_wave_nodes_start_longest_drain_first():
    nodes = fleet({"gpu_h100": 60}, golden=1, canary=1)
    named = by_name(nodes)
    named["gpu_h100-01"]["drain_estimate_s"] = 1.0           # a canary keeps its place
    named["gpu_h100-40"]["drain_estimate_s"] = 18000.0
    named["gpu_h100-30"]["drain_estimate_s"] = 7200.0
    named["gpu_h100-05"]["drain_estimate_s"] = float("nan")  # no estimate: inventory order
    order = [n["name"] for n in rb.start_order([n for n in nodes if n["status"] == "pending"])]
    assert order[:6] == ["gpu_h100-00", "gpu_h100-01", "gpu_h100-40", "gpu_h100-30", "gpu_h100-02", "gpu_h100-03"]
    assert rb.decide(nodes, AHEAD)["start"] == order[:6]


def test_drain_ahead_reads_extra_var_text():
    assert rb.normalize_options({"drain_ahead": "false"})["drain_ahead"] is False
    assert rb.normalize_options({"drain_ahead": "Yes"})["drain_ahead"] is True
    assert rb.normalize_options({})["drain_ahead"] is True
    with pytest.raises(ValueError, match="rollout_drain_ahead must be true or false, got 'maybe'"):
        rb.normalize_options({"drain_ahead": "maybe"})


def test_a_pool_of_draining_canaries_keeps_the_waves_closed():
    # No golden node of its own; its only canary node still drains: the waves may drain ahead but
    # not install (found on the fleet: a wave node installed while the canary drained).
    nodes = fleet({"gpu_v100": 10}, golden=0, canary=1)
    named = by_name(nodes)
    named["gpu_v100-00"].update(status="in_flight", draining=True)
    named["gpu_v100-01"].update(status="in_flight", drained=True)
    decision = rb.decide(nodes, AHEAD)
    assert decision["stages"] == {"gpu_v100": "canary"} and decision["install"] == []
    named["gpu_v100-00"].update(draining=False, drained=True)
    assert rb.decide(nodes, AHEAD)["install"] == ["gpu_v100-00"]
    # Once one canary node has passed, one still draining is left out (even waiting for the whole
    # pool): the waves open.
    more = fleet({"gpu_v100": 30}, golden=0, canary=2)
    named = by_name(more)
    named["gpu_v100-00"].update(status="done", changed=True)
    named["gpu_v100-01"].update(status="in_flight", draining=True)
    named["gpu_v100-02"].update(status="in_flight", drained=True)
    decision = rb.decide(more, rb.normalize_options({"canary_quorum": "100%"}))
    assert decision["stages"] == {"gpu_v100": "waves"} and decision["install"] == ["gpu_v100-02"]


def test_pass_hosts_take_only_nodes_whose_next_action_is_ready():
    options = rb.normalize_options({"max_unavailable": "4", "executor": "passes", "window_initial": "2",
                                    "window_growth": "0"})
    nodes = [{"name": "g1", "class": "gpu_a", "stage": "golden", "status": "done", "changed": True},
             {"name": "c1", "class": "gpu_a", "stage": "canary", "status": "done", "changed": True},
             {"name": "w1", "class": "gpu_a", "stage": "waves", "status": "in_flight", "pending": True},
             {"name": "w2", "class": "gpu_a", "stage": "waves", "status": "in_flight", "pending": True},
             {"name": "w3", "class": "gpu_a", "stage": "waves", "status": "in_flight", "drained": True,
              "waiting": True},
             {"name": "w4", "class": "gpu_a", "stage": "waves", "status": "pending"},
             {"name": "w5", "class": "gpu_a", "stage": "waves", "status": "pending"}]
    decision, hosts = rb.pass_hosts(nodes, options, 10, busy={"w1"})
    # w1's job runs (its reboot is not over): left out; w2 is taken (its reboot may be over). The
    # window (2 installs, w1 and w2) holds w3's install: it waits, and costs no worker. One slot is
    # free: w4 starts; w5 waits for a later pass, not in a worker of this one.
    assert decision["install"] == [] and decision["start"] == ["w4"]
    assert hosts == ["w2", "w4"]
    # squeue unknown: every pending node is taken.
    assert rb.pass_hosts(nodes, options, 10, busy=None)[1] == ["w1", "w2", "w4"]
    assert rb.pass_hosts(nodes, options, 1, busy=None)[1] == ["w1"]
    # Its install admitted, the waiting node is taken.
    done_waves = [dict(n, status="done", changed=True, pending=False) if n["name"] in ("w1", "w2") else n
                  for n in nodes]
    decision, hosts = rb.pass_hosts(done_waves, options, 10, busy=set())
    assert "w3" in decision["install"] and hosts[0] == "w3"


def test_pass_hosts_leave_a_node_waiting_for_its_drain_out_while_its_jobs_run_and_its_drain_has_time():
    options = rb.normalize_options({"max_unavailable": "2", "executor": "passes"})
    nodes = [{"name": "g1", "class": "gpu_a", "stage": "golden", "status": "in_flight", "draining": True,
              "waiting": True, "waiting_for": "drain", "waiting_until": 5000.0},
             {"name": "c1", "class": "gpu_a", "stage": "canary", "status": "done", "changed": True}]
    # Its job runs and its drain has time left: no worker for it.
    assert rb.pass_hosts(nodes, options, 10, busy={"g1"}, now=4000.0)[1] == []
    # Its jobs are over, squeue cannot be read, or its drain is out of time: taken, to go on or fail it.
    assert rb.pass_hosts(nodes, options, 10, busy=set(), now=4000.0)[1] == ["g1"]
    assert rb.pass_hosts(nodes, options, 10, busy=None, now=4000.0)[1] == ["g1"]
    assert rb.pass_hosts(nodes, options, 10, busy={"g1"}, now=5000.0)[1] == ["g1"]
    # No clock given: never out of time.
    assert rb.pass_hosts(nodes, options, 10, busy={"g1"})[1] == []
    # The rollout stopped (a golden node elsewhere failed on the driver): taken, to be released.
    stopped = nodes + [{"name": "g2", "class": "gpu_a", "stage": "golden", "status": "failed", "changed": True,
                        "implicates_driver": True, "signature": "xid 79", "result": "rolled_back"}]
    decision, hosts = rb.pass_hosts(stopped, options, 10, busy={"g1"}, now=4000.0)
    assert decision["action"] == "stop" and hosts == ["g1"]


def test_the_executor_option_is_steps_or_passes():
    assert rb.normalize_options({})["executor"] == "steps"
    assert rb.normalize_options({"executor": " Passes "})["executor"] == "passes"
    with pytest.raises(ValueError, match="rollout_executor must be one of steps, passes, got 'pass'"):
        rb.normalize_options({"executor": "pass"})
