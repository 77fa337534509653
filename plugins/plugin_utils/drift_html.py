# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift report (``plugin_utils.drift.roll_up``) as one self-contained HTML page.

Order of the page: the fleet summary; the class × state overview (a row per GPU class: nodes in
sync, drifted, without facts, with a bar); findings per check and class; then the findings
grouped per node, one row per node and check, naming the GPUs by PCI bus id (a GPU's index
moves when a GPU falls off the bus; its bus id does not). Rendered with Jinja2, autoescaping on
(``report_html``).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.drift import finding_severity_rank
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import report_html

#: The columns of the class × state overview (``drifted`` here: drifted with facts).
STATES = ("in_sync", "drifted", "missing")

_GPU_PREFIX = re.compile(r"^GPU \S+?: ")

_BODY = """
<div class="cards">
  <div class="card"><div class="n">{{ s.nodes }}</div><div class="l">nodes</div></div>
  <div class="card"><div class="n" style="color:{{ colours.in_sync }}">{{ s.in_sync }}</div><div class="l">in sync</div></div>
  <div class="card"><div class="n" style="color:{{ colours.drifted }}">{{ s.drifted }}</div><div class="l">drifted</div></div>
  <div class="card"><div class="n" style="color:{{ colours.missing }}">{{ s.missing }}</div><div class="l">without facts</div></div>
  <div class="card"><div class="n" style="color:{{ colours.critical }}">{{ s.by_severity.critical }}</div><div class="l">critical findings</div></div>
  <div class="card"><div class="n" style="color:{{ colours.warning }}">{{ s.by_severity.warning }}</div><div class="l">warning findings</div></div>
</div>
{% if s.drifted %}
<div class="banner bad"><b id="verdict">{{ s.drifted }} of {{ s.nodes }} nodes drifted</b>{% if s.missing %} ({{ s.missing }} without facts){% endif %};
worst severity: {{ s.worst_severity }}.</div>
{% else %}
<div class="banner good"><b id="verdict">All {{ s.nodes }} nodes in sync</b>: every node matches its class.</div>
{% endif %}

<h2>GPU classes</h2>
{{ legend(['in_sync', 'drifted', 'missing']) }}
<table id="classes">
<tr><th>class</th><th class="num">nodes</th><th class="num">in sync</th><th class="num">drifted</th>
<th class="num">without facts</th><th>worst</th><th style="width:30%">share</th></tr>
{% for row in classes %}
<tr><td><b>{{ row.name }}</b></td><td class="num">{{ row.total }}</td>
{{ count(row.counts.in_sync) }}{{ count(row.counts.drifted) }}{{ count(row.counts.missing) }}
<td>{% if row.worst %}{{ pill(row.worst) }}{% else %}<span class="muted">-</span>{% endif %}</td><td>{{ bar(row.segments) }}</td></tr>
{% endfor %}
</table>

{% if checks %}
<h2>Findings per check</h2>
<table id="checks">
<tr><th>check</th><th>severity</th>{% for name in class_names %}<th class="num">{{ name }}</th>{% endfor %}<th class="num">all</th></tr>
{% for c in checks %}
<tr><td><code>{{ c.check }}</code></td><td>{{ pill(c.severity) }}</td>{% for name in class_names %}{{ count(c.by_class.get(name, 0)) }}{% endfor %}
<td class="num"><b>{{ c.total }}</b></td></tr>
{% endfor %}
</table>
{% endif %}

{% if rows %}
<h2>Findings per node</h2>
<p class="note">One row per node and check; GPUs by PCI bus id.{% if omitted %} The {{ shown }} most severe rows are shown;
{{ omitted }} more are in drift-report.json.{% endif %}</p>
<table id="findings">
<tr><th>node</th><th>class</th><th>severity</th><th>check</th><th>GPUs</th><th>finding</th></tr>
{% for r in rows %}
<tr><td><b>{{ r.node }}</b>{% if r.hostname %}<div class="muted mono">{{ r.hostname }}</div>{% endif %}</td><td>{{ r.class }}</td>
<td>{{ pill(r.severity) }}</td><td><code>{{ r.check }}</code></td>
<td class="gpus">{% if r.gpus %}{{ r.gpus | length }} GPU{{ 's' if r.gpus | length != 1 else '' }}: {{ r.gpus | join(', ') }}{% else %}node{% endif %}</td>
<td>{% for m in r.messages %}{{ m }}{% if not loop.last %}<br>{% endif %}{% endfor %}</td></tr>
{% endfor %}
</table>
{% endif %}
{% if skipped %}
<h2>Outputs not written</h2>
<ul id="skipped">{% for name, note in skipped %}<li><b>{{ name }}</b>: {{ note }}</li>{% endfor %}</ul>
{% endif %}
{% if errors %}
<h2>Fact sources that could not be read</h2>
<table id="errors"><tr><th>node</th><th>why</th></tr>
{% for node, why in errors %}<tr><td>{{ node }}</td><td>{{ why }}</td></tr>{% endfor %}
</table>
{% endif %}
"""


