# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render a drift report (``plugin_utils.drift.roll_up``) as JSON and Markdown.

Controller side: Markdown is rendered with Jinja2 (shipped with ansible-core), JSON with
``msgspec`` when it is installed (else the standard library). Write either atomically with
:func:`write_atomic`. The Prometheus textfile is ``drift_prometheus``'s.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Mapping

from jinja2 import Environment, StrictUndefined

try:
    import msgspec
except ImportError:  # the standard library is the fallback
    msgspec = None

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
{% for name, note in (report.get('skipped_outputs') or {}) | dictsort %}

Not written ({{ name }}): {{ note }}.
{% endfor %}
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

    :param report: ``drift.roll_up`` output; its ``skipped_outputs`` (``{format: why}``, added by
        the action) each get one line at the end.
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


def render_json(report: Mapping[str, Any]) -> str:
    """The report as indented JSON text (keys sorted), with ``msgspec`` when it is installed.

    A value JSON has no type for is written as its ``str``. ``msgspec`` indents by two spaces and
    writes a NaN as ``null``; the standard library (the fallback, and for a key that is not a
    string, which sorting with ``msgspec`` refuses) indents by one and writes ``NaN``.
    """
    if msgspec is not None:
        try:
            return msgspec.json.format(msgspec.json.encode(report, enc_hook=str, order="sorted"),
                                       indent=2).decode("utf-8") + "\n"
        except (TypeError, msgspec.EncodeError):
            pass
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
