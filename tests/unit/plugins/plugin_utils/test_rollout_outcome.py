# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each node of a rollout in exactly one outcome, and the counts adding up to the node count in every
format: the summary sentence, Markdown, HTML, JSON, JUnit, Prometheus and the playbook's set_stats."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_outcome as ro
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_report as rr

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))

#: One node per outcome: the record that gives it (None: planned, not started).
RECORDS = {
    "n-upgraded": {"result": "upgraded"},
    "n-skipped": {"result": "skipped"},
    "n-rolled-back": {"result": "rolled_back", "after": {"loaded": "580.126.20"},
                      "rollback": {"version": "580.126.20", "ok": True}},
    # The demo's node06: the rollback installed, a GPU still lost: one outcome, not a rollback and a flag.
    "n-rolled-back-flagged": {"result": "flagged", "after": {"loaded": "580.126.20"},
                              "rollback": {"version": "580.126.20", "ok": False},
                              "flag": {"flagged": True, "rollback_installed": True, "rollback_verified": False}},
    # A rollback version was chosen but the node did not answer: never installed.
    "n-flagged": {"result": "flagged", "after": {}, "rollback": {"version": "580.126.20", "ok": False},
                  "flag": {"flagged": True, "rollback_installed": False}},
    "n-refused": {"result": "refused"},
    "n-failed": {"result": "failed"},
    "n-unreachable": {"result": "unreachable"},
    "n-interrupted": {"result": "interrupted"},
    "n-pending": {"result": "pending"},
    "n-unknown": {"result": "half_done"},
    "n-not-started": None,
}
EXPECTED = dict(zip(RECORDS, ro.OUTCOMES))


def test_every_outcome_has_a_node_and_a_label():
    assert len(set(EXPECTED.values())) == len(ro.OUTCOMES) == 12
    assert set(ro.LABELS) == set(ro.OUTCOMES)
    assert len(set(ro.LABELS.values())) == len(ro.LABELS)


@pytest.mark.parametrize("node", sorted(RECORDS))
def test_outcome_of_each_record(node):
    record = dict(RECORDS[node] or {"result": "not_started"}, node=node)
    assert ro.outcome(record) == EXPECTED[node]


def test_rollback_installed_without_a_flag_reads_the_loaded_driver():
    assert ro.rollback_installed({"rollback": {"version": "580.126.20"}, "after": {"loaded": "580.126.20"}}) is True
    assert ro.rollback_installed({"rollback": {"version": "580.126.20"}, "after": {"loaded": "620.82.01"}}) is False
    assert ro.rollback_installed({"rollback": None, "after": {"loaded": "580.126.20"}}) is False
    assert ro.outcome({}) == "failed"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("rollout") / "report")
    hosts = sorted(RECORDS)
    rr.write_plan(directory, {"rollout_id": "every-outcome", "stages": [
        {"name": "golden", "hosts": hosts[:1]}, {"name": "canary", "hosts": hosts[1:3]},
        {"name": "waves", "hosts": hosts[3:]}]})
    for node, record in RECORDS.items():
        if record is not None:
            rr.store_record(directory, dict(record, node=node, stage="waves", rollout_id="every-outcome", run_id="r1",
                                            target={"version": "620.82.01"}, **{"class": "gpu_h100"}))
    return rr.render(directory, "2026-12-06T00:00:00Z")


def _read(rendered, name):
    with open(rendered["paths"][name], encoding="utf-8") as handle:
        return handle.read()


def _pairs(sentence):
    """``{label: n}`` of a summary sentence, and the node count it starts with."""
    head, rest = sentence.split(" nodes: ", 1)
    pairs = {}
    for part in rest.rstrip(".").split(", "):
        number, label = part.split(" ", 1)
        assert label not in pairs, label
        pairs[label] = int(number)
    return int(head), pairs


def test_json_counts_each_node_once(rendered):
    report = json.loads(_read(rendered, "json"))
    summary = report["summary"]
    assert summary["nodes"] == len(RECORDS) == 12
    assert dict((name, summary[name]) for name in ro.OUTCOMES) == dict((name, 1) for name in ro.OUTCOMES)
    assert sorted(summary) == sorted(ro.OUTCOMES + ("nodes",))
    assert dict((n["node"], n["outcome"]) for n in report["nodes"]) == EXPECTED
    for stage in report["stages"]:
        assert sum(stage["counts"].values()) == len(stage["hosts"]), stage["name"]


