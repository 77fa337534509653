# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node upgrade's states and transitions (plugin_utils.node_states): every transition walked,
a kill between any two passes, and the state the journal tells of each node."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import node_states as ns
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_journal


def test_every_transition_names_known_states_and_actions():
    for state, table in ns.TRANSITIONS.items():
        assert state in ns.STATES and state not in ns.TERMINAL
        for observation, (target, action) in table.items():
            assert target in ns.STATES, (state, observation)
            assert action is None or action in ns.ACTIONS, (state, observation)
    # Every non-terminal state has a way on, and every terminal state none.
    assert set(ns.STATES) - set(ns.TERMINAL) == set(ns.TRANSITIONS)
    # Every state but the start can be reached.
    reached = set(target for table in ns.TRANSITIONS.values() for target, _action in table.values())
    assert set(ns.STATES) - reached == {"unknown"}  # entered from a lost journal line, not by a transition


def test_the_happy_path_does_one_action_per_state():
    final, actions = ns.walk("upgrade_required", ["admitted", "drained", "install_admitted", "installed",
                                                  "new_boot_id", "verified", "soak_over"])
    assert final == "done"
    assert actions == ["request_drain", "install", "request_reboot", "verify", "return_to_service"]


@pytest.mark.parametrize("observations, final, last", [
    (["admitted", "drained", "install_admitted", "install_failed", "rolled_back"], "failed", "flag"),
    (["admitted", "drained", "install_admitted", "installed", "new_boot_id", "verification_failed", "rolled_back"],
     "failed", "flag"),
    (["admitted", "drained", "install_admitted", "installed", "reboot_timed_out", "rollback_failed"], "failed", "flag"),
    (["admitted", "rollout_stopped"], "upgrade_required", "release"),
    (["admitted", "drained", "rollout_stopped"], "upgrade_required", "release"),
    (["preflight_refused"], "refused", None),
])
def test_failure_paths_end_flagged_or_released(observations, final, last):
    state, actions = ns.walk("upgrade_required", observations)
    assert state == final
    assert (actions[-1] if actions else None) == last
    # Never back in service from a failure: return_to_service comes only after a soak that passed.
    assert "return_to_service" not in actions


def test_waiting_is_a_state_not_a_task():
    for state in ns.TRANSITIONS:
        step = ns.advance(state, "nothing_new")
        assert step == {"state": state, "action": None, "waits": True}
    assert ns.advance("done", "verified") == {"state": "done", "action": None, "waits": True}
    with pytest.raises(ValueError):
        ns.advance("draining_forever", "drained")


@pytest.mark.parametrize("state, observation", [
    (state, observation) for state, table in sorted(ns.TRANSITIONS.items()) for observation in sorted(table)])
def test_a_pass_killed_after_its_action_does_it_again_and_only_a_repeatable_one(state, observation):
    # The pass did the action and was killed before it saved the next state: the next pass starts from
    # the old state, sees the same thing and does the same action again, so every action a transition
    # names must be one ACTIONS lists as safe to repeat.
    once = ns.advance(state, observation)
    assert ns.advance(state, observation) == once
    assert once["action"] is None or once["action"] in ns.ACTIONS


def _paths(limit=12):
    """Every path of observations from upgrade_required, up to ``limit`` transitions: (states, actions)."""
    todo = [("upgrade_required", [], [])]
    while todo:
        state, states, actions = todo.pop()
        if state in ns.TERMINAL or len(states) >= limit:
            yield states + [state], actions
            continue
        for observation, (target, action) in ns.TRANSITIONS.get(state, {}).items():
            todo.append((target, states + [state], actions + ([action] if action else [])))


def test_no_path_returns_a_node_to_service_before_it_was_verified():
    paths = list(_paths())
    assert len(paths) > 20
    for states, actions in paths:
        if states[-1] not in ns.TERMINAL:
            continue  # cut by the search's length limit (a loop of stop-and-release)
        if "return_to_service" in actions:
            before = actions[:actions.index("return_to_service")]
            # Installed, rebooted, verified, and no rollback since.
            assert before[-3:] == ["install", "request_reboot", "verify"], (states, actions)
            assert "roll_back" not in before
        if "install" in actions and states[-1] != "done":
            # Once the driver was touched, a node that does not end done ends failed and flagged.
            assert states[-1] == "failed" and actions[-1] == "flag", (states, actions)


def test_the_journal_tells_each_state():
    lines = [
        {"event": "started", "node": "n1", "run_id": "r", "time": 1},
        {"event": "started", "node": "n2", "run_id": "r", "time": 1, "draining": True},
        {"event": "started", "node": "n3", "run_id": "r", "time": 1, "draining": True},
        {"event": "drained", "node": "n3", "time": 2},
        {"event": "started", "node": "n4", "run_id": "r", "time": 1},
        {"event": "pending", "node": "n4", "run_id": "r", "time": 2},
        {"event": "started", "node": "n5", "run_id": "r", "time": 1},
        {"event": "held", "node": "n5", "time": 3},
        {"event": "started", "node": "n6", "run_id": "r", "time": 1},
        {"event": "finished", "node": "n6", "status": "done", "result": "upgraded", "time": 4},
        {"event": "started", "node": "n7", "run_id": "r", "time": 1},
        {"event": "finished", "node": "n7", "status": "failed", "result": "rolled_back", "time": 4},
        {"event": "started", "node": "n8", "run_id": "r", "time": 1},
        {"event": "finished", "node": "n8", "status": "refused", "result": "refused", "time": 4},
    ]
    journal = rollout_journal.fold(list(enumerate(lines, start=1)))
    names = ["n%d" % i for i in range(1, 10)]
    assert [ns.state_of(journal.get(n)) for n in names] == [
        "staged", "drain_requested", "drained", "reboot_requested", "verified", "done", "failed", "refused",
        "upgrade_required"]
    assert ns.count_states(journal, names) == {
        "upgrade_required": 1, "drain_requested": 1, "drained": 1, "staged": 1, "reboot_requested": 1,
        "verified": 1, "done": 1, "failed": 1, "refused": 1}
    lost = rollout_journal.fold(list(enumerate(lines[:1], start=1)),
                                [{"line": 2, "text": "unreadable: journal.jsonl:2: cut", "node": "n1"}])
    assert ns.state_of(lost["n1"]) == "unknown"


def test_the_docs_show_the_table_as_it_is():
    import os
    page = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "docs", "rollout.md")
    with open(page, encoding="utf-8") as handle:
        assert ns.markdown_table() in handle.read()
