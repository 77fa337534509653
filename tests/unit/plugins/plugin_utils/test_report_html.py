# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The HTML, JUnit XML and rollout Prometheus outputs, from reports the real engines build (unit tests).

The browser check of the same pages is test_report_html_chromium.py.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET

from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import drift_html, report_junit, rollout_budget
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_html, rollout_timeline
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_report as rr

import report_inputs as ri
from test_drift_prometheus import promtool

HOSTILE = '<script>alert("owned")</script><img src=x onerror=alert(1)>'


class _Tags(html.parser.HTMLParser):
    """The start tags of a page and the text of each table's rows, as a browser's parser sees them."""

    def __init__(self):
        super().__init__()
        self.tags = []
        self.rows = {}
        self._table = None
        self._row = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "table":
            self._table = dict(attrs).get("id")
            self.rows[self._table] = []
        elif tag == "tr" and self._table:
            self._row = []
            self.rows[self._table].append(self._row)

    def handle_data(self, data):
        if self._row is not None and data.strip():
            self._row.append(data.strip())


def parse(text):
    parser = _Tags()
    parser.feed(text)
    return parser


def test_drift_page_summary_overview_and_rows_per_node_and_check():
    report, expected = ri.drift_fleet(600)
    page = parse(drift_html.render_html(report))
    # Summary first: the node counts in the cards, in that order.
    text = drift_html.render_html(report)
    assert text.index(">600<") < text.index('id="classes"') < text.index('id="findings"')
    assert expected == {"drifted": 17, "missing": 1, "in_sync": 583}
    assert "17 of 600 nodes drifted" in text
    # Class × state: a row per class, the counts of in sync, drifted with facts, without facts.
    classes = dict((row[0], row[1:5]) for row in page.rows["classes"][1:])
    # (a100: the 10 nodes 50 W low and 2 that lost a GPU; l40s: gpu00500 without facts)
    assert classes == {"gpu_a100": ["200", "188", "12", "0"], "gpu_h100": ["200", "198", "2", "0"],
                       "gpu_l40s": ["200", "197", "2", "1"]}
    # gpu00060 runs 50 W low on 8 GPUs: one row, the 8 bus ids, one message without "GPU n:".
    rows = [row for row in page.rows["findings"][1:] if row[0] == "gpu00060"]
    assert len(rows) == 1
    node, klass, severity, check, gpus, message = rows[0]
    assert (node, klass, severity, check) == ("gpu00060", "gpu_a100", "warning", "power_limit_w")
    assert gpus == "8 GPUs: " + ", ".join(ri.BUS_IDS)
    assert message == "power_limit_w is 350 W, declared 400 W"
    # gpu00097 lost 0000:4e:00.0: gpu_count and fatal_xid, node-wide, critical rows first.
    lost = [row[3] for row in page.rows["findings"][1:] if row[0] == "gpu00097"]
    assert lost == ["fatal_xid", "gpu_count"]
    assert page.rows["findings"][1][2] == "critical"
    # Self-contained: no script, no external resource.
    assert not [tag for tag, attrs in page.tags if tag in ("script", "link", "img", "iframe")]
    assert not re.search(r"(src|href)=", text)


def test_drift_page_and_junit_escape_a_hostile_node():
    report, _expected = ri.drift_fleet(30, hostile=HOSTILE)
    text = drift_html.render_html(report)
    page = parse(text)
    assert [tag for tag, _attrs in page.tags if tag in ("script", "img")] == []
    assert "&lt;script&gt;alert(&#34;owned&#34;)&lt;/script&gt;" in text
    assert any(row[0] == HOSTILE for row in page.rows["findings"][1:])
    root = ET.fromstring(report_junit.drift_junit(report))
    names = [case.get("name") for case in root.iter("testcase")]
    assert HOSTILE in names


