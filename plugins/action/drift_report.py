# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of gpufleet.nvidia.drift_report: the drift report, computed on the controller."""

from __future__ import annotations

import time
from datetime import datetime, timezone

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.nvidia.plugins.module_utils import drift
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import drift_output, fact_sources
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_action import ControllerAction

ARGUMENT_SPEC = {
    "source": {"type": "str", "default": "live", "choices": ["live", "dir", "jsonfile"]},
    "path": {"type": "path"},
    "prefix": {"type": "str", "default": ""},
    "hosts": {"type": "list", "elements": "str"},
    "class_prefix": {"type": "str", "default": "gpu_"},
    "declared_from": {"type": "str", "default": "host", "choices": ["host", "class"]},
    "declared": {"type": "dict"},
    "max_age_s": {"type": "float"},
    "output_dir": {"type": "path"},
    "formats": {"type": "list", "elements": "str", "default": ["json", "markdown", "prometheus"],
                "choices": ["json", "markdown", "prometheus"]},
    "prometheus_path": {"type": "path"},
    "report_only": {"type": "bool", "default": False},
    "fail_on": {"type": "str", "default": "warning", "choices": ["info", "warning", "critical"]},
    "max_markdown_findings": {"type": "int", "default": 500},
    "return_findings": {"type": "int", "default": 200},
}


def host_classes(groups, hosts, class_prefix):
    """``{host: class}``: the first group (sorted) whose name starts with ``class_prefix``.

    :param groups: the inventory's ``groups`` variable (group → hosts).
    :returns: hosts without such a group get ``"unclassified"``.
    """
    wanted = set(hosts)
    classes = {}
    for group in sorted(groups):
        if not group.startswith(class_prefix):
            continue
        for host in groups[group]:
            if host in wanted and host not in classes:
                classes[host] = group
    for host in hosts:
        classes.setdefault(host, "unclassified")
    return classes


def _plain(value):
    """Copy a templated variable value into plain dict/list/scalars."""
    if isinstance(value, dict):
        return dict((str(k), _plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _declared_vars(hostvars, host):
    variables = hostvars[host]
    out = {}
    for name in drift.DECLARED_VARIABLES:
        if name in variables:
            out[name] = _plain(variables[name])
    return out


class ActionModule(ControllerAction):
    """Collect facts and declarations, judge them with module_utils.drift, write the outputs."""

    NAME = "drift_report"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self.validated_args()
        started = time.time()
        groups = task_vars.get("groups") or {}
        hosts = args["hosts"]
        if hosts is None:
            hosts = [h for h in groups.get("all", []) if h not in ("localhost",)]
        classes = host_classes(groups, hosts, args["class_prefix"])
        facts_of, source, errors = self._collect(args, hosts, task_vars)
        hostvars = task_vars.get("hostvars") or {}
        overrides = dict((klass, drift.declared_state(variables))
                         for klass, variables in (args["declared"] or {}).items())
        per_class = {}

        def nodes():
            for host in hosts:
                klass = classes[host]
                if klass in overrides:
                    declared = overrides[klass]
                elif args["declared_from"] == "class" and klass in per_class:
                    declared = per_class[klass]
                else:
                    declared = drift.declared_state(_declared_vars(hostvars, host)) if host in hostvars else {}
                    per_class.setdefault(klass, declared)
                facts, age = facts_of(host)
                yield {"node": host, "class": klass, "facts": facts, "declared": declared, "facts_age_s": age}
        generated = datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        engine = drift.DriftEngine(max_age_s=args["max_age_s"])
        report = drift.build_report(nodes(), engine, generated_at=generated, source=source)
        report["source_errors"] = errors
        code = drift.exit_code(report, args["report_only"], args["fail_on"])
        paths = self._write(args, report, started)
        summary = report["summary"]
        result.update({
            "changed": False,
            "summary": summary,
            "classes": report["classes"],
            "findings": report["findings"][:max(0, args["return_findings"])],
            "drifted_nodes": sorted(name for name, node in report["nodes"].items() if not node["in_sync"]),
            "paths": paths,
            "exit_code": code,
            "drift": drift.exit_code(report, False, args["fail_on"]) != 0,
            "source_errors": errors,
            "elapsed_s": round(time.time() - started, 3),
        })
        result["msg"] = "%d nodes: %d in sync, %d drifted (%d without facts); %d critical, %d warning findings" % (
            summary["nodes"], summary["in_sync"], summary["drifted"], summary["missing"],
            summary["by_severity"]["critical"], summary["by_severity"]["warning"])
        if code:
            result["failed"] = True
            result["msg"] = "drift found: " + result["msg"]
        return result

    def _collect(self, args, hosts, task_vars):
        """``(facts_of(host) -> (facts, age), source label, errors dict)``; files are read lazily."""
        errors = {}
        if args["source"] == "live":
            hostvars = task_vars.get("hostvars") or {}

            def live(host):
                if host not in hostvars:
                    return None, None
                return fact_sources.nvidia_from_host_facts(_plain(hostvars[host].get("ansible_facts") or {})), None
            return live, "live", errors
        if not args["path"]:
            raise AnsibleActionFail("drift_report: source=%s needs path" % args["source"])
        try:
            files = fact_sources.locate_fact_files(args["path"], args["source"], args["prefix"], hosts)
        except fact_sources.FactSourceError as err:
            raise AnsibleActionFail("drift_report: %s" % err)
        now = time.time()

        def from_file(host):
            if host not in files:
                return None, None
            try:
                entry = fact_sources.load_fact_file(files[host], now)
            except fact_sources.FactSourceError as err:
                errors[host] = str(err)
                return None, None
            if entry["error"]:
                errors[host] = "%s: %s" % (entry["path"], entry["error"])
            return entry["facts"], entry["age_s"]
        return from_file, "%s:%s" % (args["source"], args["path"]), errors

    def _write(self, args, report, started):
        paths = {}
        if self._task.check_mode:
            return paths
        out = args["output_dir"]
        formats = set(args["formats"])
        if out and "json" in formats:
            paths["json"] = "%s/drift-report.json" % out
            drift_output.write_atomic(paths["json"], drift_output.render_json(report))
        if out and "markdown" in formats:
            paths["markdown"] = "%s/drift-report.md" % out
            drift_output.write_atomic(paths["markdown"],
                                      drift_output.render_markdown(report, args["max_markdown_findings"]))
        prom = args["prometheus_path"] or ("%s/gpufleet_drift.prom" % out if out else None)
        if prom and "prometheus" in formats:
            paths["prometheus"] = prom
            drift_output.write_atomic(prom, drift_output.render_prometheus(report, started))
        return paths
