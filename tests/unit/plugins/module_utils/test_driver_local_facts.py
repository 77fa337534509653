# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the driver role records after its transaction (driver_local_facts.next_local_facts)."""

from __future__ import annotations

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_local_facts import next_local_facts, update_local_facts

T0 = "2026-11-29T10:00:00Z"
T1 = "2026-11-30T10:00:00Z"


def installed_580():
    return update_local_facts({}, "580.126.20", "580", T0, "install", kernel_module_type="open")


def test_fresh_node_records_the_install():
    facts = next_local_facts({}, "620.82.01", "620", "open", "install", None, None, True, T1)
    assert facts["current"]["version"] == "620.82.01"
    assert [(h["action"], h["to"]) for h in facts["history"]] == [("install", "620.82.01")]
    assert facts["last_known_good"] is None


def test_nothing_new_returns_the_facts_unchanged():
    facts = installed_580()
    # Not loaded yet (no reboot): no known-good, nothing to record.
    assert next_local_facts(facts, "580.126.20", "580", "open", "none", None, None, True, T1) == facts


def test_healthy_recorded_version_becomes_known_good_once():
    facts = installed_580()
    marked = next_local_facts(facts, "580.126.20", "580", "open", "none", "580.126.20", "ok", True, T1)
    assert marked["last_known_good"]["version"] == "580.126.20"
    assert marked["history"][-1]["action"] == "known_good"
    assert next_local_facts(marked, "580.126.20", "580", "open", "none", "580.126.20", "ok", True, T1) == marked


def test_known_good_needs_the_switch_a_healthy_state_and_the_recorded_version():
    facts = installed_580()
    for loaded, state, mark in (("580.126.20", "ok", False), ("580.126.20", "mismatch", True), ("570.1.1", "ok", True)):
        assert next_local_facts(facts, "580.126.20", "580", "open", "none", loaded, state, mark, T1) == facts


def test_upgrade_records_previous_and_keeps_known_good():
    facts = next_local_facts(installed_580(), "580.126.20", "580", "open", "none", "580.126.20", "ok", True, T0)
    upgraded = next_local_facts(facts, "620.82.01", "620", "open", "branch_change", "580.126.20", "ok", True, T1)
    assert upgraded["current"]["version"] == "620.82.01"
    assert upgraded["previous"]["version"] == "580.126.20"
    assert upgraded["last_known_good"]["version"] == "580.126.20"
    assert upgraded["history"][-1]["action"] == "branch_change"