def test_drift_junit_a_case_per_node_a_failure_per_drifted_node():
    report, expected = ri.drift_fleet(600)
    root = ET.fromstring(report_junit.drift_junit(report))
    cases = list(root.iter("testcase"))
    assert len(cases) == 600 and root.get("tests") == "600"
    failed = dict((case.get("name"), case.find("failure")) for case in cases if case.find("failure") is not None)
    # Nodes without facts are drifted too.
    assert len(failed) == expected["drifted"] == int(root.get("failures")) == 17
    assert failed["gpu00060"].get("type") == "power_limit_w"
    assert failed["gpu00060"].get("message") == "power_limit_w: power_limit_w is 350 W, declared 400 W"
    assert "0000:4e:00.0" in failed["gpu00060"].text
    assert failed["gpu00097"].get("type") in ("fatal_xid", "gpu_count")
    assert failed["gpu00500"].get("type") == "facts_missing"
    suites = dict((suite.get("name"), suite.get("tests")) for suite in root.iter("testsuite"))
    assert suites == {"gpufleet drift gpu_a100": "200", "gpufleet drift gpu_h100": "200",
                      "gpufleet drift gpu_l40s": "200"}


def test_rollout_page_stop_reason_quarantine_steps_timeline_and_contract(tmp_path):
    directory = str(tmp_path / "rollout")
    done = ri.rollout_dir(directory, reason=HOSTILE, last="node09")
    paths = done["paths"]
    assert sorted(paths) == ["html", "json", "junit", "markdown", "prometheus"]
    assert all(os.path.dirname(p) == directory for p in paths.values())
    text = open(paths["html"], encoding="utf-8").read()
    page = parse(text)
    assert [tag for tag, _attrs in page.tags if tag in ("script", "img", "link")] == []
    assert "&lt;script&gt;" in text
    # Status first, then the quarantined nodes, then the class overview.
    assert text.index('id="status"') < text.index('id="quarantined"') < text.index('id="classes"')
    assert [row[0] for row in page.rows["quarantined"][1:]] == ["node06", "node09"]
    # Each node's stage and step: node01 alone in step 1, node02 and node04 in step 2...
    nodes = dict((row[0], row[1:5]) for row in page.rows["nodes"][1:])
    assert nodes["node01"] == ["gpu_h100", "golden", "1", "upgraded"]
    assert nodes["node04"] == ["gpu_v100", "canary", "2", "upgraded"]
    assert nodes["node06"] == ["gpu_a100", "waves", "3", "rolled back"]
    assert nodes["node09"] == ["gpu_h100", "waves", "4", "rolled back"]
    # The timeline: stacked areas for done, failed, in flight and pending, in inline SVG.
    states = [re.search(r"<title>([^<]+)</title>", p).group(1) for p in re.findall(r"<path [^>]+>.*?</path>", text, re.S)]
    assert states == ["done", "failed", "in flight", "pending"]
    # The golden node's contract diff, as contract_diff.describe writes it.
    assert "<li>reserved memory 545 → 612 MiB on 8 GPUs</li>" in text
    assert "<li>CUDA 13.0 → 13.2</li>" in text
    budgets = dict((row[0], row[1:]) for row in page.rows["budgets"][1:])
    assert budgets["gpu_a100"][-1] == "0" and budgets["gpu_l40s"][-1] == "1"


def test_rollout_steps_and_timeline_from_journal_lines():
    lines = [json.dumps(e) for e in (
        {"event": "started", "node": "a", "time": 10.0}, {"event": "finished", "node": "a", "status": "done", "time": 20.0},
        {"event": "rendered", "step": True, "time": 21.0},
        {"event": "started", "node": "b", "time": 30.0}, {"event": "started", "node": "c", "time": 30.0},
        {"event": "finished", "node": "b", "status": "failed", "time": 50.0})] + ["{cut"]
    events = rollout_timeline.parse(lines)
    assert len(events) == 6
    assert rollout_timeline.steps(events) == {"a": 1, "b": 2, "c": 2}
    line = rollout_timeline.timeline(events, planned=4)
    counts = [(p["time"], p["counts"]) for p in line["points"]]
    assert counts[0] == (10.0, {"done": 0, "failed": 0, "refused": 0, "in_flight": 1, "pending": 3})
    assert counts[-1] == (50.0, {"done": 1, "failed": 1, "refused": 0, "in_flight": 1, "pending": 1})
    # Both nodes started at 30 s are one point.
    assert [t for t, _c in counts] == [10.0, 20.0, 30.0, 50.0]
    sampled = rollout_timeline.timeline(events, planned=4, max_points=3)
    assert [p["time"] for p in sampled["points"]] == [10.0, 30.0, 50.0]
    assert sampled["points"][1]["counts"]["in_flight"] == 2


