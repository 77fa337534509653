# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout report: per-node records of the node upgrade transaction, rolled up for people.

Layout of a report directory on the controller (one per rollout id, so a re-run adds to it):

* ``plan.json`` — the stages and their hosts, written when the rollout starts;
* ``nodes/<host>.json`` — one record per node, written when its transaction ends (each write is
  atomic, so a controller killed mid-wave leaves complete records of the nodes it finished);
* ``journal.jsonl`` — what each step started and how each node ended (``rollout_journal``);
* ``rollout-report.json``, ``.md``, ``.html``, ``.junit.xml`` and ``gpufleet_rollout.prom`` —
  regenerated from the above once per step (:func:`render`), under an exclusive lock
  (``fcntl.flock``) on ``.lock``.

A record (written by the ``node_upgrade`` role): ``{node, stage, class, rollout_id, run_id,
result, reason, flags, target: {version, branch, requested, note}, before: {userspace, loaded,
on_disk, state}, after: {...}, rollback: {version, source, ok, reason} | None, started_at,
finished_at (ISO 8601), durations: {preflight_drain_s, snapshot_s, install_s, reboot_s, verify_s,
finish_s, rollback_s, total_s},
gpu_count: {before, after}, new_fatal_xids}``. Results: ``upgraded``, ``skipped`` (already on
target and healthy), ``rolled_back`` (failed verification, back on the last known-good driver,
left drained and flagged), ``flagged`` (failed and could not be rolled back; drained and
flagged), ``refused`` (preflight said no; nothing changed), ``failed``.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from jinja2 import Environment, StrictUndefined

