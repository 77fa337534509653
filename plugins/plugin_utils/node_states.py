# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every state a node's driver upgrade can be in, and how it moves on: the whole life of a node in one table.

A node's upgrade is a persisted state machine: each state has one handler that looks at the node,
does at most one thing (an *action*, safe to repeat) and moves it on. Waiting is a state, never a
task: a node whose drain, reboot or soak is not over yet stays where it is and holds nothing. The
states follow the GPU Operator's upgrade controller (upgrade required, cordon, wait for jobs,
drain, restart, validation, uncordon, done, failed; NVIDIA k8s-operator-libs ``pkg/upgrade``),
with this collection's own: the driver *staged* (installed and pinned, not loaded) and a reboot
*requested* of the scheduler (``node_upgrade_drain: slurm_reboot``: Slurm reboots the node when its
jobs end and leaves it DOWN), the soak after verification, the rollback, and ``refused`` (the
preflight would not start the node).

:data:`TRANSITIONS` is the table; :func:`advance` applies it (pure: state + what was observed →
next state + one action); :func:`state_of` names the state of a node as the journal
(``rollout_journal.fold``) tells it today, which the step's output counts
(:func:`count_states`). Where today's transaction still runs several states in one task (the
whole transaction of a node in one play, except ``slurm_reboot``'s two passes), the journal knows
fewer states than the table: :func:`state_of` gives the furthest one the journal proves.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

#: state → what it means. Order: the life of a node.
STATES = {
    "upgrade_required": "admitted by the rollout's budget; nothing done to the node yet",
    "drain_requested": "the scheduler was asked to drain (or cordon) the node; its jobs still run",
    "drained": "no job left on the node; it waits for its install admission (drain ahead)",
    "staged": "the target driver is installed and pinned, not loaded",
    "reboot_requested": "the node's reboot was asked for (of the scheduler: it reboots when its jobs end)",
    "rebooted": "a new boot id: the node runs its new driver, out of service, not verified yet",
    "verified": "verification passed; the soak runs (a time stamp, not a task)",
    "rolling_back": "verification failed: the last known-good driver is being put back",
    "done": "upgraded, verified, soaked and returned to service (or already on target)",
    "failed": "rolled back (or not) and left drained and flagged: out of service until cleared",
    "refused": "the preflight did not start the node (flagged, drained by others, unhealthy before)",
    "unknown": "a journal line about the node was lost: the next pass reads the node to find out",
}

#: Terminal states: no observation moves them on.
TERMINAL = ("done", "failed", "refused")

#: Actions, each safe to repeat (a pass killed after an action and before its state was saved does
#: it again on the next pass, with the same effect): what it does and why repeating it is harmless.
ACTIONS = {
    "request_drain": "scontrol update State=DRAIN / kubectl cordon+drain (a node already draining stays so)",
    "install": "install and pin the exact target version (apt/dnf: the same version again changes nothing)",
    "request_reboot": "reboot the node, or scontrol reboot ASAP nextstate=DOWN (asked twice: one reboot)",
    "verify": "read the node and judge it (reads only)",
    "roll_back": "install and pin the last known-good version, reboot, verify it (the same version again: no-op)",
    "return_to_service": "scontrol update State=RESUME / kubectl uncordon (a node in service stays so)",
    "flag": "write the flag file with its reason and next step (written again: the same content)",
    "release": "return a node drained ahead, untouched, to service (the rollout stopped)",
}

#: state → {observation: (next state, action or None)}. An observation the state does not list
#: leaves the node where it is, with no action (it waits).
TRANSITIONS = {
    "upgrade_required": {"admitted": ("drain_requested", "request_drain"),
                         "preflight_refused": ("refused", None)},
    "drain_requested": {"drained": ("drained", None),
                        "drain_timed_out": ("failed", "flag"),
                        "rollout_stopped": ("upgrade_required", "release")},
    "drained": {"install_admitted": ("staged", "install"),
                "rollout_stopped": ("upgrade_required", "release")},
    "staged": {"installed": ("reboot_requested", "request_reboot"),
               "install_failed": ("rolling_back", "roll_back")},
    "reboot_requested": {"new_boot_id": ("rebooted", "verify"),
                         "reboot_timed_out": ("rolling_back", "roll_back")},
    "rebooted": {"verified": ("verified", None),
                 "verification_failed": ("rolling_back", "roll_back")},
    "verified": {"soak_over": ("done", "return_to_service"),
                 "soak_failed": ("rolling_back", "roll_back")},
    "rolling_back": {"rolled_back": ("failed", "flag"),
                     "rollback_failed": ("failed", "flag")},
    "unknown": {"read_in_flight": ("rebooted", "verify"),
                "read_done": ("done", None),
                "read_untouched": ("upgrade_required", None)},
}