def test_rollout_junit_and_metrics_written_at_render(tmp_path):
    directory = str(tmp_path / "rollout")
    done = ri.rollout_dir(directory)
    root = ET.parse(done["paths"]["junit"]).getroot()
    cases = dict((case.get("name"), case) for case in root.iter("testcase"))
    assert len(cases) == 8 and root.get("failures") == "1"
    failure = cases["node06"].find("failure")
    assert failure.get("type") == "rolled_back"
    assert failure.get("message") == "rolled back: GPU count changed: 8 before, 7 after; Xid 79 on 0000:4e:00.0"
    assert "rolled back to 580.126.20 (verified)" in failure.text
    assert cases["node01"].get("classname") == "gpu_h100" and cases["node01"].get("time") == "240.0"
    text = open(done["paths"]["prometheus"], encoding="utf-8").read()
    samples = dict(((s.name, frozenset(s.labels.items())), s.value)
                   for family in text_string_to_metric_families(text) for s in family.samples)

    def labels(**items):
        return frozenset(dict(items, rollout_id="demo-ltsb").items())
    assert samples[("gpufleet_rollout_nodes", labels(**{"class": "gpu_a100", "result": "rolled_back"}))] == 1.0
    assert samples[("gpufleet_rollout_nodes", labels(**{"class": "gpu_h100", "result": "upgraded"}))] == 3.0
    assert samples[("gpufleet_rollout_failure_budget_left_nodes", labels(**{"class": "gpu_a100"}))] == 0.0
    assert samples[("gpufleet_rollout_failure_budget_left_nodes", labels(**{"class": "gpu_h100"}))] == 1.0
    info = [dict(found) for (name, found) in samples if name == "gpufleet_rollout_info"]
    assert info == [{"rollout_id": "demo-ltsb", "status": "completed", "stop_reason": ""}]
    proc = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # One step-ending line per step in the journal, none for a render that admitted nobody since.
    rr.render(directory, step_end=True)
    with open(os.path.join(directory, "journal.jsonl"), encoding="utf-8") as handle:
        journal = [json.loads(line) for line in handle]
    assert sum(1 for event in journal if event["event"] == "rendered") == 4


def test_rollout_page_of_a_stopped_rollout_says_why_first():
    plan = {"rollout_id": "r", "stages": [{"name": "golden", "hosts": ["h1"]}, {"name": "waves", "hosts": ["h2"]}],
            "nodes": [{"name": "h1", "class": "gpu_h100", "stage": "golden"},
                      {"name": "h2", "class": "gpu_h100", "stage": "waves"}]}
    records = {"h1": {"node": "h1", "stage": "golden", "class": "gpu_h100", "result": "flagged",
                      "reason": "driver <b>620</b> did not load"}}
    nodes = [{"name": "h1", "class": "gpu_h100", "stage": "golden", "status": "failed", "signature": "driver_state",
              "implicates_driver": True}, {"name": "h2", "class": "gpu_h100", "stage": "waves", "status": "pending"}]
    report = rr.build_report(plan, records, "2026-12-02T04:00:00Z",
                             rollout_budget.decide(nodes, rollout_budget.normalize_options({})))
    text = rollout_html.render_html(report, [], plan)
    first = re.search(r'<div class="banner (\w+)" id="status"><b>(\w+)</b>: ([^<]+)<div>stopped by <b>(\w+)</b>', text)
    assert first.groups() == ("bad", "Stopped", "golden node h1 failed: driver_state", "h1")
    assert "driver &lt;b&gt;620&lt;/b&gt; did not load" in text
    # A node not started keeps its class from the plan; the JUnit file skips it.
    assert report["nodes"][1] == {"node": "h2", "stage": "waves", "result": "not_started", "class": "gpu_h100",
                                  "outcome": "not_started", "next_step": None}
    skipped = ET.fromstring(report_junit.rollout_junit(report)).find(".//testcase[@name='h2']/skipped")
    assert skipped.get("message") == "not started: not started yet"
