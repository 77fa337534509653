# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render a drift report (``module_utils.drift.build_report``) as JSON, Markdown and a Prometheus textfile.

Controller side: Markdown is rendered with Jinja2 (shipped with ansible-core). The Prometheus
output follows the text exposition format (``# HELP`` / ``# TYPE`` lines, label values escaped
for ``\\``, ``"`` and newlines), for node_exporter's textfile collector; write it to a
``*.prom`` file atomically (:func:`write_atomic`).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List, Mapping

from jinja2 import Environment, StrictUndefined

_MARKDOWN = """\
# GPU fleet drift report

{{ report.generated_at or '' }}{{ (' · facts from `%s`' % report.source) if report.source else '' }}

**{{ s.nodes }} nodes: {{ s.in_sync }} in sync, {{ s.drifted }} drifted{% if s.missing %} ({{ s.missing }} without facts){% endif %}.**
Findings: {{ s.by_severity.critical }} critical, {{ s.by_severity.warning }} warning, {{ s.by_severity.info }} info.

## Per class

| class | nodes | in sync | drifted | missing | worst | checks |
|---|---:|---:|---:|---:|---|---|
{% for name, c in report.classes | dictsort %}\
| {{ name | md }} | {{ c.nodes }} | {{ c.in_sync }} | {{ c.drifted }} | {{ c.missing }} | {{ c.worst_severity or '-' }} | \
{% for check, n in c.by_check | dictsort %}{{ check }} {{ n }}{% if not loop.last %}, {% endif %}{% else %}-{% endfor %} |
{% endfor %}

{% if findings %}
## Findings

| node | class | severity | check | GPU | message |
|---|---|---|---|---|---|
{% for f in findings %}\
| {{ f.node | md }} | {{ f.class | md }} | {{ f.severity }} | {{ f.check }} | {{ '-' if f.gpu is none else f.gpu }} | {{ f.message | md }} |
{% endfor %}
{% if omitted %}
… and {{ omitted }} more findings (see the JSON report).
{% endif %}
{% else %}
No drift: every node matches its class.
{% endif %}
"""


def _md(value: Any) -> str:
    """Escape text for a Markdown table cell."""
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _environment() -> Environment:
    env = Environment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = _md
    return env


def render_markdown(report: Mapping[str, Any], max_findings: int = 500) -> str:
    """The report as Markdown: fleet summary, a table per class, then findings by severity.

    :param report: ``drift.build_report`` output.
    :param max_findings: findings listed at most (the most severe first); the rest are counted.
    :returns: Markdown text.
    """
    ranked = sorted(report["findings"], key=lambda f: (-_rank(f["severity"]), f["node"]))
    shown = ranked[:max_findings] if max_findings >= 0 else ranked
    template = _environment().from_string(_MARKDOWN)
    return template.render(report=report, s=report["summary"], findings=shown,
                           omitted=len(ranked) - len(shown))


def _rank(severity: str) -> int:
    return {"info": 0, "warning": 1, "critical": 2}.get(severity, -1)


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _labels(**labels: Any) -> str:
    return "{" + ",".join('%s="%s"' % (key, _label(labels[key])) for key in sorted(labels)) + "}"


def render_prometheus(report: Mapping[str, Any], timestamp: float) -> str:
    """The report as Prometheus text exposition format.

    Metrics: ``gpufleet_drift_node_in_sync{node,class}`` (1/0),
    ``gpufleet_drift_node_findings{node,class,severity}``,
    ``gpufleet_drift_class_nodes{class,status}`` (status ``in_sync``/``drifted``/``missing``),
    ``gpufleet_drift_findings{check,severity}``, ``gpufleet_drift_nodes``,
    ``gpufleet_driver_info{node,class,version,state}`` (1),
    ``gpufleet_drift_report_timestamp_seconds``.

    :param timestamp: epoch seconds of the run.
    """
    lines = []  # type: List[str]

    def family(name: str, kind: str, text: str) -> None:
        lines.append("# HELP %s %s" % (name, text))
        lines.append("# TYPE %s %s" % (name, kind))

    nodes = report["nodes"]
    family("gpufleet_drift_node_in_sync", "gauge", "1 when the node matches its class's declared state.")
    for name in sorted(nodes):
        lines.append("gpufleet_drift_node_in_sync%s %d" % (_labels(node=name, **{"class": nodes[name]["class"]}),
                                                           1 if nodes[name]["in_sync"] else 0))
    family("gpufleet_drift_node_findings", "gauge", "Drift findings per node and severity.")
    for name in sorted(nodes):
        counts = {"info": 0, "warning": 0, "critical": 0}  # type: Dict[str, int]
        for finding in nodes[name]["findings"]:
            counts[finding["severity"]] += 1
        for severity in ("critical", "warning", "info"):
            lines.append("gpufleet_drift_node_findings%s %d" % (
                _labels(node=name, severity=severity, **{"class": nodes[name]["class"]}), counts[severity]))
    family("gpufleet_driver_info", "gauge", "Loaded NVIDIA driver version and driver state per node.")
    for name in sorted(nodes):
        driver = nodes[name]["driver"]
        lines.append("gpufleet_driver_info%s 1" % _labels(node=name, version=driver.get("loaded") or "",
                                                          state=driver.get("state") or "unknown",
                                                          **{"class": nodes[name]["class"]}))
    family("gpufleet_drift_class_nodes", "gauge", "Nodes per GPU class and drift status.")
    for klass, entry in sorted(report["classes"].items()):
        for status in ("in_sync", "drifted", "missing"):
            lines.append("gpufleet_drift_class_nodes%s %d" % (_labels(status=status, **{"class": klass}),
                                                              entry[status]))
    family("gpufleet_drift_findings", "gauge", "Drift findings in the fleet per check and severity.")
    totals = {}  # type: Dict[tuple, int]
    for finding in report["findings"]:
        key = (finding["check"], finding["severity"])
        totals[key] = totals.get(key, 0) + 1
    for (check, severity), count in sorted(totals.items()):
        lines.append("gpufleet_drift_findings%s %d" % (_labels(check=check, severity=severity), count))
    family("gpufleet_drift_nodes", "gauge", "Nodes judged by the drift report.")
    lines.append("gpufleet_drift_nodes %d" % report["summary"]["nodes"])
    family("gpufleet_drift_report_timestamp_seconds", "gauge", "When the drift report ran (epoch seconds).")
    lines.append("gpufleet_drift_report_timestamp_seconds %d" % int(timestamp))
    return "\n".join(lines) + "\n"


def render_json(report: Mapping[str, Any]) -> str:
    """The report as indented JSON text (keys sorted)."""
    return json.dumps(report, indent=1, sort_keys=True, default=str) + "\n"


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename.

    Readers (node_exporter's textfile collector, a web server) never see a half-written file.
    :raises OSError: when the directory cannot be written.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
