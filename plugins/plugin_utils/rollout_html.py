# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout report (``rollout_report.build_report``) as one self-contained HTML page.

Order of the page: the status and stop reason; the quarantined nodes, apart; counts; the class ×
result overview; the timeline (nodes per state over time, from the journal, as inline SVG); the
golden node's contract diff when its record holds one; the budgets per class; the stages; then
every node with its class, stage, step, result, versions and reason. Rendered with Jinja2,
autoescaping on (``report_html``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils import contract_diff
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import report_html, rollout_outcome, rollout_timeline
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_next_step import next_step_text


_WIDTH, _HEIGHT = 1000, 180

_BODY = """
{% if r.status == 'stopped' %}
<div class="banner bad" id="status"><b>Stopped</b>{% if r.stop_reason %}: {{ r.stop_reason }}{% endif %}
{% if r.stopped_by %}
<div>stopped by {% for n in r.stopped_by %}
<b>{{ n.node }}</b> ({{ labels[n.outcome] }}){% if not loop.last %}, {% endif %}
{% endfor %}
</div>{% endif %}
</div>
{% elif r.status == 'completed' %}
<div class="banner good" id="status"><b>Completed</b>: {{ summary_line }}{% if quarantined %}
; {{ quarantined | length }} quarantined{% endif %}.</div>
{% else %}
<div class="banner busy" id="status"><b>In progress</b>: {{ summary_line }}.</div>
{% endif %}

{% if quarantined %}
<h2>Quarantined ({{ quarantined | length }}): drained and flagged, out of service until cleared</h2>
<table id="quarantined">
<tr><th>node</th><th>class</th><th>stage</th><th>result</th><th>now on</th><th>reason and next step</th></tr>
{% for q in quarantined %}
<tr><td><b>{{ q.node }}</b></td><td>{{ q.class }}</td><td>{{ q.stage }}</td><td>{{ pill(q.outcome, labels[q.outcome]) }}</td>
<td class="mono">{{ q.after }}</td><td>{{ q.reason }}{% if q.next_step %}
<div class="next"><b>Next step</b>: {{ q.next_step }}.</div>{% endif %}</td></tr>
{% endfor %}
</table>
{% endif %}

<div class="cards">
  <div class="card"><div class="n">{{ s.nodes }}</div><div class="l">nodes</div></div>
{% for name in columns %}
  <div class="card"><div class="n" style="color:{{ colours.get(name, '#37474f') }}">{{ s.get(name, 0) }}</div>
<div class="l">{{ labels[name] }}</div></div>
{% endfor %}
{% if r.wall_s is not none %}<div class="card"><div class="n">{{ wall }}</div><div class="l">wall time</div></div>{% endif %}
</div>

<h2>GPU classes</h2>
{{ legend(columns) }}
<table id="classes">
<tr><th>class</th><th class="num">nodes</th>{% for name in columns %}
<th class="num">{{ labels[name] }}</th>{% endfor %}
<th style="width:28%">share</th></tr>
{% for row in classes %}
<tr><td><b>{{ row.name }}</b></td><td class="num">{{ row.total }}</td>
{% for name in columns %}{{ count(row.counts[name]) }}{% endfor %}
<td>{{ bar(row.segments) }}</td></tr>
{% endfor %}
</table>

<h2>Timeline</h2>
{% if chart.areas %}
{{ legend(chart_states) }}
<svg id="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="-40 -10 {{ width + 60 }} {{ height + 40 }}" width="100%"
 style="max-width:{{ width + 60 }}px" role="img" aria-label="nodes per state over time">
<line x1="0" y1="{{ height }}" x2="{{ width }}" y2="{{ height }}" stroke="#90a4ae"/>
<line x1="0" y1="0" x2="0" y2="{{ height }}" stroke="#90a4ae"/>
{% for a in chart.areas %}
<path d="{{ a.d }}" fill="{{ colours.get(a.state, '#607d8b') }}" fill-opacity="0.85">
<title>{{ a.state | replace('_', ' ') }}</title></path>
{% endfor %}
{% for t in chart.ticks %}<text x="{{ t.x }}" y="{{ height + 16 }}" font-size="11" text-anchor="middle" fill="#5b6675">{{ t.label }}</text>
{% endfor %}
<text x="-6" y="4" font-size="11" text-anchor="end" fill="#5b6675">{{ chart.max }}</text>
<text x="-6" y="{{ height }}" font-size="11" text-anchor="end" fill="#5b6675">0</text>
</svg>
<p class="note">Nodes per state from the rollout journal, {{ line_points }} points, time since the first admission.</p>
{% else %}
<p class="note">No journal yet: the timeline starts when a step admits its first node.</p>
{% endif %}

{% if golden %}
<h2>Contract change on the golden node{{ 's' if golden | length > 1 else '' }}</h2>
{% for g in golden %}
<p><b>{{ g.node }}</b> ({{ g.class }}), {{ g.before }} → {{ g.after }}{% if g.decision %}: {{ g.decision }}{% endif %}</p>
<ul class="diff">{% for line in g.lines %}<li>{{ line }}</li>{% else %}<li>no contract change</li>{% endfor %}</ul>
{% endfor %}
{% endif %}

{% if budgets %}
<h2>Budgets per class</h2>
<table id="budgets">
<tr><th>class</th><th class="num">nodes</th><th class="num">max unavailable</th><th class="num">out of service</th>
<th class="num">free slots</th><th class="num">failed</th><th class="num">failure budget</th><th class="num">failures left</th></tr>
{% for b in budgets %}
<tr><td><b>{{ b.name }}</b></td><td class="num">{{ b.nodes }}</td><td class="num">{{ b.max_unavailable }}</td>{{ count(b.out_of_service) }}
<td class="num">{{ b.free }}</td>{{ count(b.failed) }}<td class="num">{{ b.failure_budget }}</td><td class="num"><b>{{ b.left }}</b></td></tr>
{% endfor %}
</table>
{% endif %}

<h2>Stages</h2>
<table id="stages">
<tr><th>stage</th><th class="num">nodes</th>{% for name in columns %}<th class="num">{{ labels[name] }}</th>{% endfor %}</tr>
{% for st in r.stages %}
<tr><td><b>{{ st.name }}</b></td><td class="num">{{ st.hosts | length }}</td>{% for name in columns %}{{ count(st.counts.get(name, 0)) }}{% endfor %}</tr>
{% endfor %}
</table>

{% if skipped %}
<h2>Outputs not written</h2>
<ul id="skipped">{% for name, note in skipped %}<li><b>{{ name }}</b>: {{ note }}</li>{% endfor %}</ul>
{% endif %}

<h2>Nodes</h2>
<table id="nodes">
<tr><th>node</th><th>class</th><th>stage</th><th class="num">step</th><th>result</th><th>before</th><th>after</th>
<th>target</th><th class="num">time</th><th>reason</th></tr>
{% for n in nodes %}
<tr><td><b>{{ n.node }}</b></td><td>{{ n.class }}</td><td>{{ n.stage }}</td><td class="num">{{ n.step }}</td>
<td><span class="pill" style="background:{{ colours.get(n.outcome, '#607d8b') }}">{{ n.result_text }}</span></td>
<td class="mono">{{ n.before }}</td><td class="mono">{{ n.after }}</td><td class="mono">{{ n.target }}</td>
<td class="num">{{ n.time }}</td><td>{{ n.reason }}{% if n.step_next %}
<div class="next"><b>Next step</b>: {{ n.step_next.do }}; {{ n.step_next.clears }}:
<code>{{ n.step_next.command }}</code>{% if n.step_next.resume and n.step_next.resume != n.step_next.command %};
then <code>{{ n.step_next.resume }}</code> takes it back into the rollout{% endif %}.</div>{% endif %}</td></tr>
{% endfor %}
</table>
{% if r.deferred %}<p class="note">Deferred (out of service, to do when back): {{ r.deferred | join(', ') }}</p>{% endif %}
{% if r.notes %}<h2>Notes</h2><ul>{% for note in r.notes %}<li>{{ note }}</li>{% endfor %}</ul>{% endif %}
"""


def contract_entries(record: Mapping[str, Any]) -> Optional[List[Mapping[str, Any]]]:
    """A record's contract diff (``contract_diff.contract_diff`` entries), or ``None`` when it has none.

    Read from ``contract_diff`` (a list of entries) or ``contract.diff``.
    """
    entries = record.get("contract_diff")
    if entries is None and isinstance(record.get("contract"), Mapping):
        entries = record["contract"].get("diff")
    return list(entries) if isinstance(entries, list) else None


def _describe(entry: Any) -> str:
    try:
        return contract_diff.describe(entry)
    except (KeyError, TypeError, AttributeError):
        return str(entry)


def _reason(node: Mapping[str, Any]) -> str:
    reason = str(node.get("reason") or "")
    rollback = node.get("rollback") or {}
    if rollout_outcome.rollback_installed(node):
        reason += " → rolled back to %s (%s)" % (rollback["version"], "verified" if rollback.get("ok") else "not verified")
    elif rollback.get("version") and node.get("result") not in rollout_outcome.IN_SERVICE:
        reason += " → not rolled back (last known-good: %s)" % rollback["version"]
    return reason or "-"


def _elapsed(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return "%.0f s" % seconds
    if seconds < 7200:
        return "%.0f min" % (seconds / 60.0)
    return "%.1f h" % (seconds / 3600.0)


def render_html(report: Mapping[str, Any], journal_lines: Optional[List[str]] = None,
                plan: Optional[Mapping[str, Any]] = None) -> str:
    """The rollout report as one self-contained HTML page.

    :param report: ``rollout_report.build_report`` output.
    :param journal_lines: the lines of ``journal.jsonl`` (the timeline and each node's step); ``None``: none.
    :param plan: ``plan.json`` (``nodes``: ``[{"name", "class"}]``) for the class of nodes not started.
    :returns: HTML text.
    """
    events = rollout_timeline.parse(journal_lines or [])
    step_of = rollout_timeline.steps(events)
    class_of = dict((n.get("name"), n.get("class")) for n in (plan or {}).get("nodes") or [] if isinstance(n, Mapping))
    nodes = []
    per_class = {}  # type: Dict[str, Dict[str, int]]
    for node in report["nodes"]:
        name = node.get("node")
        klass = str(node.get("class") or class_of.get(name) or "unclassified")
        result = node.get("outcome") or rollout_outcome.outcome(node)
        counts = per_class.setdefault(klass, {})
        counts[result] = counts.get(result, 0) + 1
        total = (node.get("durations") or {}).get("total_s")
        nodes.append({"node": name, "class": klass, "stage": node.get("stage") or "-",
                      "step": step_of.get(name, "-"), "outcome": result, "result_text": rollout_outcome.LABELS[result],
                      "before": (node.get("before") or {}).get("loaded") or "-",
                      "after": (node.get("after") or {}).get("loaded") or "-",
                      "target": (node.get("target") or {}).get("version") or "-",
                      "time": _elapsed(total), "reason": _reason(node), "record": node,
                      "step_next": node.get("next_step") if isinstance(node.get("next_step"), Mapping) else None})
    summary = report["summary"]
    columns = rollout_outcome.shown(summary)
    by_name = dict((n["node"], n) for n in nodes)
    quarantined = []
    for entry in report.get("quarantined") or report.get("stopped_by") or []:
        node = by_name.get(entry["node"]) or {}
        quarantined.append({"node": entry["node"], "class": node.get("class", "-"), "stage": entry.get("stage") or "-",
                            "outcome": node.get("outcome") or entry.get("outcome") or "unknown",
                            "result": entry["result"], "after": node.get("after", "-"), "reason": node.get("reason")
                            or entry.get("reason") or "-", "next_step": next_step_text(entry.get("next_step"))})
    golden = []
    verdicts = report.get("contract") or {}
    for node in nodes:
        entries = contract_entries(node["record"])
        if node["stage"] == "golden" and entries is not None:
            verdict = verdicts.get(node["class"]) or {}
            if verdict.get("node") == node["node"]:
                lines = ["%s: %s" % (c.get("text"), c.get("why")) for c in verdict.get("changes") or []]
                unexplained = len(verdict.get("unexplained") or [])
                decision = ("%d unexplained: the class's canary stage waits" % unexplained) if unexplained \
                    else "every change explained"
            else:
                lines, decision = [_describe(e) for e in entries], None
            golden.append({"node": node["node"], "class": node["class"], "before": node["before"],
                           "after": node["after"], "lines": lines, "decision": decision})
    budgets = []
    for klass, row in sorted((report.get("budgets") or {}).items()):
        budgets.append({"name": klass, "nodes": row.get("nodes"), "max_unavailable": row.get("max_unavailable"),
                        "out_of_service": row.get("out_of_service") or 0, "free": row.get("free") or 0,
                        "failed": row.get("failed") or 0, "failure_budget": row.get("failure_budget") or 0,
                        "left": max(0, int(row.get("failure_budget") or 0) - int(row.get("failed") or 0))})
    line = rollout_timeline.timeline(events, len(report["nodes"]))
    env = report_html.environment()
    body = env.from_string(_BODY).render(
        r=report, s=summary, columns=columns, quarantined=quarantined, nodes=nodes, golden=golden, budgets=budgets,
        skipped=sorted((report.get("skipped_outputs") or {}).items()), labels=rollout_outcome.LABELS,
        summary_line=rollout_outcome.summary_line(summary),
        classes=report_html.matrix(sorted(per_class.items()), columns),
        chart=rollout_timeline.svg_paths(line, _WIDTH, _HEIGHT), chart_states=rollout_timeline.STATES,
        line_points=len(line["points"]), width=_WIDTH, height=_HEIGHT, wall=_elapsed(report.get("wall_s")))
    meta = " · ".join(part for part in (report.get("generated_at") or "", report.get("status") or "") if part)
    return report_html.page(env, "Driver rollout %s" % (report.get("rollout_id") or ""), meta, body)