def test_text_and_markdown_add_up(rendered):
    summary = rendered["report"]["summary"]
    line = ro.summary_line(summary)
    total, pairs = _pairs(line)
    assert total == 12 and sum(pairs.values()) == 12
    assert pairs == dict((ro.LABELS[name], 1) for name in ro.OUTCOMES)
    assert pairs["rolled back and still flagged"] == 1 and pairs["flagged"] == 1 and pairs["rolled back"] == 1
    markdown = _read(rendered, "markdown")
    assert markdown.count(line + ".") == 1
    rows = [row for row in markdown.splitlines() if row.startswith("| ")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert header == ["stage", "nodes"] + [ro.LABELS[name] for name in ro.OUTCOMES]
    stage_rows = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:4]]
    assert [row[0] for row in stage_rows] == ["golden", "canary", "waves"]
    for row in stage_rows:
        assert sum(int(cell) for cell in row[2:]) == int(row[1]), row
    assert sum(int(row[1]) for row in stage_rows) == 12
    node_rows = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[5:]]
    assert sorted(row[2] for row in node_rows) == sorted(ro.OUTCOMES)


def test_html_adds_up(rendered):
    page = html.unescape(_read(rendered, "html"))
    cards = re.findall(r'<div class="card"><div class="n"[^>]*>(\d+)</div>\s*<div class="l">([^<]+)</div></div>', page)
    counted = dict((label, int(n)) for n, label in cards if label != "nodes")
    assert ("12", "nodes") in cards
    assert counted == dict((ro.LABELS[name], 1) for name in ro.OUTCOMES)
    stages = page.split('<table id="stages">', 1)[1].split("</table>", 1)[0]
    for row in re.findall(r"<tr><td><b>\w+</b></td>(.*?)</tr>", stages, re.S):
        numbers = [int(n) for n in re.findall(r'<td class="num[^"]*">(\d+)</td>', row)]
        assert sum(numbers[1:]) == numbers[0], row
    assert page.count("rolled back and still flagged") >= 2  # its card and its node's pill


def test_junit_adds_up(rendered):
    root = ET.fromstring(_read(rendered, "junit"))
    cases = list(root.iter("testcase"))
    outcomes = [case.find("properties/property[@name='outcome']").get("value") for case in cases]
    assert sorted(outcomes) == sorted(ro.OUTCOMES) and len(cases) == int(root.get("tests")) == 12
    failures = dict((case.get("name"), case.find("failure").get("type")) for case in cases if case.find("failure") is not None)
    assert failures == dict((node, outcome) for node, outcome in EXPECTED.items()
                            if outcome in ("rolled_back", "rolled_back_flagged", "flagged", "failed", "unreachable",
                                           "interrupted", "unknown"))
    assert int(root.get("failures")) == 7 and int(root.get("skipped")) == 3


def test_prometheus_adds_up(rendered):
    prometheus_client = pytest.importorskip("prometheus_client.parser")
    samples = [s for family in prometheus_client.text_string_to_metric_families(_read(rendered, "prometheus"))
               for s in family.samples]
    per_outcome = {}
    for sample in samples:
        if sample.name == "gpufleet_rollout_nodes":  # per class and outcome: the node not started has no class
            per_outcome[sample.labels["result"]] = per_outcome.get(sample.labels["result"], 0) + sample.value
    assert per_outcome == dict((name, 1.0) for name in ro.OUTCOMES)
    staged = [s.value for s in samples if s.name == "gpufleet_rollout_stage_nodes"]
    assert sum(staged) == 12.0


def test_set_stats_of_the_rollout_playbook_adds_up(rendered, tmp_path):
    """The rollout playbook's own "Publish the rollout's outcome to the job" task, after its render."""
    with open(os.path.join(REPO, "playbooks", "rollout.yml"), encoding="utf-8") as handle:
        plays = yaml.safe_load(handle)
    last = [play for play in plays if play.get("name") == "Print the rollout report"][0]
    publish = [task for task in last["tasks"] if "ansible.builtin.set_stats" in task]
    render = [task for task in last["tasks"] if "gpufleet.nvidia.rollout_report" in task]
    assert len(publish) == 1 and len(render) == 1
    directory = os.path.dirname(rendered["paths"]["json"])
    playbook = tmp_path / "pb.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Publish", "hosts": "localhost", "gather_facts": False,
        "vars": {"__gpufleet_rollout": {"rollout_id": "every-outcome", "report_dir": directory}},
        "tasks": render + publish}]))
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_SHOW_CUSTOM_STATS="1",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                           "-e", "ansible_python_interpreter=%s" % sys.executable, str(playbook)],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stats = json.loads(proc.stdout.split("RUN:", 1)[1].strip())["gpufleet_rollout"]
    assert stats["summary"]["nodes"] == 12
    assert sum(stats["summary"][name] for name in ro.OUTCOMES) == 12
    assert sorted(stats["summary"]) == sorted(ro.OUTCOMES + ("nodes",))
    total, pairs = _pairs(stats["summary_text"])
    assert total == 12 and sum(pairs.values()) == 12
