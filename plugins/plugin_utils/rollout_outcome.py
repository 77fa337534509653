# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each node of a rollout report in exactly one outcome, and the counts every format shows.

A node's record (``rollout_report``) has one ``result``, written by the ``node_upgrade`` role;
a rollback is told apart inside ``flagged``: a node whose rollback was installed and still fails
its verification is ``rolled_back_flagged`` ("rolled back and still flagged"), one outcome, not
a rollback counted beside a flag. The text, Markdown, HTML, JSON, JUnit and Prometheus outputs
and the playbooks' ``set_stats`` all count with :func:`count` and name outcomes with
:data:`LABELS`, so their per-outcome counts add up to the node count in each of them.

Controller side; pure functions.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping

#: Every outcome, in the order the reports list them.
OUTCOMES = ("upgraded", "skipped", "rolled_back", "rolled_back_flagged", "flagged", "refused", "failed",
            "unreachable", "interrupted", "pending", "unknown", "not_started")

#: What each outcome is called in the reports.
LABELS = {
    "upgraded": "upgraded",
    "skipped": "already on target",
    # On its last known-good driver, verified; left drained and flagged for a look before a new attempt.
    "rolled_back": "rolled back",
    # The rollback was installed but the node still fails its verification (a lost GPU, a fatal Xid).
    "rolled_back_flagged": "rolled back and still flagged",
    # Failed, and its rollback was not installed (none to go back to, the node did not answer, ...).
    "flagged": "flagged",
    "refused": "refused",
    "failed": "failed",
    "unreachable": "unreachable",
    "interrupted": "interrupted",
    # Staged, waiting for the reboot Slurm runs once its jobs have ended (node_upgrade_drain=slurm_reboot).
    "pending": "waiting for its reboot",
    # A result this version of the report does not know: shown, never counted as another.
    "unknown": "result not understood",
    "not_started": "not started",
}

#: Outcomes every summary shows, even at 0; the others only when some node has them.
ALWAYS_SHOWN = ("upgraded", "skipped", "rolled_back", "rolled_back_flagged", "flagged", "refused", "not_started")

#: Outcomes of a node that is in service on its target (or not touched yet).
IN_SERVICE = ("upgraded", "skipped", "not_started")

_TRUE = (True, "True", "true", "yes")


def rollback_installed(record: Mapping[str, Any]) -> bool:
    """Whether the node's rollback driver was installed (verified or not).

    :param record: a rollout record: ``rollback`` ``{version, ok}`` (the version chosen to go back to,
        set even when the rollback did not run), ``flag`` (the node's flag file content, with
        ``rollback_installed`` read on the node after the rollback), ``after.loaded``.
    :returns: the flag's ``rollback_installed`` when the record has it; else whether the loaded
        driver after the transaction is the rollback version; ``False`` without a rollback version.
    """
    rollback = record.get("rollback") if isinstance(record.get("rollback"), Mapping) else {}
    if not rollback.get("version"):
        return False
    if rollback.get("ok") in _TRUE:
        return True
    flag = record.get("flag")
    if isinstance(flag, Mapping) and "rollback_installed" in flag:
        return flag["rollback_installed"] in _TRUE
    after = record.get("after") if isinstance(record.get("after"), Mapping) else {}
    return bool(after.get("loaded")) and str(after.get("loaded")) == str(rollback["version"])


def outcome(record: Mapping[str, Any]) -> str:
    """The one outcome of a node: one of :data:`OUTCOMES`.

    :param record: a rollout record, or ``{"node", "stage", "result": "not_started"}``.
    :returns: the record's ``result``, except ``flagged`` with its rollback installed
        (:func:`rollback_installed`): ``rolled_back_flagged``; a result that is not an outcome:
        ``unknown``; no result: ``failed`` (a record always has one; a missing one is not a success).
    """
    result = record.get("result")
    if not result:
        return "failed"
    if result == "flagged" and rollback_installed(record):
        return "rolled_back_flagged"
    if result == "rolled_back_flagged" or result not in OUTCOMES:
        return "unknown"
    return str(result)


def count(records: Iterable[Mapping[str, Any]]) -> Dict[str, int]:
    """``{outcome: n for every outcome, "nodes": n}``: each record counted once, so the outcomes add
    up to ``nodes``."""
    counts = dict((name, 0) for name in OUTCOMES)
    total = 0
    for record in records:
        counts[outcome(record)] += 1
        total += 1
    counts["nodes"] = total
    return counts


def shown(summary: Mapping[str, Any]) -> List[str]:
    """The outcomes a report shows for ``summary`` (:func:`count` output): :data:`ALWAYS_SHOWN`
    and every other outcome some node has, in :data:`OUTCOMES` order."""
    return [name for name in OUTCOMES if name in ALWAYS_SHOWN or summary.get(name)]


def summary_line(summary: Mapping[str, Any]) -> str:
    """The summary as one sentence, for the run's output and the reports:
    ``"8 nodes: 7 upgraded, 0 already on target, 0 rolled back, 1 rolled back and still flagged,
    0 flagged, 0 refused, 0 not started"``.

    :param summary: :func:`count` output.
    """
    return "%d nodes: %s" % (summary.get("nodes", 0), ", ".join(
        "%d %s" % (summary.get(name, 0), LABELS[name]) for name in shown(summary)))