def advance(state: str, observation: Optional[str]) -> Dict[str, Any]:
    """One handler's step: where a node goes from ``state`` on ``observation``, and the one action.

    :param state: a key of :data:`STATES`.
    :param observation: what the pass saw (a key of ``TRANSITIONS[state]``), or ``None``.
    :returns: ``{"state": next state, "action": a key of :data:`ACTIONS` or None, "waits": bool}``;
        ``waits`` is true when nothing moved (the observation is not one the state reacts to):
        the node holds nothing until a later pass sees more.
    :raises ValueError: for a state not in :data:`STATES`.
    """
    if state not in STATES:
        raise ValueError("unknown node state %r (one of %s)" % (state, ", ".join(STATES)))
    found = TRANSITIONS.get(state, {}).get(observation or "")
    if found is None:
        return {"state": state, "action": None, "waits": True}
    return {"state": found[0], "action": found[1], "waits": False}


def state_of(entry: Optional[Mapping[str, Any]]) -> str:
    """The state of a node as the journal tells it (``rollout_journal.fold``'s entry for the node).

    :param entry: ``{"status", "draining"?, "drained"?, "pending"?, "ambiguous"?, "result"?}`` or
        ``None`` (the journal never named the node).
    :returns: a key of :data:`STATES`: ``upgrade_required`` for a node not started; for one in
        flight, ``unknown`` (a lost line after its last event), ``drain_requested``, ``drained``,
        ``reboot_requested`` (staged, its scheduler reboots it: ``pending``), ``verified`` (held: its
        transaction ended, the soak runs) or ``staged`` (its transaction runs: install to
        verification); ``done``, ``failed`` or ``refused`` for a finished one.
    :raises: nothing.
    """
    entry = entry or {}
    status = entry.get("status")
    if entry.get("ambiguous"):
        return "unknown"
    if status in ("done", "failed", "refused"):
        return str(status)
    if status != "in_flight":
        return "upgrade_required"
    if entry.get("pending"):
        return "reboot_requested"
    if entry.get("draining"):
        return "drain_requested"
    if entry.get("drained"):
        return "drained"
    if entry.get("held"):
        return "verified"
    return "staged"


def count_states(journal: Mapping[str, Mapping[str, Any]], nodes: Any) -> Dict[str, int]:
    """How many of ``nodes`` are in each state (only states with a node), in the order of :data:`STATES`.

    :param journal: ``rollout_journal.read`` (node → fold entry). :param nodes: node names.
    :returns: ``{state: count}``.
    """
    counts = {}  # type: Dict[str, int]
    for name in nodes or []:
        state = state_of(journal.get(name))
        counts[state] = counts.get(state, 0) + 1
    return dict((state, counts[state]) for state in STATES if state in counts)


def walk(start: str, observations: Any) -> Tuple[str, list]:
    """Apply ``observations`` in turn from ``start``: ``(final state, [actions done])`` (for tests and docs)."""
    state, actions = start, []
    for observation in observations:
        step = advance(state, observation)
        state = step["state"]
        if step["action"]:
            actions.append(step["action"])
    return state, actions


def markdown_table() -> str:
    """The table of states as docs/rollout.md shows it (a unit test keeps the page equal to it)."""
    rows = ["| state | means | moves on when (→ next state, (the one action)) |", "|---|---|---|"]
    for state, meaning in STATES.items():
        moves = TRANSITIONS.get(state, {})
        text = "; ".join("%s → `%s`%s" % (observation.replace("_", " "), target, " (%s)" % action if action else "")
                         for observation, (target, action) in moves.items()) or "terminal"
        rows.append("| `%s` | %s | %s |" % (state, meaning, text))
    return "\n".join(rows)