from ansible_collections.gpufleet.nvidia.plugins.module_utils import branch_catalog, gpu_architectures, state_file
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_next_step import commands, next_step, next_step_text
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import (
    prometheus_textfile,
    report_junit,
    rollout_budget,
    rollout_html,
    rollout_journal,
    rollout_outcome,
    rollout_prometheus,
)
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_journal import locked


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Write a report file atomically (``state_file.write_atomic``: a new temporary file, ``fsync``,
    ``rename``); its directory is made 0700 when missing (``state_file.private_dir``)."""
    state_file.private_dir(os.path.dirname(os.path.abspath(path)))
    state_file.write_atomic(path, text, mode)


STOPPING = ("rolled_back", "flagged", "refused", "failed", "unreachable", "interrupted")
_DONE = ("upgraded", "skipped")


_PHASES = (
    ("preflight_drain_s", "started", "drained"),
    ("snapshot_s", "drained", "snapshot"),
    ("install_s", "snapshot", "installed"),
    ("reboot_s", "installed", "rebooted"),
    ("verify_s", "rebooted", "verified"),
    ("finish_s", "verified", "undrained"),
    ("rollback_s", "failed", "recovered"),
    ("total_s", "started", "finished"),
)


def durations_from_marks(marks: Optional[Mapping[str, Any]]) -> Dict[str, Optional[float]]:
    """Phase durations in seconds from the epoch times the role marks.

    :param marks: ``{"started", "drained", "snapshot", "installed", "rebooted", "verified",
        "undrained", "failed", "recovered", "finished"}`` (epoch seconds, any subset).
    :returns: ``{preflight_drain_s (facts, resolution, lock and drain), snapshot_s, install_s
        (the driver role), reboot_s, verify_s (facts, policy, benchmark), finish_s (known-good
        record and undrain), rollback_s, total_s}``; ``None`` for a phase whose two marks are not
        both there.
    """
    marks = marks or {}
    out = {}  # type: Dict[str, Optional[float]]
    for name, start, end in _PHASES:
        try:
            out[name] = round(float(marks[end]) - float(marks[start]), 1)
        except (KeyError, TypeError, ValueError):
            out[name] = None
    return out


#: The phases of a transaction in order, by the mark that ends each (role tasks set the marks).
_PHASE_MARKS = (("drained", "drain"), ("snapshot", "snapshot"), ("installed", "install"), ("rebooted", "reboot"),
                ("verified", "verification"), ("undrained", "return to service"), ("failed", "failure"),
                ("recovered", "recovery"))


def cut_off_record(node: str, stage: str, rollout_id: str, run_id: str, answers: bool,
                   hostvars: Optional[Mapping[str, Any]] = None, now: Optional[float] = None) -> Dict[str, Any]:
    """The record of a node whose transaction ended without one: it lost its connection mid-transaction.

    Ansible skips ``rescue`` and ``always`` for a host that becomes unreachable, so such a node
    may be drained and locked, with no flag. At the end of the step the controller records it
    here: a failed result (out of service, quarantined, counted against the budgets) that says
    how far the transaction got.

    :param answers: whether the node answers now (a ``ping`` at the end of the step).
    :param hostvars: the node's host variables in this run (``__node_upgrade_marks``: epoch
        seconds per phase, ``__node_upgrade_target``, the preflight's GPU facts: the registered
        ``__node_upgrade_read.ansible_facts.nvidia``, or ``__node_upgrade_preflight_facts`` that a
        gate's recovery sets).
    :returns: a record for :func:`store_record`: ``result`` ``unreachable`` (it does not answer)
        or ``interrupted`` (it answers again), ``flags`` ``[result]``, ``reason``, ``marks``,
        ``target``, ``before``.
    """
    hostvars = hostvars or {}
    marks = dict(hostvars.get("__node_upgrade_marks") or {})
    done = [label for mark, label in _PHASE_MARKS if mark in marks]
    after = ("after its %s" % done[-1]) if done else "before its drain finished"
    drained = "drained" in marks and "undrained" not in marks
    result = "interrupted" if answers else "unreachable"
    reason = "the node %s %s; its transaction did not finish: left %slocked, without a flag; out of service " \
             "until an operator checks it (rollback.yml returns it to its last known-good driver)" % (
                 "lost its connection and answers again" if answers else "stopped answering", after,
                 "drained and " if drained else "")
    target = hostvars.get("__node_upgrade_target") or None
    facts = hostvars.get("__node_upgrade_preflight_facts") \
        or ((hostvars.get("__node_upgrade_read") or {}).get("ansible_facts") or {}).get("nvidia") or {}
    driver = facts.get("driver") if isinstance(facts, Mapping) else None
    marks["finished"] = now if now is not None else time.time()
    return {"node": node, "stage": stage, "rollout_id": rollout_id, "run_id": run_id, "result": result,
            "reason": reason, "flags": [result], "target": {"version": target},
            "before": {"loaded": (driver or {}).get("loaded_version")} if driver else {},
            "after": {}, "marks": marks, "drained": drained}


def merge_record(old: Optional[Mapping[str, Any]], new: Mapping[str, Any]) -> Dict[str, Any]:
    """The record to keep when a node is recorded again (a re-run of the same rollout).

    A re-run skips nodes already on target; their earlier ``upgraded`` record (with its before
    versions and durations) is kept, marked ``confirmed_at`` / ``confirmed_by_run``, instead of
    being replaced by a bare ``skipped``. Every other new record replaces the old one, keeping
    the old one under ``previous_attempt``.
    """
    if old and new.get("result") == "skipped" and old.get("result") == "upgraded" \
            and (old.get("target") or {}).get("version") == (new.get("target") or {}).get("version"):
        kept = dict(old)
        kept["confirmed_at"] = new.get("finished_at")
        kept["confirmed_by_run"] = new.get("run_id")
        return kept
    out = dict(new)
    if old and old.get("run_id") != new.get("run_id"):
        out["previous_attempt"] = {"run_id": old.get("run_id"), "result": old.get("result"),
                                   "reason": old.get("reason"), "finished_at": old.get("finished_at")}
    return out


def resolution_note(resolved: Optional[Mapping[str, Any]], catalog: Optional[Mapping[str, Any]] = None,
                    today: Optional[str] = None) -> Optional[str]:
    """What an operator should know about the version this node got: why a branch class resolved
    to an older branch (e.g. V100 on ``ltsb``), and the resolver's warnings (a version that is in
    the repository but not in the catalog, an end-of-life branch).

    :param resolved: ``driver_resolve``'s ``resolved`` (``branch``, ``architectures``,
        ``requested.branch``, ``warnings``).
    :returns: ``"ltsb resolves to R580 for Volta: R620, the newest LTSB, does not support Volta"``,
        ``"620.82.01 is in the repository but not in the catalog (as of 2026-11-20)"``, both joined
        with ``"; "``, or ``None`` when there is nothing to say.
    Source: the branch catalog (``branch_catalog.get_catalog``) and ``driver_resolution.resolve_driver``.
    """
    if not resolved:
        return None
    warnings = [str(w) for w in resolved.get("warnings") or [] if w]
    note = _branch_note(resolved, catalog, today)
    parts = ([note] if note else []) + warnings
    return "; ".join(parts) if parts else None


def _branch_note(resolved: Mapping[str, Any], catalog: Optional[Mapping[str, Any]], today: Optional[str]) -> Optional[str]:
    requested = str(((resolved.get("requested") or {}).get("branch")) or "").lower()
    if requested not in branch_catalog.BRANCH_CLASSES:
        return None
    catalog = catalog or branch_catalog.get_catalog()
    today = today or catalog.get("as_of")
    candidates = [b for b, info in catalog["branches"].items() if info.get("class") == requested
                  and not branch_catalog.date_passed(info.get("eol"), today)]
    if not candidates:
        return None
    newest = max(candidates, key=int)
    branch = str(resolved.get("branch"))
    if branch == newest:
        return None
    archs = [gpu_architectures.architecture_display(a) for a in resolved.get("architectures") or []]
    served = set(catalog["branches"][newest].get("architectures") or [])
    missing = [gpu_architectures.architecture_display(a) for a in resolved.get("architectures") or []
               if a not in served]
    text = "%s resolves to R%s for %s" % (requested, branch, ", ".join(archs) or "these GPUs")
    if missing:
        text += ": R%s, the newest %s, does not support %s" % (newest, requested.upper(), ", ".join(missing))
    else:
        text += " (R%s is the newest %s)" % (newest, requested.upper())
    return text


def build_report(plan: Optional[Mapping[str, Any]], records: Mapping[str, Mapping[str, Any]],
                 generated_at: Optional[str] = None, decision: Optional[Mapping[str, Any]] = None,
                 inventory: Any = None) -> Dict[str, Any]:
    """Roll the records up against the plan.

    :param plan: ``{"rollout_id", "stages": [{"name", "hosts": [..], "serial"}], "request": {...},
        "started_at"}`` or ``None`` (then the stages come from the records).
    :param records: ``{host: record}``.
    :returns: ``{"rollout_id", "generated_at", "status": "completed" | "stopped" | "in_progress",
        "stopped_by": [{"node", "stage", "result", "outcome", "reason", "next_step"}], "summary":
        {outcome: n for every rollout_outcome.OUTCOMES, "nodes": n} (each node in exactly one
        outcome: they add up to ``nodes``), "stages": [{"name", "hosts", "counts": {outcome: n},
        "ran": bool}], "nodes": [record, with ``outcome`` (rollout_outcome.outcome) and
        ``next_step`` (rollout_next_step.next_step: ``{action, do, clears, command, resume}`` or
        None), or {"node", "stage", "result": "not_started"}] in plan order,
        "notes": [str],
        "wall_s": float | None, "stop_reason": str | None, "quarantined": [{"node", "stage", "result",
        "reason"}], "deferred": [names], "budgets": {...} | None, "contract": {class: the golden
        node's contract changes and how each is explained (``rollout_budget.contract_verdicts``)},
        "evidence": {golden node: its record's ``evidence`` (:func:`store_traces`)}}``.
    :param inventory: the run's ``ansible_inventory_sources``, for the commands of the next steps.
    :param decision: ``rollout_budget.decide`` over the journal (a rollout run in steps): then the
        status is the decision's (``stopped`` with its reason, ``completed`` when nothing is left,
        quarantined nodes included), ``stopped_by`` lists the nodes the stop names and
        ``quarantined`` every failed node. Without it, the first failed node stops the rollout.
    """
    plan = plan or {}
    stages = list(plan.get("stages") or [])
    if not stages:
        by_stage = {}  # type: Dict[str, List[str]]
        for host in sorted(records):
            by_stage.setdefault(records[host].get("stage") or "single", []).append(host)
        stages = [{"name": name, "hosts": hosts} for name, hosts in by_stage.items()]
    planned = set()
    nodes = []  # type: List[Dict[str, Any]]
    stage_rows = []
    class_of = dict((n.get("name"), n.get("class")) for n in plan.get("nodes") or [] if isinstance(n, Mapping))
    for stage in stages:
        stage_nodes = []
        for host in stage.get("hosts") or []:
            planned.add(host)
            record = records.get(host)
            if record is None:
                record = {"node": host, "stage": stage["name"], "result": "not_started"}
                if class_of.get(host):
                    record["class"] = class_of[host]
            stage_nodes.append(dict(record, outcome=rollout_outcome.outcome(record), next_step=next_step(record, inventory)))
        nodes.extend(stage_nodes)
        counts = rollout_outcome.count(stage_nodes)
        del counts["nodes"]
        stage_rows.append({"name": stage["name"], "hosts": list(stage.get("hosts") or []), "counts": counts,
                           "ran": any(counts[o] for o in rollout_outcome.OUTCOMES if o != "not_started")})
    for host in sorted(set(records) - planned):
        nodes.append(dict(records[host], outcome=rollout_outcome.outcome(records[host]),
                          next_step=next_step(records[host], inventory)))
    # One outcome per node (rollout_outcome): a node rolled back and still flagged is that, once.
    summary = rollout_outcome.count(nodes)
    failed = [{"node": n["node"], "stage": n.get("stage"), "result": n["result"], "outcome": n["outcome"],
               "reason": n.get("reason"), "next_step": n.get("next_step")} for n in nodes if n.get("result") in STOPPING]
    stop = (decision or {}).get("stop")
    if decision is not None:
        named = set((stop or {}).get("nodes") or [])
        stopped_by = [entry for entry in failed if entry["node"] in named]
        if (stop or {}).get("code") == "contract_unexplained":
            # The golden node passed; what stops the rollout is what its update changed.
            stopped_by = [{"node": n["node"], "stage": n.get("stage"), "result": n.get("result"),
                           "outcome": n["outcome"], "reason": stop["reason"],
                           "next_step": _contract_step(n, inventory)}
                          for n in nodes if n["node"] in named]
        status = "stopped" if stop else "completed" if decision.get("action") == "done" else "in_progress"
    else:
        stopped_by = failed
        if stopped_by:
            status = "stopped"
        elif all(n["outcome"] in _DONE for n in nodes) and nodes:
            status = "completed"
        else:
            status = "in_progress"
    # One line per note, with the nodes it applies to (a version outside the catalog is said once
    # for the fleet, not once per node).
    noted = {}  # type: Dict[str, List[str]]
    for node in nodes:
        note = (node.get("target") or {}).get("note")
        if note:
            for part in str(note).split("; "):
                noted.setdefault(part, []).append(node["node"])
    notes = ["%s: %s" % (names[0], text) if len(names) == 1 else
             "%s (%d nodes: %s)" % (text, len(names), ", ".join(names[:8]) + (", ..." if len(names) > 8 else ""))
             for text, names in noted.items()]
    started = [n.get("started_epoch") for n in nodes if n.get("started_epoch") is not None]
    finished = [n.get("finished_epoch") for n in nodes if n.get("finished_epoch") is not None]
    wall = round(max(finished) - min(started), 1) if started and finished else None
    return {"rollout_id": plan.get("rollout_id") or next((r.get("rollout_id") for r in records.values()), None),
            "generated_at": generated_at, "request": plan.get("request"), "status": status,
            "stopped_by": stopped_by, "summary": summary, "stages": stage_rows, "nodes": nodes, "notes": notes,
            "wall_s": wall, "stop_reason": (stop or {}).get("reason"),
            "quarantined": [entry for entry in failed if entry["result"] != "refused"] if decision is not None else [],
            "deferred": list((decision or {}).get("deferred") or []),
            "budgets": (decision or {}).get("budgets"),
            "contract": dict((decision or {}).get("contract") or {})
            if isinstance((decision or {}).get("contract"), Mapping) else {},
            "evidence": dict((n["node"], n["evidence"]) for n in nodes
                             if n.get("stage") == "golden" and isinstance(n.get("evidence"), Mapping))}


def _contract_step(node: Mapping[str, Any], inventory: Any) -> Dict[str, str]:
    """The next step of a golden node whose contract change stops the rollout (it passed; no flag)."""
    cmd = commands(node, inventory)
    return {"action": "review_contract",
            "do": "review the contract changes (docs/contract.md) and accept them with rollout_contract_accept, or "
                  "roll %s back" % node["node"],
            "clears": "nothing is flagged: the accepted changes let the rollout go on",
            "command": cmd["rollout"] + " -e rollout_contract_accept=<the changes>", "resume": cmd["rollback"]}


_MARKDOWN = """\
# Driver rollout {{ r.rollout_id }}

Status: **{{ r.status }}**{{ (': ' ~ (r.stop_reason | md)) if r.stop_reason else '' }}\
{{ (' (stopped by ' ~ (r.stopped_by | map(attribute='node') | join(', ')) ~ ')') if r.stopped_by else '' }}.
{{ summary_line }}.\
{{ (' Wall time %.0f s.' % r.wall_s) if r.wall_s is not none else '' }}

{% if r.contract_lines %}
Hardware contract, decided by each class's golden node:
{% for line in r.contract_lines %}
- {{ line | md }}
{% endfor %}

{% endif %}
| stage | nodes |{% for o in outcomes %} {{ labels[o] }} |{% endfor %}

|---|---:|{% for o in outcomes %}---:|{% endfor %}

{% for st in r.stages %}
| {{ st.name }} | {{ st.hosts | length }} |{% for o in outcomes %} {{ st.counts.get(o, 0) }} |{% endfor %}

{% endfor %}

| node | stage | result | before | after | target | time | reason |
|---|---|---|---|---|---|---:|---|
{% for n in r.nodes %}
| {{ n.node | md }} | {{ n.stage | md }} | {{ n.outcome | md }} | {{ n.before | md }} | {# -#}
{{ n.after | md }} | {{ n.target | md }} | {{ n.time | md }} | {{ n.reason | md }} |
{% endfor %}
{% if r.quarantined %}

Quarantined (drained and flagged, out of service until cleared):
{% for q in r.quarantined %}
- {{ q.node | md }} ({{ q.stage }}): {{ labels[q.outcome] }}: {{ q.reason | md }}
{% endfor %}
{% endif %}
{% if next_steps %}

Next steps (each node out of service, with what clears it and the command that takes it back):
{% for n in next_steps %}
- {{ n.node | md }} ({{ labels[n.outcome] }}): {{ n.text | md }}.
{% endfor %}
{% endif %}
{% if r.deferred %}

Deferred (out of service, to do when back): {{ r.deferred | join(', ') }}
{% endif %}
{% for name, note in (r.get('skipped_outputs') or {}) | dictsort %}

Not written ({{ name }}): {{ note | md }}.
{% endfor %}
{% if r.notes %}

Notes:
{% for note in r.notes %}
- {{ note | md }}
{% endfor %}
{% endif %}
"""


#: Characters that mean something in a Markdown table cell or inline text (CommonMark 0.31
#: "Backslash escapes": any ASCII punctuation may be escaped); ``|`` ends a GFM table cell.
_MD_SPECIAL = re.compile(r"([\\`*\[\]<>|~])")
_MD_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]+")


def md_cell(value: Any) -> str:
    """``value`` as text safe in a Markdown table cell or list item: the characters that open code,
    emphasis, links, HTML, strike-through or end a cell backslash-escaped (an ``_`` inside a word
    opens nothing, CommonMark 0.31 section 6.2, and is kept), line breaks and control characters a space each, at most 2,000 characters
    (a driver version, a reason or a node name from a node is not trusted to be plain)."""
    text = _MD_CONTROL.sub(" ", str(value))
    if len(text) > 2000:
        text = text[:2000] + "..."
    return _MD_SPECIAL.sub(r"\\\1", text)


_md = md_cell


def _texts(value: Any) -> List[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


def contract_lines(verdicts: Any) -> List[str]:
    """One line per class on its golden node's contract changes and how each is explained:
    ``"gpu_h100 (node01): 1 unexplained: CUDA 13.0 → 13.5 (the driver's own); reserved memory 480 → 544
    MiB on 8 GPUs (unexplained)"``.

    :param verdicts: ``rollout_budget.contract_verdicts`` (the report's ``contract``); entries that
        are not one are left out.
    """
    lines = []
    for klass, verdict in sorted((verdicts if isinstance(verdicts, Mapping) else {}).items(), key=lambda kv: str(kv[0])):
        if not isinstance(verdict, Mapping):
            continue
        changes = [c for c in verdict.get("changes") or [] if isinstance(c, Mapping)] \
            if isinstance(verdict.get("changes"), list) else []
        unexplained = [c for c in changes if c.get("decision") == "unexplained"]
        head = "%s (%s): %s" % (klass, verdict.get("node"), ("%d unexplained" % len(unexplained)) if unexplained
                                else "every change explained" if changes else "no change")
        lines.append(head + (": " + "; ".join("%s (%s)" % (c.get("text") or c.get("field"), c.get("why") or c.get("decision"))
                                              for c in changes) if changes else ""))
    return lines


def evidence_lines(evidence: Any) -> List[str]:
    """One line per golden node on what its GPU traces show moved across the update:
    ``"node01, traces before and after: SM clock at power cap: 1410 → 1140 MHz on 8 GPUs"``; entries that
    are not a record's ``evidence`` are left out."""
    lines = []
    for node, entry in sorted((evidence if isinstance(evidence, Mapping) else {}).items(), key=lambda kv: str(kv[0])):
        if not isinstance(entry, Mapping):
            continue
        sides = [side for side in ("before", "after") if entry.get("%s_csv" % side)]
        if not sides:
            continue
        changes = entry.get("changes")
        if len(sides) == 1:
            text = "only the trace %s" % sides[0]
        elif isinstance(changes, list):
            text = "; ".join(_texts(changes)) or "nothing moved by more than 2 % or one unit"
        else:
            text = "not compared"
        lines.append("%s, traces %s: %s" % (node, " and ".join(sides), text))
    return lines


def render_markdown(report: Mapping[str, Any]) -> str:
    """The rollout report as Markdown (Jinja2): status, the summary line
    (``rollout_outcome.summary_line``), a table of the stages by outcome, a row per node (its
    outcome), the quarantined nodes with their next step, notes."""
    env = Environment(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True,
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["md"] = _md
    safe_nodes = []
    for node in report["nodes"]:
        durations = node.get("durations") or {}
        rollback = node.get("rollback") or {}
        reason = node.get("reason") or ""
        if rollout_outcome.rollback_installed(node):
            verified = "verified" if rollback.get("ok") else "not verified"
            reason += " → rolled back to %s (%s)" % (rollback["version"], verified)
        elif rollback.get("version") and node.get("result") in STOPPING:
            reason += " → not rolled back (last known-good: %s)" % rollback["version"]
        safe_nodes.append({
            "node": node.get("node"),
            "stage": node.get("stage") or "-",
            "outcome": node.get("outcome") or rollout_outcome.outcome(node),
            "before": (node.get("before") or {}).get("loaded") or "-",
            "after": (node.get("after") or {}).get("loaded") or "-",
            "target": (node.get("target") or {}).get("version") or "-",
            "time": ("%.0f s" % durations["total_s"]) if durations.get("total_s") is not None else "-",
            "reason": reason or "-",
        })
    view = dict(report)
    view["nodes"] = safe_nodes
    view["contract_lines"] = contract_lines(report.get("contract") or {}) + evidence_lines(report.get("evidence") or {})
    steps = [{"node": n.get("node"), "outcome": n.get("outcome") or rollout_outcome.outcome(n),
              "text": next_step_text(n.get("next_step"))} for n in report["nodes"] if isinstance(n.get("next_step"), Mapping)]
    return env.from_string(_MARKDOWN).render(r=view, s=report["summary"], labels=rollout_outcome.LABELS, next_steps=steps,
                                             outcomes=rollout_outcome.shown(report["summary"]),
                                             summary_line=rollout_outcome.summary_line(report["summary"]))


def _load(path: str) -> Optional[Dict[str, Any]]:
    """A JSON object file of the report directory (``state_file.read``), ``None`` when absent or unreadable."""
    return state_file.read(path)["content"]


def read_records(directory: str) -> Dict[str, Dict[str, Any]]:
    """``{host: record}`` from ``<directory>/nodes/*.json`` (I/O); a record's host is its ``node``
    when that names this very file (:func:`file_name`), else the file's name."""
    nodes_dir = os.path.join(directory, "nodes")
    out = {}
    if os.path.isdir(nodes_dir):
        for name in sorted(os.listdir(nodes_dir)):
            if name.endswith(".json") and not name.startswith("."):
                record = _load(os.path.join(nodes_dir, name))
                if record is not None:
                    node = record.get("node")
                    out[node if isinstance(node, str) and node and file_name(node) == name[:-5] else name[:-5]] = record
    return out


def file_name(node: str) -> str:
    """A file name for an inventory host name (``state_file.file_name``, the one rule): the name
    itself when it is plain, else quoted (``2001%3Adb8%3A%3A1`` for ``2001:db8::1``, ``%2E.%2Fx`` for
    ``../x``). :raises ValueError: for a name that is not text or is empty."""
    return state_file.file_name(node)


def store_traces(directory: str, node: str, traces: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """Write a node's GPU traces beside the report (I/O).

    :param directory: the rollout's report directory.
    :param node: the node's inventory name (the files' names: ``traces/<node>.before.csv``,
        ``traces/<node>.after.csv``, the name through :func:`file_name`).
    :param traces: ``{"before": {"csv": text} | None, "after": {"csv": text, "changes": [str] |
        None} | None}`` as the node's ``gpu_trace`` tasks returned them (``changes``: the module's
        comparison of the trace after with the summary of the trace before). Untrusted: a CSV that
        is not text is left out, changes that are not a list of text are dropped.
    :returns: ``None`` when neither trace is there, else ``{"before_csv": path | None,
        "after_csv": path | None, "changes": [str] | None, "samples": {"before": n, "after": n}}``.
    :raises ValueError: for a node name that is not text.
    """
    if not isinstance(node, str) or not node:
        raise ValueError("node name %r cannot name a trace file" % (node,))
    out = {"before_csv": None, "after_csv": None, "changes": None, "samples": {}}  # type: Dict[str, Any]
    for side in ("before", "after"):
        trace = traces.get(side) if isinstance(traces, Mapping) else None
        if not isinstance(trace, Mapping) or not isinstance(trace.get("csv"), str):
            continue
        path = os.path.join(directory, "traces", "%s.%s.csv" % (file_name(node), side))
        write_atomic(path, trace["csv"].encode("utf-8", "replace").decode("utf-8"))
        out["%s_csv" % side] = path
        out["samples"][side] = max(0, trace["csv"].count("\n") - 1)
    if out["before_csv"] is None and out["after_csv"] is None:
        return None
    changes = (traces.get("after") or {}).get("changes") if out["before_csv"] and out["after_csv"] else None
    if isinstance(changes, list) and all(isinstance(c, str) for c in changes):
        out["changes"] = list(changes)
    return out


def golden_contract(directory: str, klass: str) -> Optional[Dict[str, Any]]:
    """The contract a class's golden node had after its update, which the rest of the class must match.

    :param directory: the rollout's report directory (I/O: reads ``plan.json`` and the golden
        nodes' records).
    :param klass: the GPU class (``gpu_h100``).
    :returns: ``{"node", "contract"}`` of the first golden node of the class (plan order) whose
        record is ``upgraded`` or ``skipped`` and keeps its contract (``contract.after``), or
        ``None`` when there is none yet (the class has no golden node, or it has not passed).
    """
    plan = _load(os.path.join(directory, "plan.json"))
    nodes = plan.get("nodes") if isinstance(plan, Mapping) else None
    for node in nodes if isinstance(nodes, list) else []:
        if not isinstance(node, Mapping) or node.get("stage") != "golden" or node.get("class") != klass \
                or not isinstance(node.get("name"), str) or not node["name"]:
            continue
        record = _load(os.path.join(directory, "nodes", "%s.json" % file_name(node["name"])))
        record = record if isinstance(record, Mapping) else {}
        contract = record.get("contract") if isinstance(record.get("contract"), Mapping) else {}
        if record.get("result") in ("upgraded", "skipped") and isinstance(contract.get("after"), Mapping):
            return {"node": node.get("name"), "contract": contract["after"]}
    return None


def write_plan(directory: str, plan: Mapping[str, Any]) -> str:
    """Write ``plan.json`` (I/O); a re-run of the same rollout keeps the first ``started_at``."""
    with locked(directory):
        path = os.path.join(directory, "plan.json")
        old = _load(path)
        data = dict(plan)
        if old and old.get("rollout_id") == plan.get("rollout_id") and old.get("started_at"):
            data["started_at"] = old["started_at"]
            old_runs = list(old.get("runs") or [])
            data["runs"] = old_runs + [r for r in plan.get("runs") or [] if r not in old_runs]
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def store_record(directory: str, record: Mapping[str, Any],
                 journal_event: Optional[Callable[[Mapping[str, Any]], None]] = None) -> str:
    """Store one node's record, merged with an earlier one (I/O; the same cost at any report size).

    :param journal_event: called with the merged record under the directory's lock (the
        rollout journal's append), so that record and journal never disagree.
    :returns: the record's path.
    """
    with locked(directory):
        path = os.path.join(directory, "nodes", "%s.json" % file_name(record["node"]))
        merged = merge_record(_load(path), record)
        write_atomic(path, json.dumps(merged, indent=1, sort_keys=True) + "\n")
        if journal_event is not None:
            journal_event(merged)
    return path


def render(directory: str, generated_at: Optional[str] = None, step_end: bool = False,
           inventory: Any = None) -> Dict[str, Any]:
    """Regenerate the rollout report's files from the plan, the records and the journal (I/O).

    Called once per rollout step, not once per record: its cost is linear in the records and
    the journal. Writes ``rollout-report.json``, ``.md``, ``.html`` (one self-contained page,
    ``rollout_html``), ``rollout-report.junit.xml`` (``report_junit``) and
    ``gpufleet_rollout.prom`` (``rollout_prometheus``; only where ``prometheus_client`` is
    installed: else the report's ``skipped_outputs`` says once, in every other format, that it was
    skipped and how to get it), each atomically.

    :param inventory: the run's ``ansible_inventory_sources`` (the next steps' commands).
    :param step_end: this render ends a step: a ``rendered`` line goes to the journal when a node
        was admitted since the last one (``rollout_timeline.steps`` numbers the steps by them).
    :returns: ``{"report": the report dict, "paths": {"json", "markdown", "html", "junit",
        "prometheus"?}}``.
    """
    with locked(directory):
        paths = {}
        plan = _load(os.path.join(directory, "plan.json"))
        read = rollout_journal.read_journal(directory)
        lines = read["lines"]
        if step_end and _admitted_since_step(lines):
            marker = {"event": "rendered", "step": True, "time": time.time()}
            rollout_journal.append_in_lock(directory, marker)
            lines.append(json.dumps(marker, sort_keys=True))
        decision = None
        if plan and plan.get("nodes"):
            journal = rollout_journal.fold_lines(lines)
            decision = rollout_budget.decide(rollout_journal.fleet_state(plan, journal),
                                             rollout_budget.normalize_options(plan.get("options") or {}))
        report = build_report(plan, read_records(directory), generated_at, decision, inventory)
        report["journal"] = journal_health(read)
        prometheus = os.path.join(directory, rollout_prometheus.FILENAME)
        report["skipped_outputs"] = {} if prometheus_textfile.available() else {
            "prometheus": prometheus_textfile.skipped_note(prometheus)}
        for name, filename in (("json", "rollout-report.json"), ("markdown", "rollout-report.md"),
                               ("html", "rollout-report.html"), ("junit", "rollout-report.junit.xml")):
            paths[name] = os.path.join(directory, filename)
        write_atomic(paths["json"], json.dumps(report, indent=1, sort_keys=True) + "\n")
        write_atomic(paths["markdown"], render_markdown(report) + journal_markdown(report["journal"]))
        write_atomic(paths["html"], rollout_html.render_html(report, lines, plan))
        write_atomic(paths["junit"], report_junit.rollout_junit(report))
        if not report["skipped_outputs"]:
            paths["prometheus"] = prometheus
            rollout_prometheus.write_textfile(paths["prometheus"], report)
    return {"report": report, "paths": paths}


def journal_health(read: Mapping[str, Any]) -> Dict[str, Any]:
    """What the report says of the journal it was made from.

    :param read: ``rollout_journal.read_journal``.
    :returns: ``{"lost_lines": int, "lost": ["unreadable: journal.jsonl:<line>: <why>"] (the first
        20), "summary": rollout_journal.lost_summary | None, "unreadable": str | None, "ambiguous":
        [node]}``.
    """
    lost = list(read.get("lost") or [])
    nodes = read.get("nodes") or {}
    return {"lost_lines": len(lost), "lost": [str(e.get("text")) for e in lost[:20]],
            "summary": rollout_journal.lost_summary(lost), "unreadable": read.get("unreadable"),
            "ambiguous": sorted(n for n, s in nodes.items() if s.get("ambiguous"))}


def journal_markdown(health: Mapping[str, Any]) -> str:
    """The Markdown lines of :func:`journal_health` (``""`` when the journal was read whole)."""
    if not health.get("lost_lines") and not health.get("unreadable"):
        return ""
    lines = ["", "## Journal", ""]
    if health.get("unreadable"):
        lines.append("- %s: the report was made without it" % md_cell(health["unreadable"]))
    if health.get("summary"):
        lines.append("- %s" % md_cell(health["summary"]))
    if health.get("ambiguous"):
        lines.append("- in flight, their last event lost (resumed by the next step): %s"
                     % md_cell(", ".join(health["ambiguous"])))
    return "\n".join(lines) + "\n"


def _admitted_since_step(lines: List[str]) -> bool:
    """Whether the journal has a ``started`` line after its last step-ending ``rendered`` line."""
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("event") == "rendered" and event.get("step"):
            return False
        if event.get("event") == "started":
            return True
    return False