def gpu_name(node: Mapping[str, Any], finding: Mapping[str, Any]) -> str:
    """How a finding's GPU is named: its PCI bus id (``0000:4e:00.0``), else ``GPU <index>``.

    :param node: the node's entry of the report (``gpus``: ``drift.gpu_summaries``, when kept).
    :param finding: a finding (``gpu``: NVML index or ``None``; ``pci_bus_id`` when it has one).
    :returns: ``""`` for a node-wide finding.
    """
    if finding.get("pci_bus_id"):
        return str(finding["pci_bus_id"])
    index = finding.get("gpu")
    if index is None:
        return ""
    for gpu in node.get("gpus") or []:
        if gpu.get("index") == index and gpu.get("pci_bus_id"):
            return str(gpu["pci_bus_id"])
    return "GPU %s" % index


def node_rows(report: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The findings grouped per node and check, most severe first, then by node name.

    :returns: ``[{"node", "hostname", "class", "check", "severity", "gpus": [bus id], "messages":
        [distinct texts, without their "GPU n: " prefix when GPUs are listed]}]``.
    """
    rows = {}  # type: Dict[tuple, Dict[str, Any]]
    nodes = report["nodes"]
    for finding in report["findings"]:
        node = nodes.get(finding["node"]) or {}
        key = (finding["node"], finding["check"])
        row = rows.get(key)
        if row is None:
            row = rows[key] = {"node": finding["node"], "hostname": node.get("hostname"), "class": finding["class"],
                               "check": finding["check"], "severity": finding["severity"], "gpus": [],
                               "messages": []}
        if finding_severity_rank(finding["severity"]) > finding_severity_rank(row["severity"]):
            row["severity"] = finding["severity"]
        name = gpu_name(node, finding)
        message = str(finding.get("message") or "")
        if name:
            if name not in row["gpus"]:
                row["gpus"].append(name)
            message = _GPU_PREFIX.sub("", message)
        if message not in row["messages"]:
            row["messages"].append(message)
    for row in rows.values():
        row["gpus"].sort()
    return sorted(rows.values(), key=lambda r: (-finding_severity_rank(r["severity"]), r["node"], r["check"]))


def render_html(report: Mapping[str, Any], max_rows: int = 5000) -> str:
    """The drift report as one self-contained HTML page.

    :param report: ``drift.roll_up`` output (with ``source_errors`` and ``skipped_outputs``
        (``{format: why it was not written}``) when the action added them).
    :param max_rows: node-and-check rows shown at most, most severe first (the JSON has all);
        a negative number shows all.
    :returns: HTML text (UTF-8 when written).
    """
    summary = report["summary"]
    classes = report["classes"]
    overview = report_html.matrix(
        ((name, {"in_sync": entry["in_sync"], "drifted": entry["drifted"] - entry["missing"],
                 "missing": entry["missing"]}) for name, entry in sorted(classes.items())), STATES)
    for row in overview:
        row["worst"] = classes[row["name"]].get("worst_severity")
    checks = {}  # type: Dict[str, Dict[str, Any]]
    for name, entry in classes.items():
        for check, count in (entry.get("by_check") or {}).items():
            row = checks.setdefault(check, {"check": check, "by_class": {}, "total": 0, "severity": None})
            row["by_class"][name] = count
            row["total"] += count
    for finding in report["findings"]:
        row = checks.get(finding["check"])
        if row is not None and finding_severity_rank(finding["severity"]) > finding_severity_rank(row["severity"]):
            row["severity"] = finding["severity"]
    rows = node_rows(report)
    shown = rows[:max_rows] if max_rows >= 0 else rows
    env = report_html.environment()
    body = env.from_string(_BODY).render(
        s=summary, classes=overview, class_names=sorted(classes), rows=shown, shown=len(shown),
        omitted=len(rows) - len(shown), errors=sorted((report.get("source_errors") or {}).items()),
        skipped=sorted((report.get("skipped_outputs") or {}).items()),
        checks=sorted(checks.values(), key=lambda c: (-finding_severity_rank(c["severity"]), -c["total"], c["check"])))
    meta = " · ".join(part for part in (report.get("generated_at") or "", ("facts from %s" % report["source"])
                                        if report.get("source") else "") if part)
    return report_html.page(env, "GPU fleet drift report", meta, body)
