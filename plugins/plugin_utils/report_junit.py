# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift and rollout reports as JUnit XML, for CI systems (GitLab, Jenkins, GitHub checks).

One ``<testsuite>`` per GPU class, one ``<testcase>`` per node (``classname`` the class, ``name``
the node). Drift: a drifted node is a ``<failure>`` (type: its worst check; message: its findings),
a node without facts too. Rollout: each node's one outcome (``rollout_outcome``) is its case's
``outcome`` property; ``rolled_back``, ``rolled_back_flagged``, ``flagged``, ``failed``,
``unreachable``, ``interrupted`` and ``unknown`` are failures (type: the outcome) with the record's
reason and the next step; ``refused``, ``pending`` and ``not_started`` are ``<skipped>``.
The element and attribute names are those of the JUnit XML form that Jenkins'
JUnit plugin and GitLab read (testsuites / testsuite / testcase / failure / skipped /
system-out); written with the standard library's ``xml.etree.ElementTree``, which escapes text.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.drift import finding_severity_rank
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.drift_html import node_rows
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_next_step import next_step_text
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_outcome import LABELS, outcome

#: Rollout outcomes (rollout_outcome.OUTCOMES) that fail a node's test case.
ROLLOUT_FAILURES = ("rolled_back", "rolled_back_flagged", "flagged", "failed", "unreachable", "interrupted", "unknown")
#: Rollout outcomes that skip it (nothing was changed on the node yet, or its check waits for a reboot).
ROLLOUT_SKIPS = ("refused", "pending", "not_started")


def _suites(name: str, cases: Mapping[str, List[ET.Element]], timestamp: Optional[str]) -> ET.Element:
    root = ET.Element("testsuites", name=name)
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for klass in sorted(cases):
        suite = ET.SubElement(root, "testsuite", name="%s %s" % (name, klass))
        counts = {"tests": len(cases[klass]), "failures": 0, "skipped": 0}
        for case in cases[klass]:
            counts["failures"] += case.find("failure") is not None
            counts["skipped"] += case.find("skipped") is not None
            suite.append(case)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("errors", "0")
        if timestamp:
            suite.set("timestamp", timestamp)
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("errors", "0")
    return root


def _text(root: ET.Element) -> str:
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def drift_junit(report: Mapping[str, Any]) -> str:
    """The drift report as JUnit XML text: a test case per node, a failure per drifted node.

    :param report: ``drift.roll_up`` output.
    :returns: XML text; the failure's ``message`` is the node's most severe finding, its text every
        finding (one line per node and check, GPUs by PCI bus id: ``drift_html.node_rows``).
    """
    by_node = {}  # type: Dict[str, List[Dict[str, Any]]]
    for row in node_rows(report):
        by_node.setdefault(row["node"], []).append(row)
    cases = {}  # type: Dict[str, List[ET.Element]]
    for name in sorted(report["nodes"]):
        node = report["nodes"][name]
        case = ET.Element("testcase", classname=node["class"], name=name)
        rows = by_node.get(name, [])
        if not node["in_sync"]:
            worst = max(rows, key=lambda r: finding_severity_rank(r["severity"]))
            lines = ["%s %s%s: %s" % (r["severity"], r["check"],
                                      (" [%s]" % ", ".join(r["gpus"])) if r["gpus"] else "", "; ".join(r["messages"]))
                     for r in rows]
            failure = ET.SubElement(case, "failure", type=worst["check"],
                                    message="%s: %s" % (worst["check"], "; ".join(worst["messages"])))
            failure.text = "\n".join(lines)
        elif rows:
            ET.SubElement(case, "system-out").text = "\n".join(
                "%s %s: %s" % (r["severity"], r["check"], "; ".join(r["messages"])) for r in rows)
        cases.setdefault(node["class"], []).append(case)
    return _text(_suites("gpufleet drift", cases, report.get("generated_at")))


def rollout_junit(report: Mapping[str, Any]) -> str:
    """The rollout report as JUnit XML text: a test case per node of the plan.

    :param report: ``rollout_report.build_report`` output (``nodes``: records, or
        ``{"node", "stage", "result": "not_started"}``).
    :returns: XML text; ``time`` is the transaction's ``durations.total_s`` (seconds) when known.
    """
    cases = {}  # type: Dict[str, List[ET.Element]]
    for node in report["nodes"]:
        result = node.get("outcome") or outcome(node)
        klass = str(node.get("class") or "unclassified")
        case = ET.Element("testcase", classname=klass, name=str(node.get("node")))
        total = (node.get("durations") or {}).get("total_s")
        if total is not None:
            case.set("time", "%.1f" % float(total))
        ET.SubElement(ET.SubElement(case, "properties"), "property", name="outcome", value=result)
        label = LABELS.get(result, result)
        reason = str(node.get("reason") or ("not started yet" if result == "not_started" else label))
        if result in ROLLOUT_FAILURES:
            failure = ET.SubElement(case, "failure", type=result, message="%s: %s" % (label, reason))
            rollback = node.get("rollback") or {}
            failure.text = "stage %s; %s%s%s" % (node.get("stage") or "-", reason, (
                "; rolled back to %s (%s)" % (rollback["version"], "verified" if rollback.get("ok") else "not verified"))
                if result in ("rolled_back", "rolled_back_flagged") and rollback.get("version") else "",
                "; next step: %s" % next_step_text(node["next_step"]) if isinstance(node.get("next_step"), Mapping) else "")
        elif result in ROLLOUT_SKIPS:
            ET.SubElement(case, "skipped", message="%s: %s" % (label, reason))
        else:
            ET.SubElement(case, "system-out").text = "%s: %s → %s" % (
                label, (node.get("before") or {}).get("loaded") or "-", (node.get("after") or {}).get("loaded") or "-")
        cases.setdefault(klass, []).append(case)
    return _text(_suites("gpufleet rollout %s" % (report.get("rollout_id") or ""), cases, report.get("generated_at")))
