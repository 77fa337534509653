# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the HTML reports share: a Jinja2 environment with autoescaping, the page, the style, bars.

Each report is one self-contained file: inline CSS, inline SVG, no script, no font or image
from the network, so it opens the same from a CI artifact, a mail attachment or an air-gapped
share. Node names, reasons and facts are untrusted text (a node names itself): every value is
escaped by Jinja2's autoescaping; only markup written in these templates is markup.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple

from jinja2 import Environment, StrictUndefined

#: Colours of the states and severities, shared by the drift and rollout pages (CSS colours).
COLOURS = {
    "in_sync": "#2e7d32", "drifted": "#e65100", "missing": "#6d4c41",
    "critical": "#c62828", "warning": "#ef6c00", "info": "#1565c0",
    "upgraded": "#2e7d32", "skipped": "#66bb6a", "rolled_back": "#ef6c00", "rolled_back_flagged": "#d84315",
    "flagged": "#c62828", "unknown": "#37474f",
    "refused": "#8d6e63", "failed": "#b71c1c", "unreachable": "#6a1b9a", "interrupted": "#4527a0",
    "not_started": "#b0bec5", "pending": "#b0bec5", "in_flight": "#1565c0", "done": "#2e7d32",
}

STYLE = """
:root { --fg: #1c2430; --muted: #5b6675; --line: #dde3ea; --bg: #f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: var(--fg);
       margin: 0; background: #fff; }
header { background: #1f2a37; color: #fff; padding: 18px 28px 14px; }
header h1 { margin: 0 0 4px; font-size: 22px; font-weight: 600; }
header .meta { color: #c5ced8; font-size: 13px; }
main { padding: 18px 28px 40px; max-width: 1500px; }
h2 { font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 14px 0 10px; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 16px; min-width: 130px; background: var(--bg); }
.card .n { font-size: 26px; font-weight: 700; line-height: 1.1; }
.card .l { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.banner { border-radius: 8px; padding: 12px 16px; margin: 6px 0 14px; font-size: 15px; border-left: 6px solid; }
.banner.bad { background: #fdecea; border-color: #c62828; }
.banner.good { background: #e8f5e9; border-color: #2e7d32; }
.banner.busy { background: #e3f2fd; border-color: #1565c0; }
table { border-collapse: collapse; width: 100%; margin: 4px 0 8px; }
th, td { border-bottom: 1px solid var(--line); padding: 5px 8px; text-align: left; vertical-align: top; }
th { background: var(--bg); font-weight: 600; font-size: 12px; text-transform: uppercase; letter-spacing: .03em;
     color: var(--muted); position: sticky; top: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.zero { color: #b8c0ca; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12.5px; }
.pill { display: inline-block; padding: 1px 8px; border-radius: 10px; color: #fff; font-size: 12px; white-space: nowrap; }
.bar { display: flex; height: 14px; min-width: 160px; border-radius: 3px; overflow: hidden; background: #eceff1; }
.bar span { display: block; height: 100%; }
.legend span { display: inline-block; margin-right: 14px; font-size: 12px; color: var(--muted); }
.legend i { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; vertical-align: -1px; }
.gpus { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 12px; color: #37474f; }
.muted { color: var(--muted); }
.note { color: var(--muted); font-size: 13px; }
ul.diff { margin: 4px 0; padding-left: 20px; }
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>{{ style | safe }}</style>
</head>
<body>
<header><h1>{{ title }}</h1><div class="meta">{{ meta }}</div></header>
<main>
{{ body | safe }}
</main>
</body>
</html>
"""

MACROS = """
{% macro pill(state, text=None) -%}
<span class="pill" style="background:{{ colours.get(state, '#607d8b') }}">{{ text or state | replace('_', ' ') }}</span>
{%- endmacro %}
{% macro bar(segments) -%}
<div class="bar">{% for s in segments %}<span style="width:{{ '%.3f' % s.percent }}%;background:{{ s.colour }}"
 title="{{ s.label }}: {{ s.count }}"></span>{% endfor %}</div>
{%- endmacro %}
{% macro legend(states) -%}
<div class="legend">{% for st in states %}<span><i style="background:{{ colours.get(st, '#607d8b') }}"></i>{{ st | replace('_', ' ') }}</span>{% endfor %}</div>
{%- endmacro %}
{% macro count(n) -%}
<td class="num{{ ' zero' if not n else '' }}">{{ n }}</td>
{%- endmacro %}
"""


def environment() -> Environment:
    """A Jinja2 environment for the HTML reports: autoescaping on, undefined names are errors.

    The macros ``pill``, ``bar``, ``legend`` and ``count`` and the ``colours`` map are global.
    """
    env = Environment(undefined=StrictUndefined, autoescape=True, trim_blocks=True, lstrip_blocks=True)
    env.globals["colours"] = COLOURS
    macros = env.from_string(MACROS).module
    env.globals.update((name, getattr(macros, name)) for name in ("pill", "bar", "legend", "count"))
    return env


def page(env: Environment, title: str, meta: str, body: str) -> str:
    """The whole HTML document around ``body`` (markup rendered by a template of ``env``).

    :param title: the page title (escaped). :param meta: the line under it (escaped).
    :returns: HTML text.
    """
    return env.from_string(PAGE).render(title=title, meta=meta, body=body, style=STYLE)


def segments(counts: Mapping[str, int], order: Sequence[str]) -> List[Dict[str, Any]]:
    """Segments of a horizontal bar: ``[{"label", "count", "percent", "colour"}]`` in ``order``.

    :param counts: ``{state: count}``; states with 0 are left out. Percent of the sum, 0–100.
    """
    total = sum(int(counts.get(state) or 0) for state in order)
    out = []
    for state in order:
        value = int(counts.get(state) or 0)
        if value and total:
            out.append({"label": state.replace("_", " "), "count": value, "percent": 100.0 * value / total,
                        "colour": COLOURS.get(state, "#607d8b")})
    return out


def matrix(rows: Iterable[Tuple[str, Mapping[str, int]]], columns: Sequence[str]) -> List[Dict[str, Any]]:
    """A class × state overview: ``[{"name", "counts": {column: n}, "total", "segments"}]``.

    :param rows: ``(row name, {column: count})`` pairs, e.g. one per GPU class.
    :param columns: the states shown, in order; the bar of each row has their proportions.
    """
    out = []
    for name, counts in rows:
        kept = dict((column, int(counts.get(column) or 0)) for column in columns)
        out.append({"name": name, "counts": kept, "total": sum(kept.values()), "segments": segments(kept, columns)})
    return out
